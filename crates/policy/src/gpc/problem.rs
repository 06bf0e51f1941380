//! What the GPC prior refuses, in its config and in its inputs.

use pmstate_norm::Dims;

/// What is wrong with a GPC prior's config, weights or inputs
/// ([`crate::PolicyError::Prior`] names the config path or input key).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PriorProblem {
    /// `latent_decoder.module_config` is `None`: ProtoMotions would rebuild
    /// the decoder from another checkpoint's resolved configs.
    #[error(
        "no embedded decoder config (module_config is None; checkpoint_path = {checkpoint_path:?}): pmstate reads \
         the decoder's config from the prior's own inference configs, as prepare_inference_config_for_save writes them"
    )]
    NoDecoderConfig {
        /// The config's `checkpoint_path`.
        checkpoint_path: String,
    },
    /// `latent_decoder.checkpoint_path` is set: ProtoMotions would load the
    /// decoder from that file when it exists (not implemented).
    #[error(
        "checkpoint_path = {checkpoint_path:?}: loading the decoder from a separate tracker checkpoint is not \
         supported (an inference config embeds module_config and clears checkpoint_path)"
    )]
    DecoderCheckpoint {
        /// The config's `checkpoint_path`.
        checkpoint_path: String,
    },
    /// The decoder module is not an `FSQAutoEncoder` (no quantizer to turn indices into codes).
    #[error("the latent decoder must be an FSQAutoEncoder (it needs a quantizer), found {class}")]
    DecoderNotFsq {
        /// The module's `_target_`.
        class: String,
    },
    /// `fsq_scalars_per_prior_token` does not divide `num_fsq_scalars`.
    #[error("fsq_scalars_per_prior_token = {per_token} does not divide num_fsq_scalars = {scalars}")]
    ScalarsPerToken {
        /// `fsq_scalars_per_prior_token`.
        per_token: usize,
        /// The decoder's `num_fsq_scalars`.
        scalars: usize,
    },
    /// `num_fsq_levels ** fsq_scalars_per_prior_token` does not fit.
    #[error("a vocabulary of {levels}^{per_token} tokens is too large")]
    VocabTooLarge {
        /// `num_fsq_levels`.
        levels: usize,
        /// `fsq_scalars_per_prior_token`.
        per_token: usize,
    },
    /// The prior reads no key besides its token key.
    #[error("the prior's in_keys {in_keys:?} declare no context key besides the token key {token_key:?}")]
    NoContextKey {
        /// `prior.in_keys`.
        in_keys: Vec<String>,
        /// `prior.token_key`.
        token_key: String,
    },
    /// A submodule reads or writes another key than the prior's config names.
    #[error("{field} = {expected:?}, but the module there {role} {found:?}")]
    KeyMismatch {
        /// The prior's field (`context_embedding_key`).
        field: &'static str,
        /// Its value.
        expected: String,
        /// `writes` or `reads`.
        role: &'static str,
        /// What the module writes or reads.
        found: String,
    },
    /// A module's output width differs from what the prior needs.
    #[error("{what} is {got} wide, the prior needs {expected}")]
    Width {
        /// Which output (`the context embedding`).
        what: &'static str,
        /// Its width.
        got: usize,
        /// `d_model` or the vocabulary size.
        expected: usize,
    },
    /// `temperature` at or below zero (ProtoMotions raises at sampling time).
    #[error("temperature = {value}: sampling needs a positive temperature")]
    Temperature {
        /// The value.
        value: f64,
    },
    /// `top_p` is NaN.
    #[error("top_p = {value} is not a number")]
    TopP {
        /// The value.
        value: f64,
    },
    /// `_pos_emb` is not `[1, max_seq_len, d_model]` or too short for the context and every token.
    #[error(
        "_pos_emb has shape {}: expected [1, L, {d_model}] with L >= {needed} (the context and every token)",
        Dims(shape)
    )]
    Positions {
        /// Its shape.
        shape: Vec<usize>,
        /// `d_model`.
        d_model: usize,
        /// `num_tokens + 1`.
        needed: usize,
    },
    /// A token encoder that is not a plain table would need a one-hot tensor over the limit.
    #[error(
        "the token encoder is not a plain Linear over the one-hot tokens: its one-hot input of {batch} x {tokens} x \
         {vocab} values is over the limit of {} (a smaller batch fits)",
        super::MAX_ONE_HOT_ELEMENTS
    )]
    OneHotTooLarge {
        /// Batch rows.
        batch: usize,
        /// Tokens per row.
        tokens: usize,
        /// Vocabulary.
        vocab: usize,
    },
    /// A batch whose logits pass the limit.
    #[error("a batch of {batch} rows would return {per_row} logits per row, over the limit of {limit} in one call: split it")]
    TooManyLogits {
        /// Rows.
        batch: usize,
        /// `tokens x vocab`.
        per_row: usize,
        /// The limit.
        limit: usize,
    },
    /// [`super::LatentPrior::generate_rows`] given another number of draws than rows.
    #[error("{draws} row draws for a batch of {batch} rows")]
    Draws {
        /// Draws given.
        draws: usize,
        /// Rows.
        batch: usize,
    },
    /// Teacher forcing without tokens.
    #[error(
        "no tokens: teacher forcing reads int64 [B, {tokens}] tokens here (generation, `--sample`, draws its own)"
    )]
    NoTokens {
        /// Tokens per row.
        tokens: usize,
    },
    /// The token input is not an int64 tensor.
    #[error("prior tokens must be int64 [B, {tokens}], got {dtype}")]
    TokensDtype {
        /// Its dtype.
        dtype: String,
        /// Tokens per row.
        tokens: usize,
    },
    /// The token input is not `[B, num_tokens]` with the observations' B.
    #[error("prior tokens must be [{batch}, {tokens}], got {}", Dims(shape))]
    TokensShape {
        /// Its shape.
        shape: Vec<usize>,
        /// The observations' batch.
        batch: usize,
        /// Tokens per row.
        tokens: usize,
    },
    /// A token outside `[0, vocab)` (torch's `one_hot` raises).
    #[error("row {row}, token {index}: {value} is outside the vocabulary [0, {vocab})")]
    TokenRange {
        /// Batch row.
        row: usize,
        /// Position in the row.
        index: usize,
        /// The value.
        value: i64,
        /// The vocabulary size.
        vocab: usize,
    },
}
