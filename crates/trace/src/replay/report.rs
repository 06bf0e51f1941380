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
    /// The first failing field, else the one closest to its limit: in free
    /// mode the largest share of its bound used, in pinned mode (every
    /// result bit for bit) the largest ulp distance.
    pub fn worst(&self) -> Option<&FieldReport> {
        self.fields.iter().find(|f| !f.pass).or_else(|| match self.mode {
            Mode::Free => self
                .fields
                .iter()
                .max_by(|a, b| a.bound_used.total_cmp(&b.bound_used).then(a.max_ulps.cmp(&b.max_ulps))),
            Mode::Pinned => self.fields.iter().max_by_key(|f| f.max_ulps),
        })
    }

    /// Whether every field matched bit for bit (then no field is "worst").
    pub fn all_exact(&self) -> bool {
        self.fields.iter().all(|f| f.pass && f.max_ulps == 0 && f.max_abs == 0.0)
    }
}

/// `12 steps, world size 2, 48 fields; worst: step 3 normalize out ...`:
/// the counts, then the field [`Report::worst`] picks, or `every field
/// exact` when none differs by a bit (naming one would mislead).
impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} steps, world size {}, {} fields; ", self.steps, self.world_size, self.fields.len())?;
        match self.worst() {
            None => f.write_str("no fields"),
            Some(_) if self.all_exact() => f.write_str("every field exact"),
            Some(w) => write!(f, "worst: {w}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(name: &str, max_ulps: u64, max_abs: f64, tolerance: f64) -> FieldReport {
        let bound_used = if tolerance > 0.0 { max_abs / tolerance } else { 0.0 };
        FieldReport {
            step: 0,
            op: "normalize",
            field: name.into(),
            max_abs,
            max_ulps,
            first_mismatch: None,
            tolerance,
            bound_used,
            pass: true,
            note: None,
        }
    }

    fn report(mode: Mode, fields: Vec<FieldReport>) -> Report {
        Report { mode, world_size: 1, steps: 1, pass: true, fields }
    }

    /// Bit-exact everywhere: no field is named as the worst.
    #[test]
    fn an_exact_replay_says_so_instead_of_naming_a_field() {
        let r = report(Mode::Pinned, vec![field("out", 0, 0.0, 0.0), field("state.mean", 0, 0.0, 0.0)]);
        assert!(r.all_exact());
        assert_eq!(r.to_string(), "1 steps, world size 1, 2 fields; every field exact");
        let r = report(Mode::Pinned, vec![field("out", 0, 0.0, 0.0), field("state.mean", 1, 1e-9, 0.0)]);
        assert!(!r.all_exact());
        assert!(r.to_string().contains("worst: step 0 normalize state.mean max_ulps 1"), "{r}");
    }

    /// Free mode: the worst field is the one nearest its bound (not the
    /// one with most ulps, a value near zero), printed with that bound.
    #[test]
    fn free_mode_names_the_field_nearest_its_bound_and_prints_the_bound() {
        let near_zero = field("out", 26_575_109_376, 1e-9, 1e-7);
        let nearest = field("state.var", 3, 5e-7, 1e-6);
        let r = report(Mode::Free, vec![near_zero, nearest]);
        let w = r.worst().unwrap();
        assert_eq!(w.field, "state.var");
        let text = r.to_string();
        assert!(
            text.contains("state.var max_ulps 3 max_abs 5.000e-7 using 50.0% of its bound (bound up to 1.000e-6)"),
            "{text}"
        );
    }
}
