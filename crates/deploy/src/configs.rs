//! Typed reads of a resolved-configs file (`resolved_configs_inference.pt`),
//! every error naming the file and the dotted key.

use std::cell::RefCell;
use std::collections::BTreeSet;

use candle_core::Device;
use pmstate_ckpt::{Checkpoint, Dict, Node};

use crate::error::{ConfigProblem, DeployError, Result};

/// An opened configs file.
pub(crate) struct Configs {
    pub(crate) ckpt: Checkpoint,
    pub(crate) file: String,
}

fn found(n: &Node) -> String {
    n.kind().to_owned()
}

impl Configs {
    pub(crate) fn bad(&self, key: &str, problem: ConfigProblem) -> DeployError {
        DeployError::Config { file: self.file.clone(), key: key.to_owned(), problem }
    }

    pub(crate) fn node(&self, key: &str) -> Result<&Node> {
        self.ckpt.get(key).ok_or_else(|| self.bad(key, ConfigProblem::Missing))
    }

    pub(crate) fn usize(&self, key: &str) -> Result<usize> {
        as_usize(self.node(key)?).ok_or_else(|| self.wrong(key, "a non-negative int"))
    }

    pub(crate) fn f64(&self, key: &str) -> Result<f64> {
        as_f64(self.node(key)?).ok_or_else(|| self.wrong(key, "a number"))
    }

    pub(crate) fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.ckpt.get(key) {
            None | Some(Node::None) => Ok(None),
            Some(n) => as_f64(n).map(Some).ok_or_else(|| self.wrong(key, "a number or None")),
        }
    }

    pub(crate) fn str(&self, key: &str) -> Result<String> {
        self.node(key)?.as_str().map(str::to_owned).ok_or_else(|| self.wrong(key, "a string"))
    }

    pub(crate) fn strings(&self, key: &str) -> Result<Vec<String>> {
        match self.node(key)? {
            Node::List(v) | Node::Tuple(v) => v
                .iter()
                .map(|n| n.as_str().map(str::to_owned).ok_or_else(|| self.wrong(key, "a list of strings")))
                .collect(),
            _ => Err(self.wrong(key, "a list of strings")),
        }
    }

    /// A float32 tensor's values, flattened.
    pub(crate) fn f32_tensor(&self, key: &str) -> Result<Vec<f32>> {
        match self.node(key)? {
            Node::Tensor(_) => {}
            _ => return Err(self.wrong(key, "a tensor")),
        }
        let t = self.ckpt.candle_tensor(key, &Device::Cpu)?;
        let t = t.to_dtype(candle_core::DType::F32)?.flatten_all()?;
        Ok(t.to_vec1::<f32>()?)
    }

    fn wrong(&self, key: &str, expected: &'static str) -> DeployError {
        let f = self.ckpt.get(key).map_or_else(|| "nothing".to_owned(), found);
        self.bad(key, ConfigProblem::WrongType { expected, found: f })
    }
}

pub(crate) fn as_usize(n: &Node) -> Option<usize> {
    match n {
        Node::Int(i) => usize::try_from(*i).ok(),
        Node::Str(s) => s.parse().ok(),
        _ => None,
    }
}

pub(crate) fn as_f64(n: &Node) -> Option<f64> {
    match n {
        Node::Int(i) => Some(*i as f64),
        Node::Float(f) => Some(*f),
        Node::Str(s) => s.parse().ok(),
        _ => None,
    }
}

/// The dict of a node: a plain dict, or a config object's fields.
pub(crate) fn dict_of(n: &Node) -> Option<&Dict> {
    match n {
        Node::Dict(d) => Some(d),
        Node::Object(o) => o.fields(),
        _ => None,
    }
}

/// A component's `static_params`, each read recorded, so that a parameter
/// no implementation reads is refused ([`Params::finish`]) rather than
/// silently ignored.
pub(crate) struct Params<'a> {
    pub(crate) file: &'a str,
    pub(crate) key: String,
    dict: Option<&'a Dict>,
    used: RefCell<BTreeSet<String>>,
    /// v3.1's layout: one `variables` dict holds both the context bindings
    /// (strings, context keys) and the parameters (anything else), so a
    /// string entry is not a parameter.
    inline_bindings: bool,
}

/// Step selection of `select_step_indices`: the first N, or 1-based indices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Steps {
    /// The first N steps.
    First(usize),
    /// These 1-based steps.
    Indices(Vec<usize>),
}

impl Steps {
    /// The 0-based positions selected, checked against `available`.
    pub fn positions(&self, available: usize) -> Option<Vec<usize>> {
        match self {
            Steps::First(n) if *n <= available => Some((0..*n).collect()),
            Steps::Indices(v) if v.iter().all(|&s| s >= 1 && s <= available) => Some(v.iter().map(|s| s - 1).collect()),
            _ => None,
        }
    }

    /// How many steps the context must hold for this selection.
    pub fn needed(&self) -> usize {
        match self {
            Steps::First(n) => *n,
            Steps::Indices(v) => v.iter().copied().max().unwrap_or(0),
        }
    }
}

impl<'a> Params<'a> {
    pub(crate) fn new(file: &'a str, key: String, dict: Option<&'a Dict>) -> Self {
        Params { file, key, dict, used: RefCell::new(BTreeSet::new()), inline_bindings: false }
    }

    /// The parameters of a v3.1 `ObservationComponentConfig`: the
    /// non-string entries of its `variables`.
    pub(crate) fn inline(file: &'a str, key: String, dict: Option<&'a Dict>) -> Self {
        Params { inline_bindings: true, ..Self::new(file, key, dict) }
    }

    fn get(&self, name: &str) -> Option<&'a Node> {
        self.used.borrow_mut().insert(name.to_owned());
        self.dict
            .and_then(|d| d.get(name))
            .filter(|n| !(matches!(n, Node::None) || self.inline_bindings && matches!(n, Node::Str(_))))
    }

    pub(crate) fn bad(&self, name: &str, problem: ConfigProblem) -> DeployError {
        DeployError::Config { file: self.file.to_owned(), key: format!("{}.{name}", self.key), problem }
    }

    pub(crate) fn bool(&self, name: &str, default: bool) -> Result<bool> {
        match self.get(name) {
            None => Ok(default),
            Some(Node::Bool(b)) => Ok(*b),
            Some(Node::Str(s)) if s == "True" || s == "False" => Ok(s == "True"),
            Some(n) => Err(self.bad(name, ConfigProblem::WrongType { expected: "a bool", found: found(n) })),
        }
    }

    /// A bool the reference's signature has no default for.
    pub(crate) fn required_bool(&self, name: &str) -> Result<bool> {
        if self.get(name).is_none() {
            return Err(self.bad(name, ConfigProblem::Missing));
        }
        self.bool(name, false)
    }

    pub(crate) fn steps(&self, name: &str) -> Result<Option<Steps>> {
        let wrong = |n: &Node| {
            self.bad(name, ConfigProblem::WrongType { expected: "an int or a list of ints", found: found(n) })
        };
        // bounded here, so the widths and buffers a selection implies stay small
        let bound = crate::limits::MAX_FUTURE_OFFSET.max(crate::limits::MAX_HISTORY_STEPS);
        let too_far = |value: usize| self.bad(name, ConfigProblem::Bound { value, bound });
        let steps = match self.get(name) {
            None => return Ok(None),
            Some(Node::List(v)) | Some(Node::Tuple(v)) => {
                if v.len() > crate::limits::MAX_FUTURE_STEPS.max(crate::limits::MAX_HISTORY_STEPS) {
                    return Err(too_far(v.len()));
                }
                let s: Option<Vec<usize>> = v.iter().map(as_usize).collect();
                Steps::Indices(s.ok_or_else(|| wrong(&Node::List(v.clone())))?)
            }
            Some(n) => Steps::First(as_usize(n).ok_or_else(|| wrong(n))?),
        };
        match steps.needed() {
            n if n > bound => Err(too_far(n)),
            _ => Ok(Some(steps)),
        }
    }

    /// `w_last` must be true: xyzw quaternions, what every published config uses.
    pub(crate) fn require_w_last(&self) -> Result<()> {
        if self.bool("w_last", true)? {
            Ok(())
        } else {
            Err(self.bad(
                "w_last",
                ConfigProblem::Unsupported { value: "False (wxyz quaternions)".into(), supported: "True (xyzw)" },
            ))
        }
    }

    /// Refuses a parameter nobody read.
    pub(crate) fn finish(&self, known: &[&str]) -> Result<()> {
        let Some(d) = self.dict else { return Ok(()) };
        let used = self.used.borrow();
        for (k, v) in d.entries() {
            let Some(k) = k.as_str() else { continue };
            if self.inline_bindings && matches!(v, Node::Str(_)) {
                continue;
            }
            if !used.contains(k) {
                return Err(self.bad(k, ConfigProblem::UnknownParameter { known: known.join(", ") }));
            }
        }
        Ok(())
    }
}
