//! Paths through the tree, and the walks that visit it.

use std::fmt;

use super::{Node, Object};

/// A key of a dict in the tree, as one component of a path.
#[derive(Debug, Clone, PartialEq)]
pub enum Key<'a> {
    /// A string key (state dict names, `"model"`).
    Str(&'a str),
    /// An integer key (optimizer `state` entries) or a list index.
    Int(i64),
    /// Any other key (a tuple, a float, an opaque object), shown in words.
    Other(String),
    /// The key itself of the dict's entry at this index (visited by [`Node::walk_all`] only).
    EntryKey(usize),
    /// The `BUILD` state of a dict (`{'_metadata': ...}`; visited by [`Node::walk_all`] only).
    State,
}

impl fmt::Display for Key<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Str(s) => f.write_str(s),
            Key::Int(i) => write!(f, "{i}"),
            Key::Other(s) => f.write_str(s),
            Key::EntryKey(i) => write!(f, "<key of entry {i}>"),
            Key::State => f.write_str("<state>"),
        }
    }
}

/// Joins path components with dots, as state dicts name their entries
/// (`model._actor.mu.weight`, `actor_optimizer.state.0.exp_avg`).
pub fn dotted(path: &[Key<'_>]) -> String {
    let mut s = String::new();
    for (i, k) in path.iter().enumerate() {
        if i > 0 {
            s.push('.');
        }
        s.push_str(&k.to_string());
    }
    s
}

impl Node {
    /// Visits every node depth-first in order with its path (dict keys
    /// and list/tuple/set indices). Dict keys themselves, `_metadata` and
    /// other BUILD states are not visited (see [`Node::walk_all`]). Stops
    /// early when `f` returns `false` for a node (its children are skipped).
    pub fn walk<'a>(&'a self, f: &mut dyn FnMut(&[Key<'a>], &'a Node) -> bool) {
        let mut path = Vec::new();
        walk_inner(self, &mut path, Reach::Values, f);
    }

    /// Visits every node of the tree, [`Node::walk`]'s and also each
    /// dict's keys (path component [`Key::EntryKey`]) and BUILD state
    /// ([`Key::State`]) with everything under them: the walk for checks
    /// that must not miss anything (unsafe globals, storage references).
    pub fn walk_all<'a>(&'a self, f: &mut dyn FnMut(&[Key<'a>], &'a Node) -> bool) {
        let mut path = Vec::new();
        walk_inner(self, &mut path, Reach::Everything, f);
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Reach {
    Values,
    Everything,
}

fn key_of(k: &Node) -> Key<'_> {
    match k {
        Node::Str(s) => Key::Str(s),
        Node::Int(i) => Key::Int(*i),
        other => Key::Other(other.to_string()),
    }
}

fn walk_inner<'a>(
    node: &'a Node,
    path: &mut Vec<Key<'a>>,
    reach: Reach,
    f: &mut dyn FnMut(&[Key<'a>], &'a Node) -> bool,
) {
    if !f(path, node) {
        return;
    }
    match node {
        Node::List(xs) | Node::Tuple(xs) | Node::Set(xs) => {
            for (i, x) in xs.iter().enumerate() {
                path.push(Key::Int(i as i64));
                walk_inner(x, path, reach, f);
                path.pop();
            }
        }
        Node::Dict(d) => {
            for (i, (k, v)) in d.entries().iter().enumerate() {
                if reach == Reach::Everything {
                    path.push(Key::EntryKey(i));
                    walk_inner(k, path, reach, f);
                    path.pop();
                }
                path.push(key_of(k));
                walk_inner(v, path, reach, f);
                path.pop();
            }
            if let (Reach::Everything, Some(state)) = (reach, d.state()) {
                path.push(Key::State);
                walk_inner(state, path, reach, f);
                path.pop();
            }
        }
        Node::Object(o) => walk_object(o, path, reach, f),
        _ => {}
    }
}

/// An object's parts: its fields as if it were a dict (`agent.model.actor`
/// names a dataclass attribute), then what else carries values (arguments,
/// stored items); `walk_all` also visits the callable.
fn walk_object<'a>(
    o: &'a Object,
    path: &mut Vec<Key<'a>>,
    reach: Reach,
    f: &mut dyn FnMut(&[Key<'a>], &'a Node) -> bool,
) {
    if reach == Reach::Everything {
        path.push(Key::Other("<callable>".into()));
        walk_inner(&o.callable, path, reach, f);
        path.pop();
    }
    let mut visit = |key: Key<'a>, node: &'a Node, path: &mut Vec<Key<'a>>| {
        path.push(key);
        walk_inner(node, path, reach, f);
        path.pop();
    };
    match &o.args {
        Node::Tuple(xs) if xs.is_empty() => {}
        args => visit(Key::Other("<args>".into()), args, path),
    }
    if let Some(k) = &o.kwargs {
        visit(Key::Other("<kwargs>".into()), k, path);
    }
    match &o.state {
        Some(Node::Dict(d)) if d.state().is_none() => {
            for (i, (k, v)) in d.entries().iter().enumerate() {
                if reach == Reach::Everything {
                    visit(Key::EntryKey(i), k, path);
                }
                visit(key_of(k), v, path);
            }
        }
        Some(state) => visit(Key::State, state, path),
        None => {}
    }
    for (i, (k, v)) in o.setitems.iter().enumerate() {
        if reach == Reach::Everything {
            visit(Key::EntryKey(i), k, path);
        }
        visit(key_of(k), v, path);
    }
    for (i, x) in o.appends.iter().enumerate() {
        visit(Key::Int(i as i64), x, path);
    }
}
