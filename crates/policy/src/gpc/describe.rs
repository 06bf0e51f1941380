//! `policy describe` of a GPC prior: its inputs, token structure,
//! transformer sizes, sampling settings and outputs.

use serde::Serialize;

use super::LatentPrior;

/// One observation input.
#[derive(Debug, Clone, Serialize)]
pub struct PriorInput {
    /// The key.
    pub key: String,
    /// Its width, when the checkpoint fixes it.
    pub width: Option<usize>,
    /// Which parts read it (`context encoder`, `decoder`).
    pub read_by: Vec<&'static str>,
}

/// What [`LatentPrior::describe`] returns.
#[derive(Debug, Clone, Serialize)]
pub struct PriorDescription {
    /// The model class.
    pub class: &'static str,
    /// The checkpoint.
    pub checkpoint: String,
    /// The configs file.
    pub config: Option<String>,
    /// The observations (f32 `[B, D]`).
    pub in_keys: Vec<PriorInput>,
    /// The optional teacher-forced token input (int64 `[B, tokens]`).
    pub token_key: String,
    /// Tokens per row.
    pub tokens: usize,
    /// Vocabulary size (`levels ^ scalars_per_token`).
    pub vocab: usize,
    /// FSQ levels.
    pub fsq_levels: usize,
    /// FSQ scalars.
    pub fsq_scalars: usize,
    /// FSQ scalars packed in one token.
    pub fsq_scalars_per_token: usize,
    /// Transformer width.
    pub d_model: usize,
    /// Attention heads.
    pub heads: usize,
    /// Layers.
    pub layers: usize,
    /// Feed-forward width.
    pub ff: usize,
    /// Feed-forward activation.
    pub activation: String,
    /// Learned positions.
    pub max_seq_len: usize,
    /// The context encoder's normalizer: `(clamp, count)` when it normalizes.
    pub context_normalizer: Option<(Option<String>, i64)>,
    /// Sampling temperature.
    pub temperature: f64,
    /// Nucleus mass.
    pub top_p: f64,
    /// Actions.
    pub action_size: Option<usize>,
    /// Outputs of `policy run` (teacher-forced; with --sample).
    pub outputs: Vec<&'static str>,
}

impl LatentPrior {
    /// The description `policy describe` prints.
    pub fn describe(&self) -> PriorDescription {
        let c = self.config();
        let p = &c.prior;
        let ctx = self.context_encoder.external_keys();
        let dec = self.decoder.external_keys();
        let in_keys = self
            .obs_keys()
            .into_iter()
            .map(|k| {
                let mut read_by = Vec::new();
                if ctx.contains(&k) {
                    read_by.push("context encoder");
                }
                if dec.contains(&k) {
                    read_by.push("decoder");
                }
                PriorInput { width: self.widths().known.get(&k).copied(), key: k, read_by }
            })
            .collect();
        let context_normalizer = self
            .context_encoder
            .leaves()
            .into_iter()
            .find_map(|l| l.norm.as_ref())
            .map(|n| (n.settings.clamp.map(|c| c.to_string()), n.count));
        PriorDescription {
            class: super::config::LATENT_PRIOR_MODEL,
            checkpoint: self.checkpoint_path().to_owned(),
            config: self.config_path().map(str::to_owned),
            in_keys,
            token_key: p.token_key.clone(),
            tokens: c.tokenization.tokens,
            vocab: c.tokenization.vocab,
            fsq_levels: c.tokenization.levels,
            fsq_scalars: c.tokenization.scalars,
            fsq_scalars_per_token: c.tokenization.per_token,
            d_model: p.d_model,
            heads: p.num_heads,
            layers: p.num_layers,
            ff: p.ff_size,
            activation: p.activation.name().to_owned(),
            max_seq_len: p.max_seq_len,
            context_normalizer,
            temperature: c.temperature,
            top_p: c.top_p,
            action_size: self.action_size(),
            outputs: vec!["mean_action", "logits", "latent_codes", "norm_obs", "prior_tokens (with --sample)"],
        }
    }
}

impl std::fmt::Display for PriorDescription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{}", self.class)?;
        writeln!(f, "checkpoint: {}", self.checkpoint)?;
        if let Some(c) = &self.config {
            writeln!(f, "configs: {c}")?;
        }
        writeln!(f, "observations (f32 [B, D]):")?;
        for k in &self.in_keys {
            let w = k.width.map_or("?".to_owned(), |w| w.to_string());
            writeln!(f, "  {} {w}  (read by {})", k.key, k.read_by.join(", "))?;
        }
        writeln!(
            f,
            "tokens: {} (int64 [B, {}], optional: teacher forcing), vocabulary {} = {}^{} ({} FSQ scalars of {} levels)",
            self.token_key,
            self.tokens,
            self.vocab,
            self.fsq_levels,
            self.fsq_scalars_per_token,
            self.fsq_scalars,
            self.fsq_levels
        )?;
        writeln!(
            f,
            "transformer: d_model {}, {} heads, {} layers, ff {} ({}), {} positions, context prefix + causal mask",
            self.d_model, self.heads, self.layers, self.ff, self.activation, self.max_seq_len
        )?;
        if let Some((clamp, count)) = &self.context_normalizer {
            let clamp = clamp.as_deref().unwrap_or("none");
            writeln!(f, "context normalizer: clamp {clamp}, count {count}")?;
        }
        writeln!(f, "sampling: temperature {}, top_p {}", self.temperature, self.top_p)?;
        if let Some(a) = self.action_size {
            writeln!(f, "actions: {a}")?;
        }
        write!(f, "outputs: {}", self.outputs.join(", "))
    }
}
