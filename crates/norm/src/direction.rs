//! Which way a normalizer maps values: shared by the normalizers and the
//! kernels that carry out either direction.

/// Which way a normalizer maps values (the reference's `un_norm` flag).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// `clamp((x - mean) / std)`; the reward normalizer divides only: `clamp(x / std)`.
    Normalize,
    /// `clamp(x) * std + mean` (clamp first, as the reference does); the
    /// reward normalizer multiplies only: `clamp(x) * std`.
    UnNormalize,
}

impl Direction {
    /// The reference's name of the operation: `normalize` or `un_norm`.
    pub fn op_name(self) -> &'static str {
        match self {
            Direction::Normalize => "normalize",
            Direction::UnNormalize => "un_norm",
        }
    }
}

/// The reference's name of the operation, for people: `normalize` or `un_norm`.
///
/// ```
/// assert_eq!(pmstate_norm::Direction::UnNormalize.to_string(), "un_norm");
/// ```
impl std::fmt::Display for Direction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.op_name())
    }
}
