//! resolved_configs_inference.pt: the migrated training configs with
//! today's inference overrides. Which keys today's
//! `apply_all_inference_overrides` changes is read off the two recorded
//! templates (training and inference configs of the same experiment):
//! where they differ, the inference template's value wins (a key only it
//! has is added, a key only the training one has is removed).

use pmstate_ckpt::{Dict, Node};

use super::objects::key_text;

/// `migrated` with the differences between `train` and `inference` applied;
/// the keys changed are pushed to `changed`.
pub(crate) fn apply(migrated: Node, train: &Node, inference: &Node, key: &str, changed: &mut Vec<String>) -> Node {
    if train == inference {
        return migrated;
    }
    match (migrated, train, inference) {
        (Node::Object(mut m), Node::Object(t), Node::Object(i)) if t.class_name() == i.class_name() => {
            match (m.state.take(), t.fields(), i.fields()) {
                (Some(Node::Dict(md)), Some(td), Some(id)) => {
                    m.state = Some(Node::Dict(apply_dict(md, td, id, key, changed)));
                    Node::Object(m)
                }
                // a state that is not a dict of fields (a `__slots__`
                // object's tuple, e.g. a FieldPath an override rebinds):
                // the inference value, whole
                (state, _, _) => {
                    m.state = state;
                    replace(Node::Object(m), inference, key, changed)
                }
            }
        }
        (Node::Dict(md), Node::Dict(td), Node::Dict(id)) => Node::Dict(apply_dict(md, td, id, key, changed)),
        (m, _, i) => replace(m, i, key, changed),
    }
}

/// The inference template's value in place of the migrated one.
fn replace(migrated: Node, inference: &Node, key: &str, changed: &mut Vec<String>) -> Node {
    if has_tensor(inference) {
        // a tensor of today's inference file would need its storage: keep the migrated value
        migrated
    } else {
        changed.push(key.to_owned());
        inference.clone()
    }
}

fn apply_dict(m: Dict, t: &Dict, i: &Dict, key: &str, changed: &mut Vec<String>) -> Dict {
    let (kind, entries, state) = m.into_parts();
    let mut out = Vec::with_capacity(entries.len());
    for (k, v) in entries {
        let name = key_text(&k);
        let full = if key.is_empty() { name.clone() } else { format!("{key}.{name}") };
        match (t.get(&name), i.get(&name)) {
            (Some(_), None) => changed.push(full),
            (Some(tv), Some(iv)) => out.push((k, apply(v, tv, iv, &full, changed))),
            _ => out.push((k, v)),
        }
    }
    for (k, iv) in i.entries() {
        let name = key_text(k);
        if t.get(&name).is_none() && !out.iter().any(|(ok, _)| ok == k) && !has_tensor(iv) {
            changed.push(if key.is_empty() { name } else { format!("{key}.{name}") });
            out.push((k.clone(), iv.clone()));
        }
    }
    // keys of a rebuilt dict stay unique: each comes from the migrated dict or is new
    match Dict::from_entries(kind, out) {
        Ok(d) => d.with_state(state),
        Err(_) => Dict::new(kind),
    }
}

fn has_tensor(n: &Node) -> bool {
    let mut found = false;
    n.walk_all(&mut |_, v| {
        found |= matches!(v, Node::Tensor(_));
        !found
    });
    found
}
