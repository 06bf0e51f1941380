//! The CUDA forward against the float64 reference on the recorded policies
//! (within twice the float32 bound, as torch is: different kernels, same
//! error model), element by element for the mean action, the value, every
//! normalizer output (`norm_obs` included) and, for AMP, the
//! discriminator's logits, reward and value, and an FSQ actor's codes
//! wherever their rounding is certain. Skips, saying why, when built
//! without `--features cuda` or run without a GPU.

#[test]
fn cuda_forward_matches_cpu() {
    #[cfg(not(feature = "cuda"))]
    eprintln!("skipped: built without the `cuda` feature");
    #[cfg(feature = "cuda")]
    on_gpu();
}

#[cfg(feature = "cuda")]
fn on_gpu() {
    use candle_core::{Device, Tensor};
    use pmstate_policy::bound::{within, Bounded, Reference, U};
    use pmstate_policy::Policy;

    let gpu = match Device::new_cuda(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("skipped: no CUDA device ({e})");
            return;
        }
    };
    let host = |t: &Tensor| t.to_device(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let check = |v: &str, what: &str, t: &Tensor, r: &Bounded| {
        let got = host(t);
        assert_eq!(got.len(), r.value.len(), "{v}: {what}: size");
        if let Some((i, d, b)) = within(&got, r, 2.0) {
            panic!(
                "{v}: {what}[{i}] = {} on CUDA is {d:e} from the reference {}, twice the bound {b:e}",
                got[i], r.value[i]
            );
        }
    };
    let normalized = |v: &str, r: &Reference, outs: &[(String, Tensor)]| {
        assert!(!outs.is_empty(), "{v}: no normalizer output");
        for (path, t) in outs {
            let want = &r.normalized.iter().find(|(p, _)| p == path).unwrap_or_else(|| panic!("{v}: {path}")).1;
            check(v, &format!("normalizer {path}"), t, want);
        }
    };
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy");
    for v in ["smpl_tracker", "g1_amp_deploy", "layernorm_activations", "module_ops_amp", "soma_fsq_amp"] {
        let d = root.join(v);
        let cpu = Policy::load(d.join("last.ckpt"), None, &Device::Cpu).unwrap();
        let cuda = Policy::load(d.join("last.ckpt"), None, &gpu).unwrap();
        let obs = candle_core::safetensors::load(d.join("obs.safetensors"), &Device::Cpu).unwrap();
        let r = cpu.reference(&obs).unwrap();
        let out = cuda.forward(&obs).unwrap();
        check(v, "mean_action", &out.mean_action, &r.values[&cpu.actor().mu_key]);
        check(v, "value", &out.value, &r.values[cpu.critic().out_key()]);
        normalized(v, &r, &out.normalized);
        let norm_obs = out.norm_obs.as_ref().expect("the actor normalizes");
        assert_eq!(host(norm_obs), host(&out.normalized[0].1), "{v}: norm_obs is the actor's first normalizer output");
        // FSQ codes: exactly the reference's wherever the rounding is certain
        if let Some(stage) = r.fsq.first() {
            let codes = host(out.latent_codes.as_ref().expect("an FSQ actor has codes"));
            assert_eq!(codes.len(), stage.codes.value.len(), "{v}: latent_codes size");
            for (i, ((c, want), bound)) in codes.iter().zip(&stage.codes.value).zip(&stage.codes.bound).enumerate() {
                if *bound == 0.0 {
                    assert_eq!(f64::from(*c), *want, "{v}: latent_codes[{i}] on CUDA");
                }
            }
        }
        // exp of the same float32 logstd: within one ulp of the CPU's
        for (g, w) in host(&out.std).iter().zip(host(&cpu.forward(&obs).unwrap().std)) {
            assert!((g - w).abs() <= w.abs() * f32::EPSILON, "{v}: std {g} on CUDA vs {w} on CPU");
        }
        if let Some(a) = cpu.amp() {
            let disc = cuda.discriminate(&obs).unwrap();
            let logits = &r.values[a.discriminator.out_key()];
            check(v, "disc_logits", &disc.disc_logits, logits);
            check(v, "disc_value", &disc.disc_value, &r.values[a.disc_critic.out_key()]);
            normalized(v, &r, &disc.normalized);
            // the reward is 1-Lipschitz in the logits, plus a few ulps of its own
            let want = host(&cpu.discriminate(&obs).unwrap().disc_reward);
            for (i, ((g, w), e)) in host(&disc.disc_reward).iter().zip(&want).zip(&logits.bound).enumerate() {
                let tol = 3.0 * e + 8.0 * U * (f64::from(w.abs()) + 1.0);
                assert!(f64::from((g - w).abs()) <= tol, "{v}: disc_reward[{i}] {g} on CUDA vs {w} on CPU");
            }
        }
    }
}
