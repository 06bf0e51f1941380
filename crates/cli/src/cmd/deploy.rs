//! `pmstate deploy contract|run`: a tracker's deployment pipeline (sensors
//! and reference motion in, PD targets out), as ProtoMotions' exported
//! ONNX pipeline computes it, straight from the checkpoint.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use candle_core::Tensor;
use pmstate_deploy::{DeployError, Pipeline};
use pmstate_norm::Dims;
use serde::Serialize;

use crate::args::OutputFormat;
use crate::cmd::policy::obs::{read_tensors, Schema};
use crate::cmd::policy::run::write_atomic;
use crate::cmd::policy::PolicyFiles;
use crate::{output, CliError, Global};

/// `pmstate deploy contract|run`
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: DeployCommand,
}

#[derive(clap::Subcommand, Debug)]
enum DeployCommand {
    /// Print the deployment contract as YAML (the fields and values of the
    /// unified_pipeline.yaml ProtoMotions' exporter writes, with its
    /// corrections listed in docs/deploy.md), or as JSON with --json.
    Contract(ContractArgs),
    /// Run the pipeline on a file of inputs named as the exported graph's
    /// inputs (current_anchor_rot, mimic_future_dof_pos, ...; `deploy
    /// contract` lists them); OUT gets actions, joint_pos_targets,
    /// stiffness_targets, damping_targets.
    Run(RunArgs),
}

/// `pmstate deploy contract [--config CONFIGS] CHECKPOINT`
#[derive(clap::Args, Debug)]
pub struct ContractArgs {
    #[command(flatten)]
    files: PolicyFiles,
}

/// `pmstate deploy run [--config CONFIGS] CHECKPOINT --inputs IN --out OUT`
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    files: PolicyFiles,
    /// The inputs: a safetensors file of one f32 [B, ...] tensor per pipeline input.
    #[arg(long)]
    inputs: PathBuf,
    /// Where to write the outputs (safetensors).
    #[arg(long)]
    out: PathBuf,
}

/// The pipeline's inputs, each f32 of its row shape.
struct PipelineSchema<'a> {
    pipeline: &'a Pipeline,
}

impl Schema for PipelineSchema<'_> {
    fn flag(&self) -> &'static str {
        "--inputs"
    }

    fn check_entry(&self, key: &str, dtype: &str, dims: &[u64]) -> Result<(), CliError> {
        let names = || self.pipeline.inputs().iter().map(|i| i.name.clone()).collect::<Vec<_>>();
        let Some(input) = self.pipeline.inputs().iter().find(|i| i.name == key) else {
            return Err(DeployError::UnknownInput { name: key.to_owned(), names: names() }.into());
        };
        let row_ok = dims.len() == input.row_shape.len() + 1
            && dims[1..].iter().zip(&input.row_shape).all(|(&d, &w)| usize::try_from(d).is_ok_and(|d| d == w));
        if dtype != "F32" || !row_ok {
            let expected =
                std::iter::once("B".to_owned()).chain(input.row_shape.iter().map(usize::to_string)).collect();
            let dims: Vec<String> = dims.iter().map(u64::to_string).collect();
            return Err(DeployError::InputShape {
                name: key.to_owned(),
                expected,
                found: format!("{} [{}]", dtype.to_lowercase(), dims.join(", ")),
            }
            .into());
        }
        Ok(())
    }
}

#[derive(Serialize)]
struct RunReport {
    out: String,
    tensors: Vec<(String, Vec<usize>)>,
}

/// Runs `pmstate deploy ...`.
pub fn run(a: Args, g: Global) -> Result<ExitCode, CliError> {
    match a.command {
        DeployCommand::Contract(c) => {
            let p = c.files.load_pipeline()?;
            match g.format() {
                OutputFormat::Json => output::json_line(p.contract())?,
                OutputFormat::Text => {
                    for l in p.contract().to_yaml().lines() {
                        output::line(l);
                    }
                }
            }
        }
        DeployCommand::Run(r) => {
            let p = r.files.load_pipeline()?;
            let inputs = read_tensors(&r.inputs, &PipelineSchema { pipeline: &p })?;
            let out = p.forward(&inputs)?;
            let map: HashMap<String, Tensor> = out
                .named()
                .iter()
                .map(|(k, t)| Ok(((*k).to_owned(), t.contiguous()?)))
                .collect::<Result<_, CliError>>()?;
            write_atomic(&r.out, &map)?;
            let report = RunReport {
                out: r.out.display().to_string(),
                tensors: out.named().iter().map(|(k, t)| ((*k).to_owned(), t.dims().to_vec())).collect(),
            };
            match g.format() {
                OutputFormat::Json => output::json_line(&report)?,
                OutputFormat::Text => {
                    let parts: Vec<String> = report.tensors.iter().map(|(k, s)| format!("{k} {}", Dims(s))).collect();
                    output::line(format!("wrote {}: {}", report.out, parts.join(", ")));
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
