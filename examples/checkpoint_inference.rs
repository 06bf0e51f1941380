//! A candle inference server's start-up, straight from a ProtoMotions
//! checkpoint: the actor's weights through a `VarBuilder`, its observation
//! normalizer through `pmstate-norm`, then one forward pass.
//!
//! ```sh
//! cargo run --example checkpoint_inference -- testdata/checkpoints/ppo_full.ckpt
//! ```

use std::sync::Arc;

use candle_core::{DType, Device, Module, Tensor};
use pmstate::ckpt::{var_builder, Checkpoint};
use pmstate::NormConfig;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).unwrap_or_else(|| "testdata/checkpoints/ppo_full.ckpt".into());
    let dev = Device::Cpu;
    let ckpt = Arc::new(Checkpoint::open(&path)?);

    // The normalizer's config is not in the checkpoint: give the one the policy was trained with.
    let config = NormConfig { clamp_value: Some(5.0), ..NormConfig::default() };
    let obs_norm = "model._actor.mu.input_models.obs.running_obs_norm";
    let normalizer = ckpt.load_normalizer(obs_norm, config, &dev)?;
    let obs_dim = normalizer.shape().ok_or("the observation normalizer never ran")?[0];

    // The actor MLP of the fixture: Linear, LayerNorm, ReLU, Linear, ReLU, Linear.
    let vb = var_builder(ckpt.clone(), "model", DType::F32, &dev)?.pp("_actor.mu.mlp");
    let hidden = ckpt.tensor("model._actor.mu.mlp.0.weight")?.shape[0];
    let actions = ckpt.tensor("model._actor.mu.mlp.5.weight")?.shape[0];
    let l0 = candle_nn::linear(obs_dim, hidden, vb.pp("0"))?;
    let ln = candle_nn::layer_norm(hidden, 1e-5, vb.pp("1"))?;
    let l3 = candle_nn::linear(hidden, hidden, vb.pp("3"))?;
    let l5 = candle_nn::linear(hidden, actions, vb.pp("5"))?;

    let obs = Tensor::randn(0f32, 1., (4, obs_dim), &dev)?;
    let z = normalizer.apply(&obs, pmstate::Direction::Normalize)?;
    let h = ln.forward(&l0.forward(&z)?)?.relu()?;
    let mu = l5.forward(&l3.forward(&h)?.relu()?)?;
    println!("{path}: obs {obs_dim} -> actions {actions}; normalizer count {:?}", normalizer.count());
    println!("mu = {mu}");
    Ok(())
}
