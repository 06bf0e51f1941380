//! Run a ProtoMotions policy from its checkpoint: the model is rebuilt from
//! the resolved configs saved next to it (read without Python), weights and
//! normalizers come from the checkpoint, and one eval-mode forward runs.
//!
//! ```sh
//! cargo run --release --example checkpoint_inference -- testdata/policy/smpl_tracker/last.ckpt testdata/policy/smpl_tracker/obs.safetensors
//! ```

use candle_core::Device;
use pmstate::policy::Policy;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let ckpt = args.next().unwrap_or_else(|| "testdata/policy/smpl_tracker/last.ckpt".into());
    let obs = args.next().unwrap_or_else(|| "testdata/policy/smpl_tracker/obs.safetensors".into());
    let policy = Policy::load(&ckpt, None, &Device::Cpu)?; // finds resolved_configs_inference.pt
    let obs = candle_core::safetensors::load(&obs, &Device::Cpu)?; // one [B, D] f32 tensor per in_key
    let out = policy.forward(&obs)?;
    println!("{ckpt}: {} actions from {}", policy.action_size(), policy.in_keys().join(", "));
    let rows = out.mean_action.dims()[0];
    println!("{rows} rows: mean_action [{rows}, {}], value [{rows}, 1]", policy.action_size());
    println!("first row: {}", out.mean_action.get(0)?);
    Ok(())
}
