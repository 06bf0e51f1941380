//! What exactly is wrong, for the errors that carry a config path and a
//! problem: a field value that cannot work ([`FieldProblem`]), modules that
//! do not fit together ([`GraphProblem`]), a module operation that cannot
//! apply to its input ([`OpProblem`]), a batch-size expression that does not
//! evaluate ([`ExprProblem`]). Callers match on these; the messages are the
//! reference's wording where it has one (torch's reshape, Python's errors).

use pmstate_norm::Dims;

/// Why a config field's value cannot work (in [`PolicyError::BadField`](crate::PolicyError::BadField)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FieldProblem {
    /// `norm_clamp_value` at or below zero.
    #[error("{value}: a clamp must be > 0 (the reference would clamp to an empty range)")]
    ClampNotPositive {
        /// The value, as the config holds it (`0`, `-1.5`).
        value: String,
    },
    /// A positive int that does not fit this machine's `usize`.
    #[error("{value} is too large")]
    TooLarge {
        /// The value.
        value: i64,
    },
    /// A list that must not be empty.
    #[error("empty: {needs}")]
    Empty {
        /// Why an element is needed.
        needs: &'static str,
    },
    /// A reshape's batch-size expression that does not evaluate.
    #[error("\"{expr}\": {problem}")]
    BatchExpr {
        /// The expression.
        expr: String,
        /// What stops it.
        problem: ExprProblem,
    },
    /// A reshape element that is neither an int nor (at index 0) a batch-size expression.
    #[error("element {index} is {found}: only element 0 may be a string, one naming batch_size")]
    ReshapeElement {
        /// Index in `new_shape`.
        index: usize,
        /// The element, in short form.
        found: String,
    },
    /// An FSQ key this crate does not wire as the reference would.
    #[error("{key}: must be {role}")]
    FsqKey {
        /// The key found.
        key: String,
        /// Which key it is, and what it must be.
        role: FsqKeyRole,
    },
    /// FSQ levels that are even (the reference raises "FSQ requires an odd
    /// number of quantization levels") or 1 (its scale is 0/0).
    #[error("{levels}: FSQ needs an odd number of quantization levels, at least 3")]
    FsqLevels {
        /// The value.
        levels: usize,
    },
    /// A list with the wrong number of entries.
    #[error("{found} entries: {needs}")]
    Count {
        /// How many it has.
        found: usize,
        /// What it needs.
        needs: &'static str,
    },
    /// A key the field names is not one of the module's in_keys.
    #[error("{key} is not one of in_keys ({needs})")]
    NotAnInKey {
        /// The key.
        key: String,
        /// Why it must be.
        needs: &'static str,
    },
    /// A size that must agree with another field's.
    #[error("{value} does not fit {other} = {other_value}")]
    Mismatch {
        /// The value.
        value: usize,
        /// The other field.
        other: &'static str,
        /// Its value.
        other_value: usize,
    },
    /// A value outside its range.
    #[error("{value} is outside {range}")]
    OutOfRange {
        /// The value.
        value: String,
        /// The range.
        range: &'static str,
    },
    /// Module operations a release's module class is not read with
    /// (v3.0's `Flatten`: one `ModuleOperationForwardConfig`, as every
    /// published config has it).
    #[error("{found}: {needs}")]
    Operations {
        /// The operations found, by class.
        found: String,
        /// What is read.
        needs: &'static str,
    },
    /// The encoder's output width differs from `num_fsq_scalars`.
    #[error("FSQAutoEncoder encoder output dim ({encoder}) must match num_fsq_scalars ({scalars})")]
    FsqScalars {
        /// The encoder's output width.
        encoder: usize,
        /// `num_fsq_scalars`.
        scalars: usize,
    },
}

/// Which of an `FSQAutoEncoder`'s keys [`FieldProblem::FsqKey`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FsqKeyRole {
    /// `encoder_out_keys[0]`: what is quantized.
    #[error("the key the encoder writes")]
    EncoderOut,
    /// `decoder_out_keys[0]`: the model's output.
    #[error("the key the decoder writes")]
    DecoderOut,
    /// `latent_key`: where the codes go (a separate key, which would leave
    /// the raw encoder output beside the codes, is not implemented).
    #[error("encoder_out_keys[0], the key the encoder writes (the codes replace the encoder output)")]
    Latent,
}

/// Why modules do not fit together, or a network computes nothing usable
/// (in [`PolicyError::Graph`](crate::PolicyError::Graph)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GraphProblem {
    /// `normalize_obs` on a module whose operations never run the normalizer.
    #[error("normalize_obs with no Forward in module_operations (the reference raises KeyError 'norm_obs')")]
    NormalizeWithoutForward,
    /// The normalizer and the first Linear disagree about the width.
    #[error("normalizer width {normalizer} differs from the first Linear's input {linear}")]
    NormalizerWidth {
        /// Elements in the normalizer's statistics.
        normalizer: usize,
        /// `in_features` of the first Linear.
        linear: usize,
    },
    /// Normalizer statistics that are not 1-D.
    #[error("normalizer {name} has shape {}; a 1-D one is expected", Dims(shape))]
    NormalizerShape {
        /// The normalizer's state-dict prefix.
        name: String,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// A normalizer without statistics (lazy, never materialized).
    #[error("normalizer {name} has no statistics")]
    NoStatistics {
        /// The normalizer's state-dict prefix.
        name: String,
    },
    /// The actor's mean and its log std have different widths.
    #[error("mu_model writes {mu_width} values per row, logstd has {logstd}")]
    ActionSize {
        /// Width of `mu_model`'s output.
        mu_width: usize,
        /// Elements of `logstd`.
        logstd: usize,
    },
    /// A network with no output key.
    #[error("writes no key")]
    NoOutKey,
    /// A network that did not write the key its output is read from.
    #[error("writes no {key}")]
    Unwritten {
        /// The key.
        key: String,
    },
    /// A Linear run before its weights were packed (a bug in this crate).
    #[error("weights not packed")]
    WeightsNotPacked,
}

/// Why a module operation cannot apply to the tensor it gets (in
/// [`PolicyError::ModuleOp`](crate::PolicyError::ModuleOp)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OpProblem {
    /// `new_order` of the wrong length.
    #[error("{given} dims in new_order for a rank-{rank} tensor")]
    PermuteRank {
        /// Entries in `new_order`.
        given: usize,
        /// The tensor's rank.
        rank: usize,
    },
    /// A dim named twice in `new_order`.
    #[error("dim {dim} repeats in new_order")]
    PermuteRepeat {
        /// The dim (after wrapping negatives).
        dim: usize,
    },
    /// A dim index outside `-rank..rank`.
    #[error("dim {dim} out of range for rank {rank}")]
    DimOutOfRange {
        /// The dim as configured.
        dim: i64,
        /// The rank it indexes.
        rank: usize,
    },
    /// `expand_shape` shorter than the tensor's rank.
    #[error("expand to {target} dims from {rank}")]
    ExpandRank {
        /// Entries in `expand_shape`.
        target: usize,
        /// The tensor's rank.
        rank: usize,
    },
    /// `-1` for a leading dim that `expand` adds (torch refuses it).
    #[error("-1 for a new leading dim")]
    ExpandInferredNewDim,
    /// A negative size other than `-1` in `expand_shape`.
    #[error("size {size}")]
    ExpandNegative {
        /// The size.
        size: i64,
    },
    /// A dim that is neither 1 nor the target size.
    #[error("dim {dim} of size {have} cannot expand to {to}")]
    ExpandSize {
        /// Index in the output shape.
        dim: usize,
        /// Its size now.
        have: usize,
        /// The size asked for.
        to: i64,
    },
    /// Two `-1` in `new_shape`.
    #[error("more than one -1 in new_shape")]
    ReshapeTwoInferred,
    /// A negative size other than `-1` in `new_shape`.
    #[error("invalid size {size} in new_shape")]
    ReshapeNegative {
        /// The size.
        size: i64,
    },
    /// Sizes whose product overflows.
    #[error("new_shape overflows")]
    ReshapeOverflow,
    /// A shape whose element count differs from the input's (torch's message).
    #[error("shape {} is invalid for input of size {numel}", int_list(sizes))]
    ReshapeNumel {
        /// The sizes, with the batch expression evaluated.
        sizes: Vec<i64>,
        /// Elements of the input.
        numel: usize,
    },
    /// The batch-size expression failed at this batch size.
    #[error("\"{expr}\": {problem}")]
    BatchExpr {
        /// The expression.
        expr: String,
        /// What stops it.
        problem: ExprProblem,
    },
}

/// Why a batch-size expression in a reshape does not evaluate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExprProblem {
    /// A literal over `i64`.
    #[error("integer too large")]
    IntegerTooLarge,
    /// `/`, which gives a float in Python.
    #[error("'/' makes a float, which reshape rejects (use //)")]
    FloatDivision,
    /// Something other than ints, `batch_size`, operators and parentheses.
    #[error("cannot evaluate \"{rest}\" (only ints, batch_size, + - * // % and parentheses)")]
    Unsupported {
        /// The text from the first character not understood.
        rest: String,
    },
    /// A result over `i64`.
    #[error("overflow")]
    Overflow,
    /// `//` or `%` by zero.
    #[error("division by zero")]
    DivisionByZero,
    /// The expression stops where an operand is due.
    #[error("unexpected end")]
    UnexpectedEnd,
    /// An opening parenthesis never closed.
    #[error("missing ')'")]
    MissingClose,
    /// A token where another is due (`'*'`, `')'`, `3`).
    #[error("unexpected {token}")]
    Unexpected {
        /// The token, as printed in the message.
        token: String,
    },
}

/// `[-1, 4]`, as Python prints a list of ints.
fn int_list(xs: &[i64]) -> String {
    format!("[{}]", xs.iter().map(i64::to_string).collect::<Vec<_>>().join(", "))
}

/// What is wrong with a transformer's configuration or inputs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AttentionProblem {
    /// `num_heads` must divide `latent_dim` (torch asserts it).
    #[error("num_heads {heads} does not divide latent_dim {d_model}")]
    HeadsDivide {
        /// `d_model`.
        d_model: usize,
        /// `nhead`.
        heads: usize,
    },
    /// `3 * latent_dim` (the stacked q, k, v projection) does not fit in memory sizes.
    #[error("latent_dim {d_model} is too large (3 x it overflows)")]
    TooWide {
        /// `d_model`.
        d_model: usize,
    },
    /// The tokens are not `[B, S, d_model]`.
    #[error("tokens of shape {}, expected [B, S, d_model]", Dims(shape))]
    InputShape {
        /// What was given.
        shape: Vec<usize>,
    },
    /// A token input is not `[B, d]` or `[B, S, d]` with `d` = `latent_dim`.
    #[error("token {key} of shape {}, expected [B, {d}] or [B, S, {d}]", Dims(shape))]
    TokenShape {
        /// The token key.
        key: String,
        /// Its shape.
        shape: Vec<usize>,
        /// `latent_dim`.
        d: usize,
    },
    /// A mask input does not fit its tokens (`[B]`, `[B, 1]`, or `[B, M]` with `M >= S`).
    #[error("mask {key} of shape {}, expected [B], [B, 1] or [B, M >= {tokens}]", Dims(shape))]
    MaskShape {
        /// The mask key.
        key: String,
        /// Its shape.
        shape: Vec<usize>,
        /// How many tokens it masks.
        tokens: usize,
    },
    /// A mask of an older release's `Transformer`, which concatenates its
    /// masks as they are (`[B]` becomes `[B, 1]`): one entry per token.
    #[error(
        "mask {key} of shape {}, expected [B, {tokens}]{}: {release}'s Transformer neither reduces nor broadcasts a mask",
        Dims(shape),
        if *tokens == 1 { " or [B]" } else { "" }
    )]
    MaskNotPerToken {
        /// The mask key.
        key: String,
        /// Its shape.
        shape: Vec<usize>,
        /// How many tokens it masks.
        tokens: usize,
        /// The release (`v3.1`).
        release: &'static str,
    },
    /// The key-padding mask is not a `[B, S]` bool.
    #[error("key-padding mask of shape {} ({dtype}), expected bool [{batch}, {seq}]", Dims(shape))]
    KeyPaddingMask {
        /// What was given.
        shape: Vec<usize>,
        /// Its dtype.
        dtype: &'static str,
        /// The tokens' batch.
        batch: usize,
        /// The tokens' sequence length.
        seq: usize,
    },
    /// The additive mask is not a float `[S, S]`.
    #[error("additive attention mask of shape {} ({dtype}), expected float [{seq}, {seq}]", Dims(shape))]
    AdditiveMask {
        /// What was given.
        shape: Vec<usize>,
        /// Its dtype.
        dtype: &'static str,
        /// The tokens' sequence length.
        seq: usize,
    },
    /// Position by position (a key/value cache) needs a causal mask: one
    /// that forbids every query a later key.
    #[error(
        "the additive mask lets query {query} see the later key {key}: a step-by-step forward needs a causal mask"
    )]
    NotCausal {
        /// The query position.
        query: usize,
        /// The later key it may see.
        key: usize,
    },
    /// A step-by-step forward's input or position does not fit its cache.
    #[error(
        "step input of shape {} at position {position}, expected [{rows}, d_model] and a position under {positions}",
        Dims(shape)
    )]
    StepShape {
        /// What was given.
        shape: Vec<usize>,
        /// The position it would fill.
        position: usize,
        /// The cache's rows.
        rows: usize,
        /// The cache's positions.
        positions: usize,
    },
    /// The key/value cache's size overflows or the row path cannot run
    /// (not float32 on the CPU with packed weights).
    #[error(
        "no step-by-step forward for {rows} rows of {positions} positions here (float32 on the CPU, sizes that fit)"
    )]
    StepCache {
        /// Rows asked for.
        rows: usize,
        /// Positions asked for.
        positions: usize,
    },
}
