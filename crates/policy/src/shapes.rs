//! Observation widths: what the checkpoint determines about each in_key.
//!
//! No config or checkpoint stores per-key widths (LazyLinear and lazy
//! normalizers take them from the first batch). What is known is each leaf
//! module's input width (its normalizer's or first Linear's), hence the sum
//! of its in_keys' widths; keys solve out where a module reads a single
//! unknown key (smpl tracker: only the sum 358 + 576 + 69 = 1003 is known).

use std::collections::BTreeMap;

use crate::module_ops::ModuleOp;
use crate::network::{Leaf, Network};

/// A module's input constraint: these keys' widths sum to `total`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WidthGroup {
    /// Config path of the module.
    pub path: String,
    /// Its in_keys (with repeats).
    pub keys: Vec<String>,
    /// The concatenated width it needs.
    pub total: usize,
}

/// Largest concatenated width tried when module operations hide it.
const SEARCH_LIMIT: usize = 1 << 16;
/// Batch sizes the shape simulation runs with (two, so that a reshape that
/// only works for one batch size does not pass).
const PROBE_BATCHES: [usize; 2] = [3, 5];

/// Widths known per key, and the group constraints.
#[derive(Debug, Clone, Default)]
pub struct Widths {
    /// Solved widths (observations and intermediate keys).
    pub known: BTreeMap<String, usize>,
    /// One per leaf whose input width is determined.
    pub groups: Vec<WidthGroup>,
}

impl Widths {
    /// Analyses the networks in forward order.
    pub fn analyse(networks: &[&Network]) -> Widths {
        let leaves: Vec<&Leaf> = networks.iter().flat_map(|n| n.leaves()).collect();
        let mut w = Widths::default();
        // input width and output width of each leaf, when determined
        let io: Vec<(Option<usize>, Option<OutWidth>)> = leaves.iter().map(|l| leaf_io(l)).collect();
        for (l, (inp, _)) in leaves.iter().zip(&io) {
            if let Some(total) = inp {
                w.groups.push(WidthGroup { path: l.path.clone(), keys: l.in_keys.clone(), total: *total });
            }
        }
        // propagate until nothing changes
        loop {
            let mut progress = false;
            for (l, (inp, out)) in leaves.iter().zip(&io) {
                let known_in: Option<usize> = l.in_keys.iter().map(|k| w.known.get(k).copied()).sum();
                let total = inp.or(known_in);
                if let (Some(total), None) = (inp, known_in) {
                    // exactly one unknown key (possibly repeated) solves
                    let unknown: Vec<&String> = l.in_keys.iter().filter(|k| !w.known.contains_key(*k)).collect();
                    if unknown.iter().all(|k| *k == unknown[0]) {
                        let rest: usize = l.in_keys.iter().filter_map(|k| w.known.get(k)).sum();
                        let n = unknown.len();
                        if *total >= rest && (*total - rest).is_multiple_of(n) && *total > rest {
                            w.known.insert(unknown[0].clone(), (*total - rest) / n);
                            progress = true;
                        }
                    }
                }
                if !w.known.contains_key(&l.out_key) {
                    let o = match out {
                        Some(OutWidth::Fixed(o)) => Some(*o),
                        Some(OutWidth::SameAsInput) => total,
                        None => total.and_then(|c| simulate(l, c)),
                    };
                    if let Some(o) = o {
                        w.known.insert(l.out_key.clone(), o);
                        progress = true;
                    }
                }
            }
            if !progress {
                break;
            }
        }
        w
    }
}

#[derive(Debug, Clone, Copy)]
enum OutWidth {
    Fixed(usize),
    SameAsInput,
}

/// The width at the first Forward (normalizer's or first Linear's), if any.
fn forward_width(l: &Leaf) -> Option<usize> {
    if let Some(n) = &l.norm {
        return n.rms.shape().map(|s| s.iter().product());
    }
    l.mlp.as_ref().map(|m| m.in_features())
}

/// The concatenated input width and the output width of a leaf, where the
/// checkpoint determines them.
fn leaf_io(l: &Leaf) -> (Option<usize>, Option<OutWidth>) {
    let fw = forward_width(l);
    let trivial = l.ops.iter().all(|o| *o == ModuleOp::Forward || *o == ModuleOp::SphereProjection);
    if trivial {
        let out = match (&l.mlp, l.ops.contains(&ModuleOp::Forward)) {
            (Some(m), true) => Some(OutWidth::Fixed(m.out.out_features())),
            _ => Some(OutWidth::SameAsInput),
        };
        let inp = if l.ops.contains(&ModuleOp::Forward) { fw } else { None };
        return (inp, out);
    }
    let Some(_) = fw else { return (None, None) };
    // search the concatenated width that makes every Forward see its width
    let mut found = None;
    for c in 1..=SEARCH_LIMIT {
        if simulate(l, c).is_some() {
            if found.is_some() {
                return (None, None); // ambiguous
            }
            found = Some(c);
        }
    }
    match found {
        Some(c) => (Some(c), simulate(l, c).map(OutWidth::Fixed)),
        None => (None, None),
    }
}

/// Runs the leaf's operations on shapes `[B, c]`; its output width (last
/// dim of a 2-D result), or `None` where they fail: a Forward seeing another
/// width than its normalizer or first Linear, an operation that does not
/// apply, a result that is not `[batch, width]` or whose width depends on
/// the batch size. Callers search widths with it, so why does not matter.
pub(crate) fn simulate(l: &Leaf, c: usize) -> Option<usize> {
    let fw = forward_width(l);
    let mut out = None;
    for b in PROBE_BATCHES {
        let mut shape = vec![b, c];
        for op in &l.ops {
            if *op == ModuleOp::Forward {
                let last = *shape.last()?;
                if fw.is_some_and(|w| w != last) {
                    return None;
                }
                if let Some(m) = &l.mlp {
                    let n = shape.len();
                    shape[n - 1] = m.out.out_features();
                }
            } else {
                shape = op.out_shape(&shape, b).ok()?;
            }
        }
        if shape.len() != 2 || shape[0] != b || out.is_some_and(|o| o != shape[1]) {
            return None;
        }
        out = Some(shape[1]);
    }
    out
}
