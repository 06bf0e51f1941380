//! Editing recorded resolved configs in tests: the node at a dotted path.

use pmstate_ckpt::Node;

/// The node at dotted `path` (dict keys and object fields); panics naming
/// the part that is missing.
pub fn at<'a>(node: &'a mut Node, path: &str) -> &'a mut Node {
    let mut cur = node;
    for part in path.split('.') {
        let dict = match cur {
            Node::Object(o) => o.state.as_mut().and_then(Node::as_dict_mut),
            other => other.as_dict_mut(),
        };
        cur = dict.and_then(|d| d.get_mut(part)).unwrap_or_else(|| panic!("no {part} in {path}"));
    }
    cur
}

/// Copies `checkpoint` into `dir` as `last.ckpt` and writes next to it, as
/// `resolved_configs_inference.pt` (where loading finds it), the configs
/// `configs` with `edit` applied. Returns the copied checkpoint's path.
#[allow(dead_code)] // not every test binary that edits nodes writes whole files
pub fn write_edited(
    checkpoint: &std::path::Path,
    configs: &std::path::Path,
    dir: &std::path::Path,
    edit: impl FnOnce(&mut Node),
) -> std::path::PathBuf {
    use pmstate_ckpt::{Checkpoint, UnsafeGlobals, WriteOptions};
    let (mut root, storages) = Checkpoint::open(configs).expect("configs").into_parts();
    edit(&mut root);
    let ckpt = dir.join("last.ckpt");
    std::fs::copy(checkpoint, &ckpt).expect("copy the checkpoint");
    // the configs hold pickled globals (the observation functions): written as read
    let opts = WriteOptions { unsafe_globals: UnsafeGlobals::Allow, ..Default::default() };
    let edited = Checkpoint::from_parts(root, storages).expect("parts");
    pmstate_ckpt::save_torch(&edited, dir.join("resolved_configs_inference.pt"), &opts).expect("save the configs");
    ckpt
}

/// The g1 tracker (testdata/policy/g1_amp_deploy) copied into `dir` with one
/// `mimic.future_steps` more in its configs than its actor was trained on:
/// the checkpoint's path, and the widths `Pipeline::load`'s refusal names
/// (the configs' observations, the actor's input), which differ.
#[allow(dead_code)] // not every test binary that edits nodes needs it
pub fn g1_with_one_future_step_more(dir: &std::path::Path) -> (std::path::PathBuf, usize, usize) {
    use pmstate_deploy::{DeployError, Pipeline};
    let g1 = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/policy/g1_amp_deploy");
    let steps = Pipeline::load(g1.join("last.ckpt"), None).expect("load").contract().motion.future_step_indices.len();
    let ckpt = write_edited(&g1.join("last.ckpt"), &g1.join("resolved_configs_inference.pt"), dir, |r| {
        *at(r, "env.control_components.mimic.future_steps") = Node::Int(steps as i64 + 1)
    });
    match Pipeline::load(&ckpt, None) {
        Err(DeployError::Width { observations, actor, .. }) => {
            assert_ne!(observations, actor);
            (ckpt, observations, actor)
        }
        Err(other) => panic!("the edited configs: {other}"),
        Ok(_) => panic!("the edited configs loaded"),
    }
}
