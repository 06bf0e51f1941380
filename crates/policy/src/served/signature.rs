//! [`Signature`]: what a model takes and gives, whatever its family.

use serde::Serialize;

/// Which networks an output comes from (and so which inputs it needs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// A policy's actor; for MaskedMimic and a GPC prior, their one forward.
    Actor,
    /// A policy's critic (its `value`): the actor runs too, and the
    /// request sends the critic's inputs as well.
    Critic,
    /// The actor, then actions drawn with the request's seed.
    Sample,
    /// The AMP discriminator and its critic.
    Discriminator,
    /// A deployment pipeline (observations, actor, action function): its
    /// outputs all come from one forward over every input.
    Pipeline,
}

/// One input of the model metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InputSpec {
    /// The observation key.
    pub name: String,
    /// Its width, when the checkpoint (or a pin) fixes it.
    pub width: Option<usize>,
    /// Whether the actor or critic read it.
    pub actor_critic: bool,
    /// Whether the actor reads it: what a request asking for no critic or
    /// discriminator output must send (a robot has no privileged critic
    /// observations). True for every input of the other families.
    pub actor: bool,
    /// Whether the discriminator networks read it.
    pub discriminator: bool,
    /// The shape of one row when the model fixes it whole (a pipeline's
    /// inputs: `[4]`, `[4, 29]`); `None` for a policy's `[rows, width]`.
    pub row_shape: Option<Vec<usize>>,
    /// Whether a request may leave it out (MaskedMimic's `vae_noise`: zero
    /// then; a GPC prior's `prior_tokens`: generated then, when sampling).
    pub optional: bool,
    /// The element type a request sends.
    pub datatype: Datatype,
    /// For an INT64 input, the values it takes are `[0, int_below)` (a GPC
    /// prior's tokens: its vocabulary); others are refused naming the row and position.
    pub int_below: Option<usize>,
    /// Whether a request may send this FP32 input as BOOL too, read as
    /// 0.0 and 1.0: an older release's MaskedMimic, whose env makes its
    /// masks bool and whose model takes bool observations as torch
    /// promotes them (`pmstate policy run` reads BOOL tensors the same way).
    pub also_bool: bool,
}

/// The element type of a tensor a client sends or gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Datatype {
    /// float32: observations and every float output.
    Fp32,
    /// int64: a GPC prior's tokens.
    Int64,
    /// bool: what a request may send where an input allows it
    /// ([`InputSpec::also_bool`]), read as float32 0.0 and 1.0; no input's
    /// or output's own datatype.
    Bool,
}

impl Datatype {
    /// The protocol's name (`FP32`).
    pub fn name(self) -> &'static str {
        match self {
            Datatype::Fp32 => "FP32",
            Datatype::Int64 => "INT64",
            Datatype::Bool => "BOOL",
        }
    }

    /// Triton's model configuration name (`TYPE_FP32`).
    pub fn config_name(self) -> &'static str {
        match self {
            Datatype::Fp32 => "TYPE_FP32",
            Datatype::Int64 => "TYPE_INT64",
            Datatype::Bool => "TYPE_BOOL",
        }
    }

    /// Bytes of one element in binary data.
    pub fn size(self) -> usize {
        match self {
            Datatype::Fp32 => 4,
            Datatype::Int64 => 8,
            Datatype::Bool => 1,
        }
    }
}

impl InputSpec {
    /// A required float32 observation `[rows, width]` that the actor and
    /// critic read (the common case; callers adjust the other fields).
    pub fn observation(name: String, width: Option<usize>) -> Self {
        InputSpec {
            name,
            width,
            actor_critic: true,
            actor: true,
            discriminator: false,
            row_shape: None,
            optional: false,
            datatype: Datatype::Fp32,
            int_below: None,
            also_bool: false,
        }
    }

    /// An input a request may leave out (`vae_noise`, `prior_tokens`).
    pub fn optional(name: String, width: usize, datatype: Datatype, int_below: Option<usize>) -> Self {
        InputSpec { optional: true, datatype, int_below, ..InputSpec::observation(name, Some(width)) }
    }

    /// Its shape in model metadata: `-1` for the rows (and for a width the
    /// checkpoint leaves open).
    pub fn shape(&self) -> Vec<i64> {
        match &self.row_shape {
            Some(row) => std::iter::once(-1).chain(row.iter().map(|&d| d as i64)).collect(),
            None => vec![-1, self.width.map_or(-1, |w| w as i64)],
        }
    }
}

/// One output of the model metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OutputSpec {
    /// Its name.
    pub name: &'static str,
    /// Its shape, `-1` for the rows.
    pub shape: Vec<i64>,
    /// What computes it.
    pub source: Source,
    /// Its element type.
    pub datatype: Datatype,
}

/// What a model takes and gives: its inputs (names, widths or whole row
/// shapes, which may be left out), its outputs (shapes with `-1` for the
/// rows, what computes each) and the sums of widths its checkpoint fixes.
/// A server swaps in only a model of the same signature.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Signature {
    /// Inputs read by some network, in first-use order.
    pub inputs: Vec<InputSpec>,
    /// Keys the config lists although no network reads them (accepted, ignored).
    pub ignored: Vec<String>,
    /// Sums of widths the checkpoint fixes: (module, keys, total).
    pub groups: Vec<(String, Vec<String>, usize)>,
    /// Outputs in their default order.
    pub outputs: Vec<OutputSpec>,
    /// Number of actions.
    pub action_size: usize,
    /// The model class (`PPOModel`, `MaskedMimicModel`, ...).
    pub model: &'static str,
    /// Logits one row makes (a GPC prior's `tokens x vocab`): a forward
    /// holds at most [`MAX_LOGITS_PER_FORWARD`] of them.
    pub logits_per_row: Option<usize>,
}

impl Signature {
    /// Most rows one forward (and so one request) may hold: `max_batch`,
    /// or fewer when the logits of that many rows would pass
    /// [`MAX_LOGITS_PER_FORWARD`] (at least 1: a model whose single row
    /// passes it is refused at load).
    pub fn max_rows(&self, max_batch: usize) -> usize {
        match self.logits_per_row {
            Some(n) if n > 0 => max_batch.min(MAX_LOGITS_PER_FORWARD / n).max(1),
            _ => max_batch,
        }
    }

    /// The input called `name`.
    pub fn input(&self, name: &str) -> Option<&InputSpec> {
        self.inputs.iter().find(|i| i.name == name)
    }

    /// The output called `name`.
    pub fn output(&self, name: &str) -> Option<&OutputSpec> {
        self.outputs.iter().find(|o| o.name == name)
    }

    /// The inputs the model draws itself when sampling (a GPC prior's
    /// INT64 tokens, the only optional INT64 inputs): given, the model is
    /// teacher forced on them; left out, a sampling caller gets them drawn.
    /// A caller gives each exactly when it does not sample.
    pub fn drawn_inputs(&self) -> impl Iterator<Item = &InputSpec> {
        self.inputs.iter().filter(|i| i.optional && i.datatype == Datatype::Int64)
    }

    /// The first difference from `other`, as (what, self, theirs).
    pub fn difference(&self, other: &Signature) -> Option<(Difference, String, String)> {
        if self.model != other.model {
            return Some((Difference::ModelClass, self.model.into(), other.model.into()));
        }
        let names = |i: &Signature| i.inputs.iter().map(|s| s.name.clone()).collect::<Vec<_>>().join(", ");
        if names(self) != names(other) || self.ignored != other.ignored {
            return Some((Difference::InKeys, names(self), names(other)));
        }
        for (a, b) in self.inputs.iter().zip(&other.inputs) {
            if a.width != b.width {
                let w = |w: Option<usize>| w.map_or("open".to_string(), |w| w.to_string());
                return Some((Difference::Width { key: a.name.clone() }, w(a.width), w(b.width)));
            }
            if a.row_shape != b.row_shape {
                return Some((
                    Difference::Shape { key: a.name.clone() },
                    shape_text(&a.shape()),
                    shape_text(&b.shape()),
                ));
            }
        }
        let sums = |i: &Signature| {
            i.groups.iter().map(|(_, k, t)| format!("{} = {t}", k.join(" + "))).collect::<Vec<_>>().join("; ")
        };
        if sums(self) != sums(other) {
            return Some((Difference::WidthSums, sums(self), sums(other)));
        }
        if self.action_size != other.action_size {
            return Some((Difference::ActionSize, self.action_size.to_string(), other.action_size.to_string()));
        }
        if self.outputs != other.outputs {
            let outs = |i: &Signature| {
                i.outputs.iter().map(|o| format!("{} {}", o.name, shape_text(&o.shape))).collect::<Vec<_>>().join(", ")
            };
            return Some((Difference::Outputs, outs(self), outs(other)));
        }
        None
    }
}

/// Most logits one forward of a GPC prior computes (2^24 float32: 64 MiB;
/// its JSON answer is about 12 bytes a value). The published prior makes
/// 8 x 59049 per row: 35 rows a forward, and a request of more rows is
/// refused (400) before any work; merged requests stay under it too.
pub const MAX_LOGITS_PER_FORWARD: usize = 1 << 24;

/// `[-1, 69]`.
fn shape_text(shape: &[i64]) -> String {
    format!("[{}]", shape.iter().map(i64::to_string).collect::<Vec<_>>().join(", "))
}

/// What part of a [`Signature`] another model would change (a server
/// refuses to swap it in).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Difference {
    /// `PPOModel` against `AMPModel`.
    ModelClass,
    /// The observation keys read (or accepted and ignored).
    InKeys,
    /// The width of one key.
    Width {
        /// The key.
        key: String,
    },
    /// The sums of widths the first layers take.
    WidthSums,
    /// The number of actions.
    ActionSize,
    /// The outputs or their shapes.
    Outputs,
    /// The row shape of one pipeline input.
    Shape {
        /// The input.
        key: String,
    },
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Difference::ModelClass => f.write_str("model class"),
            Difference::InKeys => f.write_str("in_keys"),
            Difference::Width { key } => write!(f, "the width of {key}"),
            Difference::WidthSums => f.write_str("width sums"),
            Difference::ActionSize => f.write_str("action size"),
            Difference::Outputs => f.write_str("outputs"),
            Difference::Shape { key } => write!(f, "the shape of {key}"),
        }
    }
}
