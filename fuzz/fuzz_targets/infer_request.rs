//! The server's request decoding (`pmstate_serve::decode::decode`: the JSON
//! request, the binary tensor extension's split, shapes, datatypes,
//! parameters, outputs) on arbitrary bytes, against three interfaces that
//! cover what served models declare: a policy with an AMP discriminator
//! (widths the checkpoint leaves open, width groups, critic-only inputs), a
//! deployment pipeline (whole row shapes) and a GPC prior (an optional
//! INT64 input with a value range, logits bounding the rows). It must
//! return a request or an error, never panic, hang or exhaust memory; what
//! it accepts must be consistent: every input `rows x width` values, rows
//! within the bound, outputs the interface's, and the values within the
//! memory bound `decode` documents (under 7 times the body).
#![no_main]

use libfuzzer_sys::fuzz_target;
use pmstate_serve::decode::{decode, Expect, Values};
use pmstate_serve::model::{Datatype, InputSpec, Interface, OutputSpec, Source};
use pmstate_serve::options::NonFinite;

fn out(name: &'static str, shape: Vec<i64>, source: Source, datatype: Datatype) -> OutputSpec {
    OutputSpec { name, shape, source, datatype }
}

/// A PPO/AMP tracker: `obs` fixed at 4, `hist` open (its group with `obs`
/// sums to 10), `priv` for the critic only, `disc_obs` for the discriminator.
fn policy() -> Interface {
    let priv_obs = InputSpec { actor: false, ..InputSpec::observation("priv".into(), Some(2)) };
    let disc = InputSpec {
        actor_critic: false,
        actor: false,
        discriminator: true,
        ..InputSpec::observation("disc_obs".into(), Some(3))
    };
    Interface {
        inputs: vec![
            InputSpec::observation("obs".into(), Some(4)),
            InputSpec::observation("hist".into(), None),
            priv_obs,
            disc,
        ],
        ignored: vec!["unused".into()],
        groups: vec![("actor.mu".into(), vec!["obs".into(), "hist".into()], 10)],
        outputs: vec![
            out("mean_action", vec![-1, 2], Source::Actor, Datatype::Fp32),
            out("value", vec![-1, 1], Source::Critic, Datatype::Fp32),
            out("std", vec![2], Source::Actor, Datatype::Fp32),
            out("action", vec![-1, 2], Source::Sample, Datatype::Fp32),
            out("neglogp", vec![-1], Source::Sample, Datatype::Fp32),
            out("disc_logits", vec![-1, 1], Source::Discriminator, Datatype::Fp32),
        ],
        action_size: 2,
        model: "AMPModel",
        logits_per_row: None,
    }
}

/// A deployment pipeline: inputs with whole row shapes.
fn pipeline() -> Interface {
    let input = |name: &str, shape: Vec<usize>| InputSpec {
        row_shape: Some(shape.clone()),
        ..InputSpec::observation(name.into(), Some(shape.iter().product()))
    };
    Interface {
        inputs: vec![input("root_quat", vec![4]), input("joint_pos", vec![3, 2])],
        ignored: Vec::new(),
        groups: Vec::new(),
        outputs: vec![out("pd_targets", vec![-1, 6], Source::Pipeline, Datatype::Fp32)],
        action_size: 6,
        model: "Pipeline",
        logits_per_row: None,
    }
}

/// A GPC prior: one observation and the optional INT64 tokens in [0, 9).
fn prior() -> Interface {
    Interface {
        inputs: vec![
            InputSpec::observation("context".into(), Some(5)),
            InputSpec::optional("prior_tokens".into(), 3, Datatype::Int64, Some(9)),
        ],
        ignored: Vec::new(),
        groups: Vec::new(),
        outputs: vec![
            out("logits", vec![-1, 3, 9], Source::Actor, Datatype::Fp32),
            out("mean_action", vec![-1, 2], Source::Actor, Datatype::Fp32),
            out("prior_tokens", vec![-1, 3], Source::Sample, Datatype::Int64),
        ],
        action_size: 2,
        model: "DiscreteAutoregressiveLatentPriorModel",
        logits_per_row: Some(27),
    }
}

fuzz_target!(|data: &[u8]| {
    // byte 0: the interface (bits 0-1), the NaN policy (bit 2), whether the
    // binary extension's header length is given (bit 3, as bytes 1-2)
    let Some((&mode, rest)) = data.split_first() else { return };
    let (header_len, body) = if mode & 8 != 0 {
        let Some((len, body)) = rest.split_first_chunk::<2>() else { return };
        (Some(usize::from(u16::from_le_bytes(*len))), body)
    } else {
        (None, rest)
    };
    let iface = match mode & 3 {
        0 => policy(),
        1 => pipeline(),
        _ => prior(),
    };
    let non_finite = if mode & 4 != 0 { NonFinite::Reject } else { NonFinite::Pass };
    let max_rows = iface.max_rows(64);
    let expect = Expect { iface: &iface, non_finite, max_rows };
    let Ok(d) = decode(body, header_len, &expect) else { return };
    assert!(d.rows <= max_rows, "{} rows over the bound {max_rows}", d.rows);
    let mut bytes = 0usize;
    for (name, width, values) in &d.inputs {
        let spec = iface.input(name).expect("a decoded input is the interface's");
        if let Some(w) = spec.width {
            assert_eq!(*width, w, "{name}: width");
        }
        assert_eq!(values.len(), d.rows * width, "{name}: values");
        assert_eq!(values.datatype(), spec.datatype, "{name}: datatype");
        if let (Values::I64(v), Some(below)) = (values, spec.int_below) {
            assert!(v.iter().all(|&t| t >= 0 && (t as u64) < below as u64), "{name}: a value out of range");
        }
        if non_finite == NonFinite::Reject {
            assert!(values.f32s().iter().all(|v| v.is_finite()), "{name}: a non-finite value under Reject");
        }
        bytes += values.len() * spec.datatype.size();
    }
    assert!(bytes <= 7 * body.len().max(1), "{bytes} bytes of values from a {}-byte body", body.len());
    for o in &d.outputs {
        assert!(iface.output(o.name).is_some(), "output {} is not the interface's", o.name);
    }
});
