//! Observation widths: what the checkpoint determines about each in_key.
//!
//! No config or checkpoint stores per-key widths (LazyLinear and lazy
//! normalizers take them from the first batch). What is known is each leaf
//! module's input width (its normalizer's or first Linear's), hence the sum
//! of its in_keys' widths; keys solve out where a module reads a single
//! unknown key (smpl tracker: only the sum 358 + 576 + 69 = 1003 is known).
//! Where the checkpoint leaves a key open, [`Widths::resolve`] takes the
//! width the resolved configs give its observation component
//! ([`crate::obs_widths`]), checked against every sum the checkpoint fixes.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use crate::module_ops::ModuleOp;
use crate::network::{Leaf, Network};
use crate::obs_widths::{ComponentWidth, Unsized, COMPONENTS};

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
    /// The configs' observation components with their widths (empty when
    /// the policy was built without a configs file), for the keys the
    /// checkpoint leaves open: see [`Widths::resolve`].
    pub components: Vec<ComponentWidth>,
}

/// Where a key's width comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "from", rename_all = "snake_case")]
pub enum WidthSource {
    /// The checkpoint alone: a first layer or normalizer reads the key
    /// alone, or with keys of known widths.
    Checkpoint,
    /// Given by the caller ([`Widths::resolve_with`]).
    Given,
    /// A sum the checkpoint fixes, less the widths the configs give for
    /// the module's other keys.
    CheckpointSum {
        /// The module whose sum it is.
        module: String,
    },
    /// The configs' observation component of that name, sized from the
    /// robot and environment (only where the checkpoint leaves it open,
    /// and only when it fits every sum the checkpoint fixes).
    Config {
        /// The component (`env.observation_components.<component>`).
        component: String,
        /// Its compute function.
        function: String,
    },
}

/// Why a key's width stays open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenWidth {
    /// The checkpoint fixes only a sum with other keys, and the configs
    /// have no observation component of that name.
    NoComponent,
    /// The checkpoint fixes only a sum with other keys, and the configs
    /// declare no observation components at all: a release before v3.1
    /// (v3.0's Mimic env computes its observations in code).
    NoComponents,
    /// No network reads the key (the config lists it), and the configs
    /// have no observation component of that name.
    Unread,
    /// The configs' component could not be sized.
    Unsized(Unsized),
    /// The configs' width does not fit a sum the checkpoint fixes.
    Contradicts {
        /// The width the configs give.
        config: usize,
    },
}

impl fmt::Display for OpenWidth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenWidth::NoComponent => write!(
                f,
                "the checkpoint fixes only a sum with other keys, and {COMPONENTS} has no component of this name"
            ),
            OpenWidth::NoComponents => write!(
                f,
                "the checkpoint fixes only a sum with other keys, and the configs declare no {COMPONENTS} \
                 (v3.0 and earlier compute their observations in code)"
            ),
            OpenWidth::Unread => {
                write!(f, "{COMPONENTS} has no component of this name")
            }
            OpenWidth::Unsized(u) => write!(f, "the checkpoint fixes only a sum with other keys, and {u}"),
            OpenWidth::Contradicts { config } => {
                write!(f, "the configs' width {config} does not fit the sums the checkpoint fixes")
            }
        }
    }
}

/// Serializes with Display (the reason in words).
impl Serialize for OpenWidth {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A key's width and its source, or why it is open.
pub type Resolved = Result<(usize, WidthSource), OpenWidth>;

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

impl Widths {
    /// The width of each of `keys`: the checkpoint's where it fixes one;
    /// else the configs' observation component's, taken key by key in the
    /// configs' order where it fits every sum the checkpoint fixes (given
    /// the widths taken before), each taken width solving the sums it
    /// leaves with one open key.
    pub fn resolve(&self, keys: &[String]) -> BTreeMap<String, Resolved> {
        self.resolve_with(keys, &BTreeMap::new())
    }

    /// [`Widths::resolve`] with widths `given` besides the checkpoint's
    /// (a server's `--width` pins, already checked against the sums): the
    /// configs fill only what both leave open.
    pub fn resolve_with(&self, keys: &[String], given: &BTreeMap<String, usize>) -> BTreeMap<String, Resolved> {
        let mut w = self.known.clone();
        w.extend(given.iter().map(|(k, &v)| (k.clone(), v)));
        let mut src: BTreeMap<String, WidthSource> = BTreeMap::new();
        let mut rejected: BTreeMap<&str, usize> = BTreeMap::new();
        for c in &self.components {
            let Ok(width) = c.width else { continue };
            if !keys.contains(&c.component) || self.known.contains_key(&c.component) || given.contains_key(&c.component)
            {
                continue;
            }
            if let Some(&solved) = w.get(&c.component) {
                // solved from a sum before: the configs agree, or the sum wins
                if solved == width {
                    src.insert(
                        c.component.clone(),
                        WidthSource::Config { component: c.component.clone(), function: c.function.clone() },
                    );
                }
                continue;
            }
            let mut trial = w.clone();
            trial.insert(c.component.clone(), width);
            match solve_groups(&self.groups, &mut trial) {
                Some(solved) => {
                    w = trial;
                    src.insert(
                        c.component.clone(),
                        WidthSource::Config { component: c.component.clone(), function: c.function.clone() },
                    );
                    for (k, module) in solved {
                        src.insert(k, WidthSource::CheckpointSum { module });
                    }
                }
                None => {
                    rejected.insert(&c.component, width);
                }
            }
        }
        keys.iter()
            .map(|k| {
                let r = match (self.known.get(k), w.get(k), src.get(k)) {
                    (Some(&v), _, _) => Ok((v, WidthSource::Checkpoint)),
                    (None, Some(&v), None) if given.contains_key(k) => Ok((v, WidthSource::Given)),
                    (None, Some(&v), Some(s)) => Ok((v, s.clone())),
                    _ => Err(match (rejected.get(k.as_str()), self.components.iter().find(|c| &c.component == k)) {
                        (Some(&config), _) => OpenWidth::Contradicts { config },
                        (None, Some(ComponentWidth { width: Err(u), .. })) => OpenWidth::Unsized(u.clone()),
                        _ if self.groups.iter().any(|g| g.keys.contains(k)) && self.components.is_empty() => {
                            OpenWidth::NoComponents
                        }
                        _ if self.groups.iter().any(|g| g.keys.contains(k)) => OpenWidth::NoComponent,
                        _ => OpenWidth::Unread,
                    }),
                };
                (k.clone(), r)
            })
            .collect()
    }
}

/// Solves `groups` over the widths in `w`: a sum with one open key (maybe
/// repeated) gives that key; the keys solved with their module, or `None`
/// where a sum cannot hold (too large, or an open key without a column).
fn solve_groups(groups: &[WidthGroup], w: &mut BTreeMap<String, usize>) -> Option<Vec<(String, String)>> {
    let mut solved = Vec::new();
    loop {
        let mut progress = false;
        for g in groups {
            let open: Vec<&String> = g.keys.iter().filter(|k| !w.contains_key(*k)).collect();
            let fixed = g.keys.iter().filter_map(|k| w.get(k)).try_fold(0usize, |s, &v| s.checked_add(v))?;
            if open.is_empty() {
                if fixed != g.total {
                    return None;
                }
            } else if fixed.checked_add(open.len())? > g.total {
                return None;
            } else if open.iter().all(|k| *k == open[0]) {
                let rest = g.total - fixed;
                if !rest.is_multiple_of(open.len()) {
                    return None;
                }
                let k = open[0].clone();
                w.insert(k.clone(), rest / open.len());
                solved.push((k, g.path.clone()));
                progress = true;
            }
        }
        if !progress {
            return Some(solved);
        }
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
