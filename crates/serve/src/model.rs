//! The served model: a policy, what clients may send it and get back
//! ([`Interface`]), and where it came from ([`Provenance`]). A reload
//! builds a new one and swaps it in only when its interface is the same.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use candle_core::Device;
use pmstate_deploy::{Contract, Pipeline};
use pmstate_policy::config::Family;
use pmstate_policy::describe::MaskedMimicDescription;
use pmstate_policy::gpc::describe::PriorDescription;
use pmstate_policy::gpc::LatentPrior;
use pmstate_policy::masked_mimic::VAE_NOISE_KEY;
use pmstate_policy::{Description, MaskedMimic, Part, Policy};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::error::{Abandon, Difference, LoadError, PinProblem};
use crate::options::FileLimits;

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
}

/// The element type of a tensor a client sends or gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Datatype {
    /// float32: observations and every float output.
    Fp32,
    /// int64: a GPC prior's tokens.
    Int64,
}

impl Datatype {
    /// The protocol's name (`FP32`).
    pub fn name(self) -> &'static str {
        match self {
            Datatype::Fp32 => "FP32",
            Datatype::Int64 => "INT64",
        }
    }

    /// Triton's model configuration name (`TYPE_FP32`).
    pub fn config_name(self) -> &'static str {
        match self {
            Datatype::Fp32 => "TYPE_FP32",
            Datatype::Int64 => "TYPE_INT64",
        }
    }

    /// Bytes of one element in binary data.
    pub fn size(self) -> usize {
        match self {
            Datatype::Fp32 => 4,
            Datatype::Int64 => 8,
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

/// What clients send and get: the same for every model a server swaps in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Interface {
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
    /// `PPOModel` or `AMPModel`.
    pub model: &'static str,
    /// Logits one row makes (a GPC prior's `tokens x vocab`): a forward
    /// holds at most [`MAX_LOGITS_PER_FORWARD`] of them.
    pub logits_per_row: Option<usize>,
}

impl Interface {
    fn of(policy: &Policy, pins: &[(String, usize)]) -> Result<Interface, LoadError> {
        let ac = policy.required_keys(Part::ActorCritic);
        let actor = policy.actor_keys();
        let disc = policy.required_keys(Part::Discriminator);
        let widths = resolve_widths(policy, pins)?;
        let inputs = policy
            .in_keys()
            .into_iter()
            .map(|k| InputSpec {
                actor_critic: ac.contains(&k),
                actor: actor.contains(&k),
                discriminator: disc.contains(&k),
                ..InputSpec::observation(k.clone(), widths.get(&k).copied())
            })
            .collect::<Vec<_>>();
        let ignored = policy.accepted_keys().into_iter().filter(|k| !inputs.iter().any(|i| &i.name == k)).collect();
        let groups = policy.widths().groups.iter().map(|g| (g.path.clone(), g.keys.clone(), g.total)).collect();
        let a = policy.action_size() as i64;
        let value = policy.widths().known.get(policy.critic().out_key()).map_or(-1, |&w| w as i64);
        let mut outputs = vec![
            OutputSpec { name: "mean_action", shape: vec![-1, a], source: Source::Actor, datatype: Datatype::Fp32 },
            OutputSpec { name: "value", shape: vec![-1, value], source: Source::Critic, datatype: Datatype::Fp32 },
            OutputSpec { name: "std", shape: vec![a], source: Source::Actor, datatype: Datatype::Fp32 },
        ];
        let description = policy.describe()?;
        if let Some(w) = per_row_norm_width(&description) {
            outputs.push(OutputSpec {
                name: "norm_obs",
                shape: vec![-1, w as i64],
                source: Source::Actor,
                datatype: Datatype::Fp32,
            });
        }
        if let Some(scalars) = actor_fsq_scalars(&description) {
            outputs.push(OutputSpec {
                name: "latent_codes",
                shape: vec![-1, scalars as i64],
                source: Source::Actor,
                datatype: Datatype::Fp32,
            });
        }
        outputs.push(OutputSpec {
            name: "action",
            shape: vec![-1, a],
            source: Source::Sample,
            datatype: Datatype::Fp32,
        });
        outputs.push(OutputSpec { name: "neglogp", shape: vec![-1], source: Source::Sample, datatype: Datatype::Fp32 });
        if let Some(amp) = policy.amp() {
            let w = |k: &str| policy.widths().known.get(k).map_or(-1, |&w| w as i64);
            let logits = w(amp.discriminator.out_key());
            outputs.push(OutputSpec {
                name: "disc_logits",
                shape: vec![-1, logits],
                source: Source::Discriminator,
                datatype: Datatype::Fp32,
            });
            outputs.push(OutputSpec {
                name: "disc_reward",
                shape: vec![-1, logits],
                source: Source::Discriminator,
                datatype: Datatype::Fp32,
            });
            outputs.push(OutputSpec {
                name: "disc_value",
                shape: vec![-1, w(amp.disc_critic.out_key())],
                source: Source::Discriminator,
                datatype: Datatype::Fp32,
            });
        }
        Ok(Interface {
            inputs,
            ignored,
            groups,
            outputs,
            action_size: policy.action_size(),
            model: policy.family().target(),
            logits_per_row: None,
        })
    }

    /// The interface of a deployment pipeline: its inputs with their full
    /// shapes, its four outputs `[-1, num_dofs]`.
    pub fn of_pipeline(p: &Pipeline) -> Interface {
        let inputs = p
            .inputs()
            .iter()
            .map(|i| InputSpec {
                row_shape: Some(i.row_shape.clone()),
                ..InputSpec::observation(i.name.clone(), Some(i.row_len()))
            })
            .collect();
        let n = p.dims().num_dofs;
        let outputs = pmstate_deploy::OUTPUT_NAMES
            .iter()
            .map(|&name| OutputSpec {
                name,
                shape: vec![-1, n as i64],
                source: Source::Pipeline,
                datatype: Datatype::Fp32,
            })
            .collect();
        Interface {
            inputs,
            ignored: Vec::new(),
            groups: Vec::new(),
            outputs,
            action_size: n,
            model: PIPELINE_MODEL,
            logits_per_row: None,
        }
    }

    /// The interface of a MaskedMimic model: its observations, then the
    /// optional `vae_noise` `[-1, latent]`; outputs `mean_action`,
    /// `latent_mu`, `latent_logvar`, `latent`, all from one forward.
    pub fn of_masked_mimic(m: &MaskedMimic) -> Interface {
        let mut inputs: Vec<InputSpec> = m
            .in_keys()
            .into_iter()
            .map(|k| {
                let width = m.widths.known.get(&k).copied();
                InputSpec::observation(k, width)
            })
            .collect();
        let latent = m.config.latent_dim;
        inputs.push(InputSpec::optional(VAE_NOISE_KEY.to_owned(), latent, Datatype::Fp32, None));
        let a = m.action_size().map_or(-1, |a| a as i64);
        let l = latent as i64;
        let outputs = [("mean_action", a), ("latent_mu", l), ("latent_logvar", l), ("latent", l)]
            .into_iter()
            .map(|(name, w)| OutputSpec { name, shape: vec![-1, w], source: Source::Actor, datatype: Datatype::Fp32 })
            .collect();
        let groups = m.widths.groups.iter().map(|g| (g.path.clone(), g.keys.clone(), g.total)).collect();
        Interface {
            inputs,
            ignored: Vec::new(),
            groups,
            outputs,
            action_size: m.action_size().unwrap_or(0),
            model: pmstate_policy::config::MASKED_MIMIC_MODEL,
            logits_per_row: None,
        }
    }

    /// The interface of a GPC prior: its observations, then the optional
    /// INT64 `prior_tokens` `[-1, tokens]` (values in `[0, vocab)`);
    /// outputs `logits` `[-1, tokens, vocab]`, `mean_action`,
    /// `latent_codes`, and `prior_tokens` when the request samples.
    pub fn of_prior(p: &LatentPrior) -> Interface {
        let tok = p.tokenization();
        let mut inputs: Vec<InputSpec> = p
            .obs_keys()
            .into_iter()
            .map(|k| {
                let width = p.widths().known.get(&k).copied();
                InputSpec::observation(k, width)
            })
            .collect();
        inputs.push(InputSpec::optional(p.token_key().to_owned(), tok.tokens, Datatype::Int64, Some(tok.vocab)));
        let a = p.action_size().map_or(-1, |a| a as i64);
        let (t, v) = (tok.tokens as i64, tok.vocab as i64);
        let out = |name, shape, source, datatype| OutputSpec { name, shape, source, datatype };
        let outputs = vec![
            out("logits", vec![-1, t, v], Source::Actor, Datatype::Fp32),
            out("mean_action", vec![-1, a], Source::Actor, Datatype::Fp32),
            out("latent_codes", vec![-1, tok.scalars as i64], Source::Actor, Datatype::Fp32),
            out(PRIOR_TOKENS_OUTPUT, vec![-1, t], Source::Sample, Datatype::Int64),
        ];
        let groups = p.widths().groups.iter().map(|g| (g.path.clone(), g.keys.clone(), g.total)).collect();
        Interface {
            inputs,
            ignored: Vec::new(),
            groups,
            outputs,
            action_size: p.action_size().unwrap_or(0),
            model: pmstate_policy::gpc::config::LATENT_PRIOR_MODEL,
            logits_per_row: tok.tokens.checked_mul(tok.vocab),
        }
    }

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

    /// The first difference from `other`, as (what, ours, theirs).
    pub fn difference(&self, other: &Interface) -> Option<(Difference, String, String)> {
        if self.model != other.model {
            return Some((Difference::ModelClass, self.model.into(), other.model.into()));
        }
        let names = |i: &Interface| i.inputs.iter().map(|s| s.name.clone()).collect::<Vec<_>>().join(", ");
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
        let sums = |i: &Interface| {
            i.groups.iter().map(|(_, k, t)| format!("{} = {t}", k.join(" + "))).collect::<Vec<_>>().join("; ")
        };
        if sums(self) != sums(other) {
            return Some((Difference::WidthSums, sums(self), sums(other)));
        }
        if self.action_size != other.action_size {
            return Some((Difference::ActionSize, self.action_size.to_string(), other.action_size.to_string()));
        }
        if self.outputs != other.outputs {
            let outs = |i: &Interface| {
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

/// The name of a GPC prior's generated-tokens output (its token key's name
/// as ProtoMotions writes it).
pub const PRIOR_TOKENS_OUTPUT: &str = "prior_tokens";

/// The model class an [`Interface`] of a deployment pipeline names.
pub const PIPELINE_MODEL: &str = "UnifiedPipeline";

/// `[-1, 69]`.
fn shape_text(shape: &[i64]) -> String {
    format!("[{}]", shape.iter().map(i64::to_string).collect::<Vec<_>>().join(", "))
}

/// The width of `norm_obs` when it has one row per observation row: the
/// actor's first normalizing module runs `Forward` alone (module operations
/// that reshape first make its rows something else, and it is not offered).
fn per_row_norm_width(d: &Description) -> Option<usize> {
    let actor = d.networks.iter().find(|n| n.role == "actor")?;
    let m = actor.modules.iter().find(|m| m.normalizer.is_some())?;
    (m.module_operations == ["Forward"]).then(|| m.normalizer.as_ref().map(|n| n.width)).flatten()
}

/// The codes per row of an FSQ actor's quantizer (`num_fsq_scalars`), when
/// the actor has one: `latent_codes` is then an output.
fn actor_fsq_scalars(d: &Description) -> Option<usize> {
    let actor = d.networks.iter().find(|n| n.role == "actor")?;
    actor.quantizers.first().map(|q| q.scalars)
}

/// Per-key widths: the checkpoint's, then the pins (checked against it),
/// then keys that the pins leave as the single unknown of a width sum,
/// then the resolved configs' widths for the rest, where they fit the sums
/// ([`pmstate_policy::shapes::Widths::resolve_with`]).
fn resolve_widths(policy: &Policy, pins: &[(String, usize)]) -> Result<BTreeMap<String, usize>, LoadError> {
    let keys = policy.in_keys();
    let mut w: BTreeMap<String, usize> =
        policy.widths().known.iter().filter(|(k, _)| keys.contains(k)).map(|(k, &v)| (k.clone(), v)).collect();
    for (k, v) in pins {
        if !keys.contains(k) {
            return Err(LoadError::Pin { key: k.clone(), problem: PinProblem::NotAnInput { inputs: keys.clone() } });
        }
        match w.get(k) {
            Some(&known) if known != *v => {
                return Err(LoadError::Pin {
                    key: k.clone(),
                    problem: PinProblem::Contradicts { pinned: *v, fixed: known },
                })
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
                    return Err(LoadError::Pin {
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
                return Err(LoadError::Pin {
                    key: g.keys.iter().find(|k| pins.iter().any(|(p, _)| p == *k)).unwrap_or(open[0]).clone(),
                    problem: PinProblem::NoColumnLeft { module: g.path.clone(), total: g.total, fixed, parts: parts() },
                });
            } else if open.iter().all(|k| *k == open[0]) {
                let n = open.len();
                if fixed >= g.total || !(g.total - fixed).is_multiple_of(n) {
                    return Err(LoadError::Pin {
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

/// Where a served model came from, for `/v2/models/<name>/config`.
#[derive(Debug, Clone, Serialize)]
pub struct Provenance {
    /// The checkpoint (or the label of an in-process policy).
    pub checkpoint: String,
    /// The resolved configs file.
    pub config: Option<String>,
    /// sha256 of the checkpoint's bytes (None for an in-process policy).
    pub sha256: Option<String>,
    /// Its size in bytes.
    pub bytes: Option<u64>,
    /// When it was loaded, seconds since the Unix epoch.
    pub loaded_at_unix: f64,
    /// How long loading took.
    pub load_seconds: f64,
    /// `cpu` or `cuda:0`.
    pub device: String,
}

/// What `/v2/models/<name>/config` describes: a policy or a MaskedMimic model.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum ModelDescription {
    /// A PPO/AMP policy (also a pipeline's actor).
    Policy(Box<Description>),
    /// A MaskedMimic model.
    MaskedMimic(Box<MaskedMimicDescription>),
    /// A GPC prior.
    Prior(Box<PriorDescription>),
}

/// A model ready to serve.
pub struct LoadedModel {
    /// The policy (a pipeline's actor's); `None` for a MaskedMimic model or a GPC prior.
    pub policy: Option<Policy>,
    /// The MaskedMimic model, when one is served.
    pub masked_mimic: Option<MaskedMimic>,
    /// The GPC prior, when one is served.
    pub prior: Option<LatentPrior>,
    /// 1 for the first model, +1 per reload (the protocol's model version).
    pub version: u64,
    /// What clients send and get.
    pub interface: Interface,
    /// Where it came from.
    pub provenance: Provenance,
    /// Layers, normalizers (settings and counts) and more.
    pub description: ModelDescription,
    /// The deployment pipeline, when one is served (`policy` is then its actor's policy).
    pub pipeline: Option<Pipeline>,
}

/// What [`LoadedModel::load_with`] built, by the model's class.
enum Built {
    Policy(Box<Policy>),
    MaskedMimic(Box<MaskedMimic>),
    Prior(Box<LatentPrior>),
}

/// What a checkpoint is served as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ModelKind {
    /// A policy: observations in, actions (and values, discriminator outputs) out.
    #[default]
    Policy,
    /// A deployment pipeline: sensors and reference motion in, PD targets out.
    Pipeline,
}

/// What identifies one state of a file on disk: a change of any part is a new file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileStamp {
    len: u64,
    modified: Option<SystemTime>,
    inode: u64,
    changed_ns: i64,
}

impl FileStamp {
    /// The stamp of `path` now.
    pub fn of(path: &Path) -> std::io::Result<FileStamp> {
        Ok(FileStamp::from_meta(&std::fs::metadata(path)?))
    }

    /// The stamp of a file's status (an open descriptor's, from `fstat`).
    pub fn from_meta(m: &std::fs::Metadata) -> FileStamp {
        #[cfg(unix)]
        let (inode, changed_ns) = {
            use std::os::unix::fs::MetadataExt;
            (m.ino(), m.ctime().saturating_mul(1_000_000_000).saturating_add(m.ctime_nsec()))
        };
        #[cfg(not(unix))]
        let (inode, changed_ns) = (0, 0);
        FileStamp { len: m.len(), modified: m.modified().ok(), inode, changed_ns }
    }
}

fn device_name(d: &Device) -> String {
    match d {
        Device::Cpu => "cpu".into(),
        Device::Cuda(_) => "cuda:0".into(),
        Device::Metal(_) => "metal".into(),
    }
}

fn unix_now() -> f64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// When a load in progress must give up: past a deadline, or when the
/// server stops. Checked between the phases of a load and between the
/// chunks of its hash (parsing itself is bounded by the readers' limits).
#[derive(Debug, Clone, Default)]
pub struct Cancel {
    /// Give up after this instant, and the deadline's length for the message.
    pub deadline: Option<(Instant, Duration)>,
    /// Give up once this is set.
    pub stop: Option<Arc<AtomicBool>>,
}

impl Cancel {
    /// Never gives up (start-up: a signal ends the whole process).
    pub fn never() -> Cancel {
        Cancel::default()
    }

    /// `Err` when the load must stop now.
    fn check(&self, path: &Path) -> Result<(), LoadError> {
        let abandoned = |why| Err(LoadError::Abandoned { path: path.display().to_string(), why });
        if self.stop.as_ref().is_some_and(|s| s.load(Ordering::Relaxed)) {
            return abandoned(Abandon::ShuttingDown);
        }
        match self.deadline {
            Some((at, len)) if Instant::now() >= at => abandoned(Abandon::Deadline { seconds: len.as_secs_f64() }),
            _ => Ok(()),
        }
    }
}

/// Opens `path` without blocking and checks the open descriptor: a regular
/// file of at most `max` bytes. Nothing has been read when this returns.
fn open_checked(path: &Path, max: u64) -> Result<(std::fs::File, std::fs::Metadata), LoadError> {
    let (file, meta) = pmstate_ckpt::open_regular(path).map_err(|e| LoadError::Policy(e.into()))?;
    if meta.len() > max {
        return Err(LoadError::TooLarge { path: path.display().to_string(), bytes: meta.len(), max });
    }
    Ok((file, meta))
}

/// sha256 of the first `len` bytes of `file` (its size when it was checked:
/// never more, whatever it grows to), giving up when `cancel` says so.
fn sha256_of(file: std::fs::File, len: u64, path: &Path, cancel: &Cancel) -> Result<(String, u64), LoadError> {
    let io = |source| LoadError::Io { path: path.display().to_string(), source };
    let mut f = file.take(len);
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        cancel.check(path)?;
        let n = f.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        total += n as u64;
    }
    let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Ok((hex, total))
}

/// The checks every load makes around `build` (which reads the checkpoint
/// with the resolved configs path, and returns that path as the model
/// records it, and the model): both files checked on their open
/// descriptors (regular, within [`FileLimits::max_file_bytes`]) before
/// anything is read, the checkpoint's bytes hashed after, the file checked
/// unchanged across all of it (else [`LoadError::Changed`]).
fn load_checked<T>(
    path: &Path,
    config: Option<&PathBuf>,
    device: &Device,
    files: &FileLimits,
    cancel: &Cancel,
    build: impl FnOnce(&Path) -> Result<(Option<String>, T), LoadError>,
) -> Result<(T, Provenance), LoadError> {
    let start = Instant::now();
    let changed = || LoadError::Changed { path: path.display().to_string() };
    let io = |source| LoadError::Io { path: path.display().to_string(), source };
    let (file, meta) = open_checked(path, files.max_file_bytes)?;
    let before = FileStamp::from_meta(&meta);
    let config_path = pmstate_policy::find_config(path, config.map(|c| c.as_path()))?;
    drop(open_checked(&config_path, files.max_file_bytes)?);
    cancel.check(path)?;
    let (config, model) = build(&config_path)?;
    cancel.check(path)?;
    let (sha256, bytes) = sha256_of(file, before.len, path, cancel)?;
    if FileStamp::of(path).map_err(io)? != before || bytes != before.len {
        return Err(changed());
    }
    let provenance = Provenance {
        checkpoint: path.display().to_string(),
        config,
        sha256: Some(sha256),
        bytes: Some(bytes),
        loaded_at_unix: unix_now(),
        load_seconds: start.elapsed().as_secs_f64(),
        device: device_name(device),
    };
    Ok((model, provenance))
}

impl LoadedModel {
    /// Loads a checkpoint with [`FileLimits::default`] and no deadline; see
    /// [`LoadedModel::load_with`].
    pub fn load(
        path: &Path,
        config: Option<&PathBuf>,
        device: &Device,
        pins: &[(String, usize)],
        version: u64,
    ) -> Result<LoadedModel, LoadError> {
        Self::load_with(path, config, device, pins, version, &FileLimits::default(), &Cancel::never())
    }

    /// Loads a checkpoint: both files checked on their open descriptors
    /// (regular, within [`FileLimits::max_file_bytes`]) before anything is
    /// read, the policy built (globals vetted as `files.globals` says),
    /// then the checkpoint's bytes hashed; the file checked unchanged
    /// across all of it (else [`LoadError::Changed`]).
    pub fn load_with(
        path: &Path,
        config: Option<&PathBuf>,
        device: &Device,
        pins: &[(String, usize)],
        version: u64,
        files: &FileLimits,
        cancel: &Cancel,
    ) -> Result<LoadedModel, LoadError> {
        let opts = pmstate_policy::LoadOptions { globals: files.globals };
        let (built, provenance) = load_checked(path, config, device, files, cancel, |config_path| {
            let configs = pmstate_ckpt::Checkpoint::open(config_path).map_err(|e| LoadError::Policy(e.into()))?;
            let target = pmstate_policy::model_target(&configs)?;
            drop(configs);
            let shown = Some(config_path.display().to_string());
            if target == pmstate_policy::config::MASKED_MIMIC_MODEL {
                let m = MaskedMimic::load_with(path, Some(config_path), device, &opts)?;
                return Ok((shown, Built::MaskedMimic(Box::new(m))));
            }
            if target == pmstate_policy::gpc::config::LATENT_PRIOR_MODEL {
                let p = LatentPrior::load_with(path, Some(config_path), device, &opts)?;
                return Ok((shown, Built::Prior(Box::new(p))));
            }
            let policy = Policy::load_with(path, Some(config_path), device, &opts)?;
            Ok((policy.config_path().map(str::to_owned), Built::Policy(Box::new(policy))))
        })?;
        match built {
            Built::Policy(policy) => Self::from_policy(*policy, provenance, pins, version),
            Built::MaskedMimic(m) => Self::from_masked_mimic(*m, provenance, pins, version),
            Built::Prior(p) => Self::from_prior(*p, provenance, pins, version),
        }
    }

    /// A GPC prior; `--width` pins do not apply (its widths are the
    /// checkpoint's). Refused when one row's logits pass [`MAX_LOGITS_PER_FORWARD`].
    fn from_prior(
        p: LatentPrior,
        provenance: Provenance,
        pins: &[(String, usize)],
        version: u64,
    ) -> Result<LoadedModel, LoadError> {
        let model = pmstate_policy::gpc::config::LATENT_PRIOR_MODEL;
        if let Some((k, _)) = pins.first() {
            return Err(LoadError::Pin { key: k.clone(), problem: PinProblem::NotPinnable { model } });
        }
        let interface = Interface::of_prior(&p);
        let per_row = interface.logits_per_row.unwrap_or(usize::MAX);
        if per_row > MAX_LOGITS_PER_FORWARD {
            return Err(LoadError::TooManyLogits {
                path: provenance.checkpoint.clone(),
                per_row,
                limit: MAX_LOGITS_PER_FORWARD,
            });
        }
        let description = ModelDescription::Prior(Box::new(p.describe()));
        Ok(LoadedModel {
            policy: None,
            masked_mimic: None,
            prior: Some(p.with_max_logits(MAX_LOGITS_PER_FORWARD)),
            version,
            interface,
            provenance,
            description,
            pipeline: None,
        })
    }

    /// A MaskedMimic model; `--width` pins do not apply (its widths are the checkpoint's).
    fn from_masked_mimic(
        m: MaskedMimic,
        provenance: Provenance,
        pins: &[(String, usize)],
        version: u64,
    ) -> Result<LoadedModel, LoadError> {
        if let Some((k, _)) = pins.first() {
            return Err(LoadError::Pin {
                key: k.clone(),
                problem: PinProblem::NotPinnable { model: pmstate_policy::config::MASKED_MIMIC_MODEL },
            });
        }
        let interface = Interface::of_masked_mimic(&m);
        let description = ModelDescription::MaskedMimic(Box::new(m.describe()));
        Ok(LoadedModel {
            policy: None,
            masked_mimic: Some(m),
            prior: None,
            version,
            interface,
            provenance,
            description,
            pipeline: None,
        })
    }

    /// Loads a checkpoint as a deployment pipeline ([`Pipeline::load_with`]),
    /// with the checks and provenance of [`LoadedModel::load_with`]. A
    /// pipeline runs on the CPU.
    pub fn load_pipeline_with(
        path: &Path,
        config: Option<&PathBuf>,
        version: u64,
        files: &FileLimits,
        cancel: &Cancel,
    ) -> Result<LoadedModel, LoadError> {
        let opts = pmstate_policy::LoadOptions { globals: files.globals };
        let (pipeline, provenance) = load_checked(path, config, &Device::Cpu, files, cancel, |config_path| {
            let pipeline = Pipeline::load_with(path, Some(config_path), &opts)?;
            Ok((pipeline.policy().config_path().map(str::to_owned), pipeline))
        })?;
        let interface = Interface::of_pipeline(&pipeline);
        // a clone shares the weights (candle tensors are reference counted)
        let policy = pipeline.policy().clone();
        let description = ModelDescription::Policy(Box::new(policy.describe()?));
        Ok(LoadedModel {
            policy: Some(policy),
            masked_mimic: None,
            prior: None,
            version,
            interface,
            provenance,
            description,
            pipeline: Some(pipeline),
        })
    }

    /// The deployment contract, when a pipeline is served.
    pub fn contract(&self) -> Option<&Contract> {
        self.pipeline.as_ref().map(Pipeline::contract)
    }

    /// A policy built in process.
    pub fn in_process(policy: Policy, label: &str, pins: &[(String, usize)]) -> Result<LoadedModel, LoadError> {
        let provenance = Provenance {
            checkpoint: label.to_owned(),
            config: None,
            sha256: None,
            bytes: None,
            loaded_at_unix: unix_now(),
            load_seconds: 0.0,
            device: device_name(policy.device()),
        };
        Self::from_policy(policy, provenance, pins, 1)
    }

    fn from_policy(
        policy: Policy,
        provenance: Provenance,
        pins: &[(String, usize)],
        version: u64,
    ) -> Result<LoadedModel, LoadError> {
        let interface = Interface::of(&policy, pins)?;
        let description = ModelDescription::Policy(Box::new(policy.describe()?));
        Ok(LoadedModel {
            policy: Some(policy),
            masked_mimic: None,
            prior: None,
            version,
            interface,
            provenance,
            description,
            pipeline: None,
        })
    }

    /// The policy's family (`None` for a MaskedMimic model or a GPC prior).
    pub fn family(&self) -> Option<Family> {
        self.policy.as_ref().map(Policy::family)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(variant: &str) -> Policy {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy").join(variant);
        Policy::load(dir.join("last.ckpt"), None, &Device::Cpu).unwrap()
    }

    fn pins(p: &[(&str, usize)]) -> Vec<(String, usize)> {
        p.iter().map(|&(k, w)| (k.to_owned(), w)).collect()
    }

    #[test]
    fn a_masked_mimic_model_takes_no_width_pins() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy/masked_mimic");
        let e = LoadedModel::load(&dir.join("last.ckpt"), None, &Device::Cpu, &pins(&[("max_coords_obs", 24)]), 1)
            .err()
            .unwrap();
        assert!(
            matches!(&e, LoadError::Pin { key, problem: PinProblem::NotPinnable { .. } } if key == "max_coords_obs"),
            "{e}"
        );
        let ok = LoadedModel::load(&dir.join("last.ckpt"), None, &Device::Cpu, &[], 1).unwrap();
        assert!(ok.policy.is_none() && ok.masked_mimic.is_some());
        assert_eq!(ok.interface.input("vae_noise").map(|i| (i.optional, i.width)), Some((true, Some(8))));
    }

    /// A GPC prior: no pins; its forwards hold at most MAX_LOGITS_PER_FORWARD logits.
    #[test]
    fn a_gpc_prior_bounds_its_rows_by_its_logits() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy/gpc_prior");
        let ckpt = dir.join("inference_last.ckpt");
        let e = LoadedModel::load(&ckpt, None, &Device::Cpu, &pins(&[("max_coords_obs", 343)]), 1).err().unwrap();
        assert!(matches!(&e, LoadError::Pin { problem: PinProblem::NotPinnable { .. }, .. }), "{e}");
        let m = LoadedModel::load(&ckpt, None, &Device::Cpu, &[], 1).unwrap();
        assert!(m.prior.is_some() && m.policy.is_none());
        let per_row = 20 * 81;
        assert_eq!(m.interface.logits_per_row, Some(per_row));
        assert_eq!(m.interface.max_rows(256), 256);
        assert_eq!(m.interface.max_rows(1 << 20), MAX_LOGITS_PER_FORWARD / per_row);
        let tokens = m.interface.input("prior_tokens").unwrap();
        assert_eq!(
            (tokens.datatype, tokens.optional, tokens.int_below, tokens.width),
            (Datatype::Int64, true, Some(81), Some(20))
        );
    }

    fn pin_problem(policy: &Policy, p: &[(&str, usize)]) -> (String, PinProblem) {
        match resolve_widths(policy, &pins(p)) {
            Err(LoadError::Pin { key, problem }) => (key, problem),
            other => panic!("{p:?}: expected a pin error, got {other:?}"),
        }
    }

    /// The smpl tracker's checkpoint, loaded with `files` and `cancel`.
    fn load_tracker(files: &FileLimits, cancel: &Cancel) -> Result<LoadedModel, LoadError> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy/smpl_tracker");
        LoadedModel::load_with(&dir.join("last.ckpt"), None, &Device::Cpu, &[], 1, files, cancel)
    }

    #[test]
    fn a_load_stops_at_the_size_limit_the_deadline_or_a_shutdown() {
        let ok = load_tracker(&FileLimits::default(), &Cancel::never()).unwrap();
        let bytes = ok.provenance.bytes.unwrap();
        assert_eq!(ok.provenance.sha256.as_ref().map(String::len), Some(64));

        let small = FileLimits { max_file_bytes: bytes - 1, ..FileLimits::default() };
        let e = load_tracker(&small, &Cancel::never()).err().unwrap();
        assert!(matches!(&e, LoadError::TooLarge { bytes: b, max, .. } if *b == bytes && *max == bytes - 1), "{e}");
        // exactly at the limit loads
        let exact = FileLimits { max_file_bytes: bytes, ..FileLimits::default() };
        assert_eq!(load_tracker(&exact, &Cancel::never()).unwrap().provenance.sha256, ok.provenance.sha256);

        let past = Cancel { deadline: Some((Instant::now(), Duration::from_secs(3))), stop: None };
        let e = load_tracker(&FileLimits::default(), &past).err().unwrap();
        assert!(
            matches!(&e, LoadError::Abandoned { why: Abandon::Deadline { seconds }, .. } if *seconds == 3.0),
            "{e}"
        );
        assert!(e.to_string().ends_with("still running after the reload deadline of 3 s"), "{e}");

        let stopping = Cancel { deadline: None, stop: Some(Arc::new(AtomicBool::new(true))) };
        let e = load_tracker(&FileLimits::default(), &stopping).err().unwrap();
        assert!(matches!(&e, LoadError::Abandoned { why: Abandon::ShuttingDown, .. }), "{e}");
    }

    #[test]
    fn pins_fill_the_open_widths_or_say_what_contradicts_them() {
        // smpl tracker: the three widths are open, their sum (1003) fixed by the actor's first Linear
        let smpl = policy("smpl_tracker");
        let w = resolve_widths(&smpl, &pins(&[("max_coords_obs", 358), ("mimic_target_poses", 576)])).unwrap();
        assert_eq!(w.get("previous_actions"), Some(&69));

        let (key, problem) = pin_problem(&smpl, &[("nope", 3)]);
        assert_eq!(key, "nope");
        assert!(matches!(&problem, PinProblem::NotAnInput { inputs } if inputs.len() == 3), "{problem}");

        let (key, problem) = pin_problem(&smpl, &[("max_coords_obs", 1002), ("mimic_target_poses", 1)]);
        assert_eq!(key, "max_coords_obs");
        assert!(
            matches!(&problem, PinProblem::NoColumnLeft { total: 1003, fixed: 1003, parts, .. }
                if parts == &[Some(1002), Some(1), None]),
            "{problem}"
        );
        assert!(problem.to_string().ends_with("the pins already take 1003 (1002 + 1 + ?)"), "{problem}");

        let (_, problem) =
            pin_problem(&smpl, &[("max_coords_obs", 358), ("mimic_target_poses", 576), ("previous_actions", 70)]);
        assert!(
            matches!(&problem, PinProblem::SumMismatch { parts, sum: 1004, total: 1003, .. } if parts == &[358, 576, 70]),
            "{problem}"
        );
        assert!(problem.to_string().contains("reads 358 + 576 + 70 = 1004 columns"), "{problem}");

        // container: obs_a's width is fixed by its own normalizer
        let container = policy("container_obsprocessor");
        let (key, problem) = pin_problem(&container, &[("obs_a", 7)]);
        assert_eq!(key, "obs_a");
        assert_eq!(problem, PinProblem::Contradicts { pinned: 7, fixed: 6 });
        assert_eq!(LoadError::Pin { key, problem }.to_string(), "--width obs_a: 7, but the checkpoint fixes 6");
    }
}
