//! Temperature and top-p (nucleus) sampling as ProtoMotions'
//! `sampling_log_probs` + `torch.multinomial` (`agents/common/autoregressive.py`),
//! without any `V x V` matrix: one (partial) sort and one cumulative sum per row.
//!
//! `_top_p_keep_mask`: sort the probabilities descending, cumulative sum,
//! `cutoff = cumsum > p`, shifted right by one (the first token is always
//! kept). torch's CPU `cumsum` of float32 accumulates in float64 and rounds
//! each partial sum to float32; the comparison with the Python float `p`
//! is done in float32 (`p` rounded to f32). Both are reproduced here, so on
//! the same probabilities the mask is torch's bit for bit. Ties between
//! equal probabilities keep the lower index first (a stable sort); torch's
//! order among exact ties is its sort's, which only matters when the tie
//! straddles the cutoff.
//!
//! Because the cumulative sum is non-decreasing, the kept tokens are a
//! prefix of the sorted order. Drawing `u` uniform in `[0, 1)` and taking
//! the first sorted position whose float64 cumulative sum exceeds
//! `u * total_kept` samples exactly the renormalized filtered distribution
//! `probs * keep / sum(probs * keep)` that torch's `multinomial` draws from
//! (up to the rounding of `u`, 2^-53). torch's draws come from its own
//! generator, so the tokens cannot match draw for draw: the tests check
//! the distribution instead.

/// The kept prefix of `probs` in descending order (ties by index: a
/// stable sort's order) and its float64 cumulative sums (one per kept
/// position).
///
/// Sorting all of a 59,049-token vocabulary by an indirect comparison for
/// every draw took a quarter of generating with the published sizes. Here
/// each position is one `u64` key that orders as (probability descending,
/// index ascending): [`descending_key`] of the probability above the index.
/// The first [`FIRST_BLOCK`] keys are selected (`select_nth_unstable`,
/// linear) and sorted; only if the cumulative sum has not passed `p` by
/// then (a flat distribution) is the rest sorted too. One strict total
/// order, so exactly the full stable sort's prefix (tested).
fn kept_prefix(probs: &[f32], p: f64) -> (Vec<usize>, Vec<f64>) {
    let p32 = p as f32;
    let n = probs.len();
    let mut keys: Vec<u64> =
        probs.iter().enumerate().map(|(i, &v)| (u64::from(descending_key(v)) << 32) | i as u64).collect();
    let mut order = Vec::new();
    let mut cum = Vec::new();
    let mut acc = 0f64;
    let mut done = 0usize;
    while done < n {
        let end = if done == 0 { FIRST_BLOCK.min(n) } else { n };
        if end < n {
            keys.select_nth_unstable(end - 1);
        }
        keys[done..end].sort_unstable();
        for (j, &key) in keys.iter().enumerate().take(end).skip(done) {
            // cutoff[j] is the unshifted cutoff of j - 1
            if j > 0 && (acc as f32) > p32 {
                return (order, cum);
            }
            let i = (key & u64::from(u32::MAX)) as usize;
            acc += probs[i] as f64;
            cum.push(acc);
            order.push(i);
        }
        done = end;
    }
    (order, cum)
}

/// Positions sorted first in [`kept_prefix`].
const FIRST_BLOCK: usize = 256;

/// `v`'s place in `f32::total_cmp`'s order, reversed, as an unsigned key:
/// a larger probability gets a smaller key.
fn descending_key(v: f32) -> u32 {
    let bits = v.to_bits() as i32;
    // total_cmp's own transform: negative values' magnitude bits flipped
    let total = bits ^ ((((bits >> 31) as u32) >> 1) as i32);
    !((total as u32) ^ 0x8000_0000)
}

/// `_top_p_keep_mask(probs, p)` of one row: `true` where the token is kept.
pub fn keep_mask(probs: &[f32], p: f64) -> Vec<bool> {
    let (kept, _) = kept_prefix(probs, p);
    let mut mask = vec![false; probs.len()];
    for &i in &kept {
        mask[i] = true;
    }
    mask
}

/// One draw from the top-p filtered distribution of `probs` (a softmax
/// row, at most 2^32 entries: a vocabulary's), given `u` uniform in `[0, 1)`.
pub fn sample(probs: &[f32], p: f64, u: f64) -> usize {
    let (kept, cum) = kept_prefix(probs, p);
    let total = cum.last().copied().unwrap_or(0.0);
    let target = u * total;
    let j = cum.partition_point(|&c| c <= target).min(kept.len().saturating_sub(1));
    kept.get(j).copied().unwrap_or(0)
}

/// The probabilities [`sample`] draws with, in float64: `probs * keep`
/// renormalized (what `sampling_log_probs(...).exp()` computes, without its `1e-12`).
pub fn filtered_probs(probs: &[f32], p: f64) -> Vec<f64> {
    let mask = keep_mask(probs, p);
    let total: f64 = probs.iter().zip(&mask).filter(|(_, &k)| k).map(|(&x, _)| x as f64).sum();
    probs.iter().zip(&mask).map(|(&x, &k)| if k { x as f64 / total } else { 0.0 }).collect()
}

/// The draw of generation step `step` of batch row `row` under `seed`:
/// the first value of the [`Uniform`] stream seeded with
/// `seed ^ mix((row << 32) | step)` (`mix`: SplitMix64's finalizer). A
/// row's tokens depend on its seed, its index and its own logits only, not
/// on the other rows of the batch.
pub fn draw(seed: u64, row: u64, step: u64) -> f64 {
    Uniform::new(seed ^ mix((row << 32) | (step & 0xffff_ffff))).next_f64()
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Uniform draws in `[0, 1)` from `seed` (SplitMix64, 53 bits).
#[derive(Debug, Clone)]
pub struct Uniform {
    state: u64,
}

impl Uniform {
    /// The stream of `seed`.
    pub fn new(seed: u64) -> Self {
        Uniform { state: seed }
    }

    /// The next draw.
    pub fn next_f64(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_token_always_kept_and_cutoff_shifted_by_one() {
        // 0.5 alone passes 0.4: it is kept (the first always is), the rest cut
        assert_eq!(keep_mask(&[0.2, 0.5, 0.3], 0.4), vec![false, true, false]);
        // 0.3 is kept because the sum before it (0.5) does not pass 0.6,
        // though the sum with it does: the cutoff is shifted by one
        assert_eq!(keep_mask(&[0.2, 0.5, 0.3], 0.6), vec![false, true, true]);
        assert_eq!(keep_mask(&[0.2, 0.5, 0.3], 0.85), vec![true, true, true]);
        assert_eq!(keep_mask(&[0.2, 0.5, 0.3], 0.0), vec![false, true, false]);
        assert_eq!(keep_mask(&[0.9, 0.1], 0.5), vec![true, false]);
    }

    /// The kept prefix and its sums from the whole stable sort, as written
    /// before blocks: what [`kept_prefix`] must give.
    fn kept_by_full_sort(probs: &[f32], p: f64) -> (Vec<usize>, Vec<f64>) {
        let mut order: Vec<usize> = (0..probs.len()).collect();
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
        let (mut cum, mut acc, mut kept) = (Vec::new(), 0f64, order.len());
        for (j, &i) in order.iter().enumerate() {
            if j > 0 && kept == order.len() && (acc as f32) > p as f32 {
                kept = j;
            }
            acc += probs[i] as f64;
            cum.push(acc);
        }
        order.truncate(kept);
        cum.truncate(kept);
        (order, cum)
    }

    #[test]
    fn the_blocked_prefix_is_the_full_stable_sorts() {
        let mut u = Uniform::new(7);
        for (n, peak) in [(1usize, 1.0f64), (5, 1.0), (300, 1.0), (300, 40.0), (5000, 0.0), (5000, 12.0), (59049, 30.0)]
        {
            // logits from flat (peak 0) to peaked, a few exact ties, softmax
            // in f32 (flat ones underflow to +0 and -0 too: both orders)
            let logits: Vec<f64> = (0..n).map(|i| if i % 97 == 5 { 0.25 } else { u.next_f64() * peak }).collect();
            let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
            let total: f64 = e.iter().sum();
            let mut probs: Vec<f32> = e.iter().map(|v| (v / total) as f32).collect();
            if n > 2 {
                probs[1] = 0.0;
                probs[2] = -0.0;
            }
            for p in [0.0, 0.3, 0.9, 0.999, 1.0] {
                assert_eq!(kept_prefix(&probs, p), kept_by_full_sort(&probs, p), "{n} tokens, peak {peak}, p {p}");
            }
        }
    }

    #[test]
    fn sample_stays_in_the_kept_set() {
        let probs = [0.05f32, 0.6, 0.3, 0.05];
        let mask = keep_mask(&probs, 0.8);
        let mut u = Uniform::new(3);
        for _ in 0..1000 {
            let s = sample(&probs, 0.8, u.next_f64());
            assert!(mask[s], "{s}");
        }
        assert_eq!(sample(&probs, 0.8, 0.0), 1);
        assert_eq!(sample(&probs, 0.8, 0.999_999), 2);
    }
}
