//! The deployment pipeline ([`Pipeline`]) as a [`Model`]: its inputs with
//! their whole row shapes (`[4]`, `[4, 29]`) in; `actions`,
//! `joint_pos_targets`, `stiffness_targets`, `damping_targets`
//! `[-1, num_dofs]` out, all from one forward. The forward is
//! row-independent (each observation is computed row by row from that
//! row's inputs, the actor is the policy's, the action function maps each
//! action row alone), so batches are chunked and merged freely.

use std::any::Any;
use std::path::Path;

use candle_core::Device;
use pmstate_policy::served::{
    by_chunks, share, Batch, Datatype, InputSpec, Model, ModelDescription, Named, OutputSpec, RunError, Signature,
    Source,
};
use pmstate_policy::{AllowedGlobal, LoadOptions};

use crate::error::{DeployError, Result};
use crate::pipeline::{Pipeline, OUTPUT_NAMES};
use crate::Contract;

/// The model class a pipeline's [`Signature`] names.
pub const PIPELINE_MODEL: &str = "UnifiedPipeline";

/// A [`Pipeline`] with its signature and its actor's description.
#[derive(Debug)]
pub struct PipelineModel {
    pipeline: Pipeline,
    signature: Signature,
    description: ModelDescription,
}

impl PipelineModel {
    /// Loads the pipeline of a checkpoint and its configs ([`Pipeline::load_with`]).
    pub fn load(checkpoint: &Path, config: Option<&Path>, opts: &LoadOptions) -> Result<Self> {
        PipelineModel::new(Pipeline::load_with(checkpoint, config, opts)?)
    }

    /// `pipeline` as a model.
    pub fn new(pipeline: Pipeline) -> Result<Self> {
        let description = ModelDescription::of(&pipeline.policy().describe()?)?;
        let signature = signature(&pipeline);
        Ok(PipelineModel { pipeline, signature, description })
    }

    /// The pipeline.
    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// The pipeline, for a caller that runs it step by step (the tracker's
    /// control loop: the C ABI, `deploy replay`) after loading it as every
    /// other consumer does.
    pub fn into_pipeline(self) -> Pipeline {
        self.pipeline
    }

    /// Its deployment contract.
    pub fn contract(&self) -> &Contract {
        self.pipeline.contract()
    }
}

fn signature(p: &Pipeline) -> Signature {
    let inputs = p
        .inputs()
        .iter()
        .map(|i| InputSpec {
            row_shape: Some(i.row_shape.clone()),
            ..InputSpec::observation(i.name.clone(), Some(i.row_len()))
        })
        .collect();
    let n = p.dims().num_dofs;
    let outputs = OUTPUT_NAMES
        .iter()
        .map(|&name| OutputSpec { name, shape: vec![-1, n as i64], source: Source::Pipeline, datatype: Datatype::Fp32 })
        .collect();
    Signature {
        inputs,
        ignored: Vec::new(),
        groups: Vec::new(),
        outputs,
        action_size: n,
        model: PIPELINE_MODEL,
        logits_per_row: None,
    }
}

impl Model for PipelineModel {
    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn description(&self) -> &ModelDescription {
        &self.description
    }

    fn run(&self, batch: &Batch<'_>) -> std::result::Result<Vec<Named>, RunError> {
        let failed = |e: DeployError| RunError::Family { model: PIPELINE_MODEL, source: Box::new(e) };
        let out = by_chunks(batch.inputs, batch.chunk_rows, &[], |o| {
            let out = self.pipeline.forward(o).map_err(failed)?;
            Ok::<Named, RunError>(out.named().into_iter().map(|(k, t)| (k, t.clone())).collect())
        })?;
        let idx: Vec<usize> = (0..batch.segments.len()).collect();
        let mut outs = vec![Vec::new(); idx.len()];
        share(batch, &idx, batch.rows(), out, &mut outs, |_| Source::Pipeline)?;
        Ok(outs)
    }

    fn device(&self) -> &Device {
        self.pipeline.policy().device()
    }

    fn config_path(&self) -> Option<&str> {
        self.pipeline.policy().config_path()
    }

    fn allowed_globals(&self) -> &[AllowedGlobal] {
        self.pipeline.policy().allowed_globals()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
