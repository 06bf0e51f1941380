//! `FSQTokenization` (`agents/common/discrete_latent.py`): FSQ scalar
//! indices packed into prior tokens, mixed radix, least significant first.
//!
//! Row by row: scalars `[k * n, (k + 1) * n)` form token `k`, with
//! `token = sum_i index_i * levels^i`. Unpacking divides by the same basis
//! from the top digit down, as `prior_tokens_to_fsq_indices` does
//! (`index_i = remainder // levels^i`, `remainder %= levels^i`). All in
//! integers: exact.

/// The packing of `scalars` FSQ indices of `levels` levels into tokens of
/// `per_token` scalars each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tokenization {
    /// `num_fsq_levels`.
    pub levels: usize,
    /// `num_fsq_scalars`.
    pub scalars: usize,
    /// `fsq_scalars_per_prior_token`.
    pub per_token: usize,
    /// `num_prior_tokens = scalars / per_token`.
    pub tokens: usize,
    /// `prior_token_vocab_size = levels ^ per_token`.
    pub vocab: usize,
}

impl Tokenization {
    /// `None` when `per_token` is zero or does not divide `scalars`, or the
    /// vocabulary overflows (the caller names the field).
    pub fn new(levels: usize, scalars: usize, per_token: usize) -> Option<Self> {
        if per_token == 0 || !scalars.is_multiple_of(per_token) {
            return None;
        }
        let vocab = levels.checked_pow(u32::try_from(per_token).ok()?)?;
        // tokens are int64 in torch
        i64::try_from(vocab).ok()?;
        Some(Tokenization { levels, scalars, per_token, tokens: scalars / per_token, vocab })
    }

    /// `prior_tokens_to_fsq_indices` of one row of `tokens` tokens (each in `[0, vocab)`).
    pub fn unpack_row(&self, tokens: &[i64], out: &mut Vec<i64>) {
        let levels = self.levels as i64;
        for &t in tokens {
            let start = out.len();
            out.resize(start + self.per_token, 0);
            let mut remainder = t;
            for i in (0..self.per_token).rev() {
                let basis = levels.pow(i as u32);
                out[start + i] = remainder / basis;
                remainder %= basis;
            }
        }
    }

    /// `fsq_indices_to_prior_tokens` of one row of `scalars` indices.
    pub fn pack_row(&self, indices: &[i64]) -> Vec<i64> {
        let levels = self.levels as i64;
        indices
            .chunks(self.per_token)
            .map(|g| g.iter().enumerate().map(|(i, &x)| x * levels.pow(i as u32)).sum())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_sizes() {
        let t = Tokenization::new(9, 40, 5).unwrap();
        assert_eq!((t.tokens, t.vocab), (8, 59049));
        assert!(Tokenization::new(9, 40, 3).is_none());
        assert!(Tokenization::new(9, 40, 0).is_none());
        assert!(Tokenization::new(9, 40, 40).is_none()); // 9^40 overflows
    }

    #[test]
    fn unpack_inverts_pack_and_digits_are_least_significant_first() {
        let t = Tokenization::new(9, 6, 3).unwrap();
        let idx = vec![1, 2, 3, 8, 0, 4];
        let tokens = t.pack_row(&idx);
        assert_eq!(tokens, vec![1 + 2 * 9 + 3 * 81, 8 + 4 * 81]);
        let mut back = Vec::new();
        t.unpack_row(&tokens, &mut back);
        assert_eq!(back, idx);
        // every token of a small vocabulary round-trips
        for tok in 0..t.vocab as i64 {
            let mut d = Vec::new();
            t.unpack_row(&[tok], &mut d);
            assert!(d.iter().all(|&x| (0..9).contains(&x)));
            assert_eq!(t.pack_row(&d), vec![tok]);
        }
    }
}
