//! What a replay is asked for ([`Mode`]) and what it found ([`Report`]):
//! the types the rank runner, the judge and the engine share.

use std::fmt;

use serde::Serialize;

use crate::compare::FieldReport;

/// How batch moments and std are obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Recorded batch moments (per rank) feed every update and the recorded
    /// std every normalize: everything else is elementwise IEEE arithmetic,
    /// so every result must match bit for bit.
    Pinned,
    /// We compute batch moments and std; results must lie within the bounds
    /// of [`tolerance`](crate::tolerance).
    Free,
}

impl Mode {
    /// The mode's name, as `--mode` and the JSON output spell it.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Pinned => "pinned",
            Mode::Free => "free",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The outcome of replaying one trace.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Pinned or free.
    pub mode: Mode,
    /// Number of ranks (W).
    pub world_size: usize,
    /// The steps, in order.
    pub steps: usize,
    /// Whether every compared field matched.
    pub pass: bool,
    /// One report per compared field.
    pub fields: Vec<FieldReport>,
}

impl Report {
    /// The first failing field, else the one with the largest ulp distance.
    pub fn worst(&self) -> Option<&FieldReport> {
        self.fields.iter().find(|f| !f.pass).or_else(|| self.fields.iter().max_by_key(|f| f.max_ulps))
    }
}

/// `12 steps, world size 2, 48 fields; worst: step 3 normalize out ...`:
/// the counts, then the field [`Report::worst`] picks.
impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} steps, world size {}, {} fields; ", self.steps, self.world_size, self.fields.len())?;
        match self.worst() {
            Some(w) => write!(f, "worst: {w}"),
            None => f.write_str("no fields"),
        }
    }
}
