//! Older ProtoMotions releases' model layouts: which release a model's
//! configs come from, told by the module classes only that release's
//! layout uses.
//!
//! v3.0 and v3.1 named MaskedMimic `protomotions.agents.masked_mimic.model.MaskedMimicModel`
//! (today's lives in `agents.supervised`): v3.0 built its prior, trunk and
//! encoder from `SequentialModule`, `MultiOutputModule` and `Flatten`
//! ([`v30`]), v3.1 from today's `ObsProcessor` and `ModuleContainer`. Both
//! releases' normalizers were Welford's (no `norm_ema_decay`), and their
//! `Transformer` concatenated mask inputs as they are
//! ([`MaskRule::PerToken`](crate::network::MaskRule::PerToken)).
//! [`masked_mimic`] reads that model in either layout.

use pmstate_ckpt::Node;
use serde::Serialize;

use crate::config::{ModuleConfig, MODULE_CONTAINER};

pub mod masked_mimic;
pub mod v30;

/// `_target_` of MaskedMimic in v3.0 and v3.1.
pub const MASKED_MIMIC_V3: &str = "protomotions.agents.masked_mimic.model.MaskedMimicModel";
/// `_target_` of v3.0's and v3.1's MaskedMimic without a VAE (not read).
pub const FEED_FORWARD_V3: &str = "protomotions.agents.masked_mimic.model.FeedForwardModel";

/// A release whose layout is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Release {
    /// v3.0: `SequentialModule`, `MultiOutputModule`, `Flatten`.
    #[serde(rename = "v3.0")]
    V30,
    /// v3.1: `ObsProcessor`, `ModuleContainer`.
    #[serde(rename = "v3.1")]
    V31,
}

impl Release {
    /// The release tag (`v3.1`).
    pub fn name(self) -> &'static str {
        match self {
            Release::V30 => "v3.0",
            Release::V31 => "v3.1",
        }
    }

    /// The release and the module classes of its layout, as errors and
    /// `describe` name them.
    pub fn layout(self) -> &'static str {
        match self {
            Release::V30 => "v3.0 layout (SequentialModule)",
            Release::V31 => "v3.1 layout (ObsProcessor, ModuleContainer)",
        }
    }

    /// The MaskedMimic class its configs name.
    pub fn masked_mimic_class(self) -> &'static str {
        MASKED_MIMIC_V3
    }

    /// The release whose layout `targets` (every `_target_` under a model
    /// config) use: the first module class only one layout has decides.
    pub fn of_targets(targets: &[String]) -> Option<Release> {
        targets.iter().find_map(|t| match t.as_str() {
            v30::SEQUENTIAL_MODULE | v30::MULTI_OUTPUT_MODULE | v30::MULTI_INPUT_MODULE | v30::FLATTEN => {
                Some(Release::V30)
            }
            MODULE_CONTAINER => Some(Release::V31),
            _ => None,
        })
    }
}

/// Most levels [`targets`] walks: a model config nests a few dozen deep; a
/// hostile one deeper is cut short (the walk only names a layout).
const MAX_DEPTH: usize = 64;

/// Every `_target_` string under `node` (a model config: its modules' classes).
pub(crate) fn targets(node: &Node) -> Vec<String> {
    let mut out = Vec::new();
    collect_targets(node, 0, &mut out);
    out
}

fn collect_targets(node: &Node, depth: usize, out: &mut Vec<String>) {
    if depth > MAX_DEPTH {
        return;
    }
    match node {
        Node::Dict(d) => {
            for (k, v) in d.entries() {
                match (k, v) {
                    (Node::Str(k), Node::Str(t)) if k == "_target_" => out.push(t.clone()),
                    _ => collect_targets(v, depth + 1, out),
                }
            }
        }
        Node::List(v) | Node::Tuple(v) => v.iter().for_each(|n| collect_targets(n, depth + 1, out)),
        Node::Object(o) => {
            if let Some(s) = &o.state {
                collect_targets(s, depth + 1, out);
            }
        }
        _ => {}
    }
}

/// `cfg` with every normalizer's `norm_ema_decay` cleared: the releases
/// before it kept Welford's statistics (today's parser fills in its default,
/// 0.999, for a config without the field). Inference reads mean and var
/// alike either way; this keeps `describe` true.
pub(crate) fn welford(cfg: &mut ModuleConfig) {
    match cfg {
        ModuleConfig::Mlp(m) => m.norm.ema_decay = None,
        ModuleConfig::ObsProcessor(o) => o.norm.ema_decay = None,
        ModuleConfig::Container(c) => c.models.iter_mut().for_each(welford),
        ModuleConfig::Fsq(f) => {
            welford(&mut f.encoder);
            welford(&mut f.decoder);
        }
        ModuleConfig::Transformer(_) => {}
    }
}
