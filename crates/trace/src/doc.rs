//! The pm-trace v1 JSON document as serde structs: the reader parses into
//! them and the writer serializes from them, so the two cannot drift apart.
//! The format is ours, so unknown fields are errors (`deny_unknown_fields`);
//! a later version may add fields under a new `version`.

use std::borrow::Cow;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::model::{ModuleClass, OpKind};

/// Just enough of a document to check what it claims to be before parsing
/// the rest strictly (a version-2 document may have fields v1 does not know).
#[derive(Deserialize)]
pub(crate) struct Probe {
    pub format: Option<String>,
    pub version: Option<u64>,
}

/// A whole document; `S` is [`StepDoc`] when writing and a raw JSON value
/// when reading (each step is then parsed on its own, so an error names it).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Document<S> {
    pub format: String,
    pub version: u64,
    #[serde(default)]
    pub description: String,
    pub reference: ReferenceDoc,
    pub module: ModuleDoc,
    pub world_size: u64,
    pub steps: Vec<S>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReferenceDoc {
    pub implementation: String,
    pub source: String,
    pub torch: String,
    pub device: String,
    #[serde(default)]
    pub dist_backend: Option<String>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ModuleDoc {
    #[serde(with = "class_by_name")]
    pub class: ModuleClass,
    #[serde(default)]
    pub shape: Option<Vec<u64>>,
    pub epsilon: f64,
    #[serde(default)]
    pub clamp_value: Option<f64>,
    #[serde(default)]
    pub ema_decay: Option<f64>,
    #[serde(default)]
    pub gamma: Option<f64>,
}

/// An op by its name in [`OpKind`]'s table.
impl Serialize for OpKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for OpKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        by_name(d, OpKind::from_name, &OpKind::NAMES)
    }
}

/// A module class by its name in [`ModuleClass`]'s table (`ModuleClass`
/// is public: its serde form stays private to the format).
mod class_by_name {
    use serde::{Deserializer, Serializer};

    use crate::model::ModuleClass;

    pub(crate) fn serialize<S: Serializer>(c: &ModuleClass, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(c.name())
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<ModuleClass, D::Error> {
        crate::doc::by_name(d, ModuleClass::from_name, &ModuleClass::NAMES)
    }
}

/// One of the names of a table, or serde's "unknown variant" error listing them.
fn by_name<'de, D: Deserializer<'de>, T>(
    d: D,
    from_name: fn(&str) -> Option<T>,
    names: &'static [&'static str],
) -> Result<T, D::Error> {
    let name = Cow::<str>::deserialize(d)?;
    from_name(&name).ok_or_else(|| serde::de::Error::unknown_variant(&name, names))
}

/// A tensor field: one name, or one name per rank.
#[derive(Serialize, Deserialize, Clone)]
#[serde(untagged)]
pub(crate) enum Names {
    One(String),
    Many(Vec<String>),
}

/// `{"mean": name, "var": name, "count": name}`.
#[derive(Serialize, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct StateDoc {
    pub mean: String,
    pub var: String,
    pub count: String,
}

/// One step: every field any op uses (the format's table); which are
/// required for which op is checked when the step is read.
#[derive(Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct StepDoc {
    pub op: Option<OpKind>,
    // Inputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x: Option<Names>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward: Option<Names>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminated: Option<Names>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub un_norm: Option<bool>,
    /// Present-and-null (Welford) differs from absent (an error).
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub ema_decay: Option<Option<f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub means: Option<Names>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vars: Option<Names>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counts: Option<Names>,
    // Results.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discounted_reward: Option<Names>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_mean: Option<Names>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_var: Option<Names>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_count: Option<Names>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub combined_mean: Option<Names>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub combined_var: Option<Names>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub combined_count: Option<Names>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out: Option<Names>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub std: Option<Names>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean: Option<Names>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub var: Option<Names>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<Names>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<StateDoc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A field that may be null but must be present: `Some(None)` for null.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<f64>>, D::Error> {
    Option::<f64>::deserialize(d).map(Some)
}
