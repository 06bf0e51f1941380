//! v2.3's Hydra `config.yaml` on arbitrary text: the whole file resolved
//! (`pmstate_ckpt::hydra::resolve_yaml`), the model's subtree resolved alone
//! (`resolve_yaml_at`, what `policy describe|run` and `serve` read) and read
//! as a v2.3 model config (`pmstate_policy::v23::V23Spec::read`). Each must
//! return a value or an error, never panic, hang or exhaust memory (the
//! resolver's depth, expression and evaluation caps bound the work); and
//! where the whole file resolves, its subtree is what the lazy resolution
//! of that subtree alone gives.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pmstate_ckpt::hydra::{resolve_yaml, resolve_yaml_at};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let whole = resolve_yaml(text, "fuzz.yaml");
    let model = resolve_yaml_at(text, "fuzz.yaml", "agent.config.model");
    if let Ok(m) = &model {
        let _ = pmstate_policy::v23::V23Spec::read(m);
    }
    if let (Ok(w), Ok(m)) = (&whole, &model) {
        assert_eq!(w.pointer("/agent/config/model"), Some(m), "the subtree resolves as it does in the whole file");
    }
});
