//! Writing today's objects: the old release's values laid onto today's
//! template objects, field by field, so every object carries exactly the
//! fields today's class has (today's code reads attributes, and a pickled
//! dataclass restores its `__dict__` as saved), and the tree put back
//! together as one torch archive with both sides' tensors.

use std::collections::HashMap;

use pmstate_ckpt::{Checkpoint, Dict, Node, Object, Storage};

use super::read::class_of;
use super::report::{Action, Report};
use super::MigrateError;

/// Storage keys of tensors copied from the old configs carry this prefix
/// until [`assemble`] renumbers every storage.
const OLD: &str = "old:";
/// Old tensors' object identities are moved out of the template's range.
const OLD_OBJECT: u64 = 1 << 62;

/// The generic overlay and what it needs to know.
pub(crate) struct Overlay<'a> {
    /// Where every decision goes.
    pub report: &'a mut Report,
    /// (today's class, today's field, old field).
    pub renames: &'a [(&'static str, &'static str, &'static str)],
    /// Today's keys left as the template has them (set by rules afterwards).
    pub rule_keys: &'a [&'static str],
}

/// `parent.child`.
pub(crate) fn join(parent: &str, child: &str) -> String {
    if parent.is_empty() {
        child.to_owned()
    } else {
        format!("{parent}.{child}")
    }
}

/// A dict key as text.
pub(crate) fn key_text(k: &Node) -> String {
    match k {
        Node::Str(s) => s.clone(),
        Node::Int(i) => i.to_string(),
        other => other.kind().to_owned(),
    }
}

/// An old value, its tensors marked as the old file's.
pub(crate) fn import_old(old: &Node) -> Node {
    map_tensors(old.clone(), &mut |mut t| {
        t.storage = format!("{OLD}{}", t.storage);
        t.object = t.object.map(|o| o | OLD_OBJECT);
        t
    })
}

impl Overlay<'_> {
    /// `old` laid onto `today` at `key`.
    pub(crate) fn overlay(&mut self, today: &Node, old: &Node, key: &str) -> Result<Node, MigrateError> {
        if self.rule_keys.contains(&key) {
            return Ok(today.clone());
        }
        match (today, old) {
            (Node::Object(t), Node::Object(o)) => self.object(t, o, key),
            (Node::Dict(t), Node::Dict(o)) => self.dict(t, o, key),
            (Node::List(t), Node::List(o)) if matches!(t.first(), Some(Node::Object(_))) => {
                let mut out = Vec::with_capacity(o.len());
                for (i, ov) in o.iter().enumerate() {
                    let schema = &t[i.min(t.len() - 1)];
                    out.push(self.overlay(schema, ov, &format!("{key}.{i}"))?);
                }
                Ok(Node::List(out))
            }
            (Node::Object(t), Node::None) => {
                // an Optional today may be None; a required object is kept
                self.report.push(key, Action::KeptToday).from("None").to(t.class_name().unwrap_or_default()).note(
                    "the old release left it unset; today's template value kept (None may not be valid for today's field)",
                );
                Ok(today.clone())
            }
            (Node::Object(t), o) => {
                self.report
                    .push(key, Action::KeptToday)
                    .from(o.kind())
                    .to(t.class_name().unwrap_or_default())
                    .note("the old value is not an object of today's class");
                Ok(today.clone())
            }
            _ => Ok(import_old(old)),
        }
    }

    fn object(&mut self, t: &Object, o: &Object, key: &str) -> Result<Node, MigrateError> {
        let (tc, oc) = (t.class_name().unwrap_or_default(), o.class_name().unwrap_or_default());
        if tc != oc {
            self.report
                .push(key, Action::KeptToday)
                .from(oc)
                .to(tc)
                .note("today's class differs: today's template object kept");
            return Ok(Node::Object(Box::new(t.clone())));
        }
        let (Some(tf), Some(of)) = (t.fields(), o.fields()) else {
            // an enum member or another reduce of the same class: the old value
            return Ok(import_old(&Node::Object(Box::new(o.clone()))));
        };
        let mut used = Vec::new();
        let mut entries = Vec::with_capacity(tf.len());
        for (k, tv) in tf.entries() {
            let name = key_text(k);
            let full = join(key, &name);
            let old_name =
                self.renames.iter().find(|(c, f, _)| *c == tc && *f == name).map(|(_, _, old)| *old).unwrap_or(&name);
            let v = match of.get(old_name) {
                Some(ov) => {
                    used.push(old_name.to_owned());
                    if old_name != name {
                        self.report.push(full.clone(), Action::Renamed).from(join(key, old_name));
                    }
                    self.overlay(tv, ov, &full)?
                }
                None => {
                    if !self.rule_keys.contains(&full.as_str()) {
                        self.report.push(full.clone(), Action::Defaulted).to(short(tv));
                    }
                    tv.clone()
                }
            };
            entries.push((k.clone(), v));
        }
        for (k, _) in of.entries() {
            let name = key_text(k);
            if !used.contains(&name) {
                self.report.push(join(key, &name), Action::Dropped).note(format!("today's {tc} has no such field"));
            }
        }
        let dict = rebuild(tf, entries, key)?;
        let mut obj = t.clone();
        obj.state = Some(Node::Dict(dict));
        Ok(Node::Object(Box::new(obj)))
    }

    fn dict(&mut self, t: &Dict, o: &Dict, key: &str) -> Result<Node, MigrateError> {
        // a dict of objects (control_info, component tables) takes the old
        // keys, each laid onto today's entry of that key or, failing that,
        // onto today's first entry (the schema of its values)
        let schema = t.entries().first().map(|(_, v)| v).filter(|v| matches!(v, Node::Object(_)));
        let mut entries = Vec::with_capacity(o.len());
        for (k, ov) in o.entries() {
            let full = join(key, &key_text(k));
            let tv = t.entries().iter().find(|(tk, _)| tk == k).map(|(_, v)| v).or(schema);
            let v = match tv {
                Some(tv) => self.overlay(tv, ov, &full)?,
                None => import_old(ov),
            };
            entries.push((k.clone(), v));
        }
        Ok(Node::Dict(rebuild(t, entries, key)?))
    }
}

/// A dict of today's kind and state with new entries.
pub(crate) fn rebuild(like: &Dict, entries: Vec<(Node, Node)>, key: &str) -> Result<Dict, MigrateError> {
    Dict::from_entries(like.kind(), entries).map(|d| d.with_state(like.state().cloned())).map_err(|_| {
        MigrateError::Malformed {
            file: "(migrated configs)".into(),
            key: key.to_owned(),
            expected: "unique keys",
            found: "a repeated key".into(),
        }
    })
}

/// A short rendering of a value for the report.
pub(crate) fn short(n: &Node) -> String {
    match n {
        Node::None => "None".into(),
        Node::Bool(b) => if *b { "True" } else { "False" }.into(),
        Node::Int(i) => i.to_string(),
        Node::Float(f) => f.to_string(),
        Node::Str(s) if s.len() <= 80 => serde_json::to_string(s).unwrap_or_else(|_| s.clone()),
        Node::Global { module, name } => format!("{module}.{name}"),
        other => class_of(other).unwrap_or_else(|| other.kind().to_owned()),
    }
}

/// Every tensor of a tree, rewritten by `f`.
pub(crate) fn map_tensors(n: Node, f: &mut dyn FnMut(pmstate_ckpt::TensorRef) -> pmstate_ckpt::TensorRef) -> Node {
    match n {
        Node::Tensor(t) => Node::Tensor(Box::new(f(*t))),
        Node::List(v) => Node::List(v.into_iter().map(|x| map_tensors(x, f)).collect()),
        Node::Tuple(v) => Node::Tuple(v.into_iter().map(|x| map_tensors(x, f)).collect()),
        Node::Set(v) => Node::Set(v.into_iter().map(|x| map_tensors(x, f)).collect()),
        Node::Dict(d) => {
            let (kind, entries, state) = d.into_parts();
            let entries = entries.into_iter().map(|(k, v)| (map_tensors(k, f), map_tensors(v, f))).collect();
            // keys are unchanged by a tensor rewrite, so they stay unique
            match Dict::from_entries(kind, entries) {
                Ok(d) => Node::Dict(d.with_state(state.map(|s| map_tensors(s, f)))),
                Err(_) => Node::None,
            }
        }
        Node::Object(o) => {
            let o = *o;
            Node::Object(Box::new(Object {
                construct: o.construct,
                callable: map_tensors(o.callable, f),
                args: map_tensors(o.args, f),
                kwargs: o.kwargs.map(|k| map_tensors(k, f)),
                state: o.state.map(|s| map_tensors(s, f)),
                setitems: o.setitems.into_iter().map(|(k, v)| (map_tensors(k, f), map_tensors(v, f))).collect(),
                appends: o.appends.into_iter().map(|x| map_tensors(x, f)).collect(),
            }))
        }
        other => other,
    }
}

/// The migrated tree as one archive: storages of the template and of the
/// old file (those marked by [`import_old`]), renumbered 0.. in order of
/// first use so the output does not depend on hash order.
pub(crate) fn assemble(root: Node, today: &Checkpoint, old: &Checkpoint) -> Result<Checkpoint, MigrateError> {
    let mut renumber: HashMap<String, String> = HashMap::new();
    let mut order: Vec<String> = Vec::new();
    let root = map_tensors(root, &mut |mut t| {
        let next = renumber.len().to_string();
        let new = renumber.entry(t.storage.clone()).or_insert_with(|| {
            order.push(t.storage.clone());
            next
        });
        t.storage = new.clone();
        t
    });
    let mut storages: HashMap<String, Storage> = HashMap::new();
    for src in order {
        let storage = match src.strip_prefix(OLD) {
            Some(k) => old.storages().get(k),
            None => today.storages().get(&src),
        };
        let storage = storage.ok_or_else(|| MigrateError::Malformed {
            file: if src.starts_with(OLD) { old.path_str() } else { today.path_str() }.to_owned(),
            key: src.clone(),
            expected: "a storage of the file",
            found: "none".into(),
        })?;
        let key = renumber.get(&src).cloned().unwrap_or_default();
        storages.insert(key, storage.clone());
    }
    Ok(Checkpoint::from_parts(root, storages)?)
}
