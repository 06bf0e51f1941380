//! The CUDA forward against the CPU one on the recorded policies (within
//! twice the float32 bound: different kernels, same error model). Skips,
//! saying why, when built without `--features cuda` or run without a GPU.

#[test]
fn cuda_forward_matches_cpu() {
    #[cfg(not(feature = "cuda"))]
    eprintln!("skipped: built without the `cuda` feature");
    #[cfg(feature = "cuda")]
    on_gpu();
}

#[cfg(feature = "cuda")]
fn on_gpu() {
    use candle_core::Device;
    use pmstate_policy::Policy;
    let gpu = match Device::new_cuda(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("skipped: no CUDA device ({e})");
            return;
        }
    };
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy");
    for v in ["smpl_tracker", "g1_amp_deploy", "layernorm_activations", "module_ops_amp"] {
        let d = root.join(v);
        let cpu = Policy::load(d.join("last.ckpt"), None, &Device::Cpu).unwrap();
        let cuda = Policy::load(d.join("last.ckpt"), None, &gpu).unwrap();
        let obs = candle_core::safetensors::load(d.join("obs.safetensors"), &Device::Cpu).unwrap();
        let r = cpu.reference(&obs).unwrap();
        let out = cuda.forward(&obs).unwrap();
        for (t, key) in
            [(&out.mean_action, cpu.actor().mu_key.clone()), (&out.value, cpu.critic().out_key().to_owned())]
        {
            let got = t.to_device(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert!(pmstate_policy::bound::within(&got, &r.values[&key], 2.0).is_none(), "{v}: {key} on CUDA");
        }
        if cuda.amp().is_some() {
            let disc = cuda.discriminate(&obs).unwrap();
            assert_eq!(disc.disc_logits.dims()[0], 8, "{v}");
        }
    }
}
