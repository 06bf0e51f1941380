//! `--width` pins: widths a caller fixes where the checkpoint leaves them
//! open (a policy whose first layer reads a sum of observations), checked
//! against what the checkpoint does fix.

use std::collections::BTreeMap;

use crate::Policy;

/// A pin that cannot hold: the key and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--width {key}: {problem}")]
pub struct PinError {
    /// The observation key pinned.
    pub key: String,
    /// What the checkpoint says against it.
    pub problem: PinProblem,
}

/// Why a `--width` pin cannot hold for the checkpoint (in [`PinError`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PinProblem {
    /// The key is not an input of the model.
    #[error("not an input of this model (its inputs: {})", inputs.join(", "))]
    NotAnInput {
        /// The model's inputs.
        inputs: Vec<String>,
    },
    /// The model takes no pins (a MaskedMimic model: its open widths are
    /// sequences its reshapes check; a GPC prior: its widths are the
    /// checkpoint's), and the server does not pin them.
    #[error("--width does not apply to a {model} (the server takes its inputs' widths from the checkpoint and its reshapes)")]
    NotPinnable {
        /// The model class.
        model: &'static str,
    },
    /// The checkpoint fixes another width for the key.
    #[error("{pinned}, but the checkpoint fixes {fixed}")]
    Contradicts {
        /// The width pinned.
        pinned: usize,
        /// The width the checkpoint fixes.
        fixed: usize,
    },
    /// Every key of a width sum is known and they do not add up.
    #[error(
        "{module} reads {} = {sum} columns, but its checkpoint weights take {total}",
        parts.iter().map(usize::to_string).collect::<Vec<_>>().join(" + ")
    )]
    SumMismatch {
        /// Config path of the module reading the keys.
        module: String,
        /// Each key's width, in the module's order.
        parts: Vec<usize>,
        /// Their sum.
        sum: usize,
        /// The width its weights take.
        total: usize,
    },
    /// The pins take so many columns that an open key gets none.
    #[error("{module} reads {total} columns in all; the pins already take {fixed} ({})", parts_text(parts))]
    NoColumnLeft {
        /// Config path of the module reading the keys.
        module: String,
        /// The width its weights take.
        total: usize,
        /// Columns the known widths take.
        fixed: usize,
        /// Each key's width where known, in the module's order.
        parts: Vec<Option<usize>>,
    },
    /// The columns left over do not divide among the open key's copies.
    #[error("{module} needs {total} columns in all; the pins leave no width for it")]
    NoWidth {
        /// Config path of the module reading the keys.
        module: String,
        /// The width its weights take.
        total: usize,
    },
}

/// `358 + ? + 69`: known widths and `?` for open ones.
fn parts_text(parts: &[Option<usize>]) -> String {
    parts.iter().map(|p| p.map_or_else(|| "?".to_owned(), |w| w.to_string())).collect::<Vec<_>>().join(" + ")
}

/// Per-key widths: the checkpoint's, then the pins (checked against it),
/// then keys that the pins leave as the single unknown of a width sum,
/// then the resolved configs' widths for the rest, where they fit the sums
/// ([`pmstate_policy::shapes::Widths::resolve_with`]).
pub(crate) fn resolve_widths(policy: &Policy, pins: &[(String, usize)]) -> Result<BTreeMap<String, usize>, PinError> {
    let keys = policy.in_keys();
    let mut w: BTreeMap<String, usize> =
        policy.widths().known.iter().filter(|(k, _)| keys.contains(k)).map(|(k, &v)| (k.clone(), v)).collect();
    for (k, v) in pins {
        if !keys.contains(k) {
            return Err(PinError { key: k.clone(), problem: PinProblem::NotAnInput { inputs: keys.clone() } });
        }
        match w.get(k) {
            Some(&known) if known != *v => {
                return Err(PinError { key: k.clone(), problem: PinProblem::Contradicts { pinned: *v, fixed: known } })
            }
            _ => {
                w.insert(k.clone(), *v);
            }
        }
    }
    loop {
        let mut progress = false;
        for g in &policy.widths().groups {
            let open: Vec<&String> = g.keys.iter().filter(|k| !w.contains_key(*k)).collect();
            let fixed: usize = g.keys.iter().filter_map(|k| w.get(k)).sum();
            let parts = || g.keys.iter().map(|k| w.get(k).copied()).collect::<Vec<_>>();
            if open.is_empty() {
                if fixed != g.total {
                    return Err(PinError {
                        key: g
                            .keys
                            .iter()
                            .find(|k| pins.iter().any(|(p, _)| p == *k))
                            .or(g.keys.first())
                            .map_or_else(|| g.path.clone(), String::clone),
                        problem: PinProblem::SumMismatch {
                            module: g.path.clone(),
                            parts: parts().into_iter().flatten().collect(),
                            sum: fixed,
                            total: g.total,
                        },
                    });
                }
            } else if fixed.saturating_add(open.len()) > g.total {
                // every open key needs at least one column
                return Err(PinError {
                    key: g.keys.iter().find(|k| pins.iter().any(|(p, _)| p == *k)).unwrap_or(open[0]).clone(),
                    problem: PinProblem::NoColumnLeft { module: g.path.clone(), total: g.total, fixed, parts: parts() },
                });
            } else if open.iter().all(|k| *k == open[0]) {
                let n = open.len();
                if fixed >= g.total || !(g.total - fixed).is_multiple_of(n) {
                    return Err(PinError {
                        key: open[0].clone(),
                        problem: PinProblem::NoWidth { module: g.path.clone(), total: g.total },
                    });
                }
                w.insert(open[0].clone(), (g.total - fixed) / n);
                progress = true;
            }
        }
        if !progress {
            break;
        }
    }
    // what checkpoint and pins leave open, the resolved configs' observation components fill
    for (k, r) in policy.widths().resolve_with(&keys, &w) {
        if let Ok((v, _)) = r {
            w.entry(k).or_insert(v);
        }
    }
    Ok(w)
}
