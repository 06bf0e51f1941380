//! Rows of a batch: whose rows are whose, a subset of segments gathered,
//! outputs split back, and forwards run a chunk of rows at a time.

use std::collections::HashMap;

use candle_core::Tensor;

use super::{Batch, Named, Source};

/// Rows `start..start + len` of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowRange {
    /// The first row.
    pub start: usize,
    /// How many.
    pub len: usize,
}

/// The rows of `ranges` of every input, one after another: the inputs
/// themselves (no copy) when the ranges are the whole batch of `rows`.
pub fn rows_of(
    inputs: &HashMap<String, Tensor>,
    ranges: &[RowRange],
    rows: usize,
) -> candle_core::Result<HashMap<String, Tensor>> {
    let whole =
        ranges.first().is_some_and(|r| r.start == 0) && ranges.windows(2).all(|w| w[0].start + w[0].len == w[1].start);
    if whole && ranges.iter().map(|r| r.len).sum::<usize>() == rows {
        return Ok(inputs.clone());
    }
    inputs
        .iter()
        .map(|(k, t)| {
            let parts = ranges.iter().map(|r| t.narrow(0, r.start, r.len)).collect::<candle_core::Result<Vec<_>>>()?;
            Ok((k.clone(), Tensor::cat(&parts, 0)?))
        })
        .collect()
}

/// `t`'s rows of each of `lens` (consecutive, from row 0).
pub fn split_rows(t: &Tensor, lens: &[usize]) -> candle_core::Result<Vec<Tensor>> {
    let mut start = 0;
    lens.iter()
        .map(|&len| {
            let part = t.narrow(0, start, len)?;
            start += len;
            Ok(part)
        })
        .collect()
}

/// Runs `forward` on `chunk_rows` rows of `inputs` at a time and joins each
/// of its outputs along the rows, so that a forward's working memory is
/// bounded by the chunk, not by the batch. Every output of `forward` must
/// have one row per input row, the outputs named in `whole` excepted (one
/// value for the batch, such as `std`: kept from the first chunk). Inputs
/// whose batch sizes differ are passed whole, for the model to name the
/// mismatch.
pub fn by_chunks<E: From<candle_core::Error>>(
    inputs: &HashMap<String, Tensor>,
    chunk_rows: usize,
    whole: &[&str],
    mut forward: impl FnMut(&HashMap<String, Tensor>) -> Result<Named, E>,
) -> Result<Named, E> {
    let mut batch = inputs.values().map(|t| t.dims().first().copied().unwrap_or(0));
    let rows = batch.next().unwrap_or(0);
    if rows <= chunk_rows.max(1) || !batch.all(|b| b == rows) {
        return forward(inputs);
    }
    let mut parts: Vec<(&'static str, Vec<Tensor>)> = Vec::new();
    for start in (0..rows).step_by(chunk_rows.max(1)) {
        let len = chunk_rows.max(1).min(rows - start);
        let chunk = inputs
            .iter()
            .map(|(k, t)| Ok((k.clone(), t.narrow(0, start, len)?)))
            .collect::<Result<HashMap<_, _>, candle_core::Error>>()?;
        let out = forward(&chunk)?;
        if parts.is_empty() {
            parts = out.into_iter().map(|(k, t)| (k, vec![t])).collect();
        } else {
            for ((k, acc), (_, t)) in parts.iter_mut().zip(out) {
                if !whole.contains(k) {
                    acc.push(t);
                }
            }
        }
    }
    parts.into_iter().map(|(k, ts)| Ok((k, Tensor::cat(&ts, 0)?))).collect()
}

/// The outputs of one forward over the segments `idx` of `batch`, each
/// segment's share of them appended to its list in `outs`: per-row outputs
/// split by rows; an output of one value for the batch (`std`) given whole;
/// one whose rows are not the observations' (a `norm_obs` reshaped by
/// module operations) given only to a lone segment. `source_of` names
/// the source of each output, for what a segment wants.
pub fn share(
    batch: &Batch<'_>,
    idx: &[usize],
    rows: usize,
    out: Named,
    outs: &mut [Named],
    source_of: impl Fn(&str) -> Source,
) -> candle_core::Result<()> {
    let lens: Vec<usize> = idx.iter().map(|&i| batch.segments[i].rows).collect();
    for (name, t) in out {
        let wants = |i: usize| batch.segments[i].wanted.wants(name, source_of(name));
        let per_row = t.rank() >= 1 && t.dims()[0] == rows && name != "std";
        if per_row {
            for (part, &i) in split_rows(&t, &lens)?.into_iter().zip(idx) {
                if wants(i) {
                    outs[i].push((name, part));
                }
            }
        } else if name == "std" || idx.len() == 1 {
            for &i in idx {
                if wants(i) {
                    outs[i].push((name, t.clone()));
                }
            }
        }
    }
    Ok(())
}
