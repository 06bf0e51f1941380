//! [`Dict`]'s behaviour: construction with Python's key identity, O(1)
//! lookups by string or int key, insertion. The type itself is in `node`
//! (it holds nodes, and nodes hold dicts).

use std::collections::HashMap;
use std::fmt;
use std::sync::OnceLock;

use super::json::NodeJson;
use super::node::{Dict, DictKind, Index, Node};

/// Dicts with fewer entries are searched linearly (faster than building an index).
const INDEX_FROM: usize = 16;

/// A node's exact JSON text: equal text iff equal nodes (the identity of a
/// dict key that is neither a string nor an int).
pub(crate) fn fingerprint(n: &Node) -> String {
    serde_json::to_string(&NodeJson(n)).unwrap_or_default()
}

/// Two entries with equal keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DuplicateKey(pub String);

impl Dict {
    /// An empty dict of class `kind`.
    pub fn new(kind: DictKind) -> Dict {
        Dict { kind, entries: Vec::new(), state: None, index: OnceLock::new() }
    }

    /// A dict of `entries`, in order; two equal keys are an error naming
    /// the key (Python dicts cannot hold them, and a reader could keep
    /// either one). Keys compare as Python compares them: strings and ints
    /// by value, other keys structurally.
    pub fn from_entries(kind: DictKind, entries: Vec<(Node, Node)>) -> Result<Dict, DuplicateKey> {
        let mut strs: HashMap<&str, ()> = HashMap::with_capacity(entries.len());
        let mut ints: HashMap<i64, ()> = HashMap::new();
        let mut others: HashMap<String, ()> = HashMap::new();
        for (k, _) in &entries {
            let fresh = match k {
                Node::Str(s) => strs.insert(s, ()).is_none(),
                Node::Int(i) => ints.insert(*i, ()).is_none(),
                // Python: True == 1, False == 0 as keys.
                Node::Bool(b) => ints.insert(i64::from(*b), ()).is_none(),
                other => others.insert(fingerprint(other), ()).is_none(),
            };
            if !fresh {
                return Err(DuplicateKey(k.to_string()));
            }
        }
        Ok(Dict { kind, entries, state: None, index: OnceLock::new() })
    }

    /// This dict with a `BUILD` state (a state dict's `{'_metadata': ...}`).
    pub fn with_state(mut self, state: Option<Node>) -> Dict {
        self.state = state.map(Box::new);
        self
    }

    /// The entries in insertion order.
    pub fn entries(&self) -> &[(Node, Node)] {
        &self.entries
    }

    /// The dict taken apart: its class, its entries (key, value) in order, and the state.
    pub fn into_parts(self) -> (DictKind, Vec<(Node, Node)>, Option<Node>) {
        (self.kind, self.entries, self.state.map(|b| *b))
    }

    /// How many entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it has no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Its class: a plain `dict` or a `collections.OrderedDict`.
    pub fn kind(&self) -> DictKind {
        self.kind
    }

    /// Whether it is a `collections.OrderedDict` (else a plain `dict`).
    pub fn is_ordered(&self) -> bool {
        self.kind == DictKind::Ordered
    }

    /// The object state torch restores with `BUILD` (`{'_metadata': ...}` on a state dict).
    pub fn state(&self) -> Option<&Node> {
        self.state.as_deref()
    }

    /// The `_metadata` of a state dict (its `BUILD` state's `_metadata`).
    pub fn metadata(&self) -> Option<&Node> {
        match self.state.as_deref() {
            Some(Node::Dict(d)) => d.get("_metadata"),
            _ => None,
        }
    }

    fn index(&self) -> &Index {
        self.index.get_or_init(|| {
            let mut ix = Box::<Index>::default();
            for (i, (k, _)) in self.entries.iter().enumerate() {
                match k {
                    Node::Str(s) => {
                        ix.strs.insert(s.clone(), i);
                    }
                    Node::Int(n) => {
                        ix.ints.insert(*n, i);
                    }
                    _ => {}
                }
            }
            ix
        })
    }

    /// The position of string key `key`.
    fn position(&self, key: &str) -> Option<usize> {
        if self.entries.len() < INDEX_FROM {
            return self.entries.iter().position(|(k, _)| k.as_str() == Some(key));
        }
        self.index().strs.get(key).copied()
    }

    /// The position of the entry a dotted-path component names: a string
    /// key, or an int key written in decimal (the string wins if both exist).
    pub(crate) fn position_of_label(&self, label: &str) -> Option<usize> {
        if let Some(i) = self.position(label) {
            return Some(i);
        }
        let n: i64 = label.parse().ok()?;
        if self.entries.len() < INDEX_FROM {
            return self.entries.iter().position(|(k, _)| matches!(k, Node::Int(i) if *i == n));
        }
        self.index().ints.get(&n).copied()
    }

    /// The value under string key `key`.
    pub fn get(&self, key: &str) -> Option<&Node> {
        self.position(key).map(|i| &self.entries[i].1)
    }

    /// The value of the entry at `position`.
    pub(crate) fn value_at(&self, position: usize) -> &Node {
        &self.entries[position].1
    }

    /// The value of the entry at `position`, mutably.
    pub(crate) fn value_at_mut(&mut self, position: usize) -> &mut Node {
        &mut self.entries[position].1
    }

    /// The value under string key `key`, mutably.
    pub fn get_mut(&mut self, key: &str) -> Option<&mut Node> {
        let i = self.position(key)?;
        Some(&mut self.entries[i].1)
    }

    /// Sets string key `key` to `value`: in place if present, else at the end.
    pub fn insert(&mut self, key: &str, value: Node) {
        match self.position(key) {
            Some(i) => self.entries[i].1 = value,
            None => {
                if let Some(ix) = self.index.get_mut() {
                    ix.strs.insert(key.to_owned(), self.entries.len());
                }
                self.entries.push((Node::Str(key.to_owned()), value));
            }
        }
    }
}

impl Node {
    /// The value under string key `key` of a dict.
    pub fn get(&self, key: &str) -> Option<&Node> {
        self.as_dict()?.get(key)
    }
}

impl PartialEq for Dict {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind && self.entries == other.entries && self.state == other.state
    }
}

impl fmt::Debug for Dict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dict")
            .field("kind", &self.kind)
            .field("entries", &self.entries)
            .field("state", &self.state)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn big(n: usize) -> Dict {
        let entries = (0..n).map(|i| (Node::Str(format!("k{i}")), Node::Int(i as i64))).collect();
        Dict::from_entries(DictKind::Ordered, entries).unwrap()
    }

    #[test]
    fn lookups_agree_with_a_linear_search_small_and_large() {
        for n in [3, INDEX_FROM, 5000] {
            let mut d = big(n);
            assert_eq!(d.get(&format!("k{}", n - 1)), Some(&Node::Int(n as i64 - 1)));
            assert_eq!(d.get("absent"), None);
            d.insert("new", Node::None);
            d.insert("k0", Node::Bool(true));
            assert_eq!(d.get("new"), Some(&Node::None));
            assert_eq!(d.get("k0"), Some(&Node::Bool(true)));
            assert_eq!(d.entries().last().map(|(k, _)| k.as_str()), Some(Some("new")));
        }
        let ints =
            Dict::from_entries(DictKind::Plain, (0..40).map(|i| (Node::Int(i), Node::Int(-i))).collect()).unwrap();
        assert_eq!(ints.position_of_label("39"), Some(39));
        assert_eq!(ints.position_of_label("x"), None);
    }

    #[test]
    fn equal_keys_are_refused() {
        let dup = vec![(Node::Str("a".into()), Node::None), (Node::Str("a".into()), Node::Int(1))];
        assert_eq!(Dict::from_entries(DictKind::Plain, dup).unwrap_err(), DuplicateKey("'a'".into()));
        let tuples = vec![(Node::Tuple(vec![Node::Int(1)]), Node::None), (Node::Tuple(vec![Node::Int(1)]), Node::None)];
        assert!(Dict::from_entries(DictKind::Plain, tuples).is_err());
        let bool_int = vec![(Node::Int(1), Node::None), (Node::Bool(true), Node::None)];
        assert!(Dict::from_entries(DictKind::Plain, bool_int).is_err(), "True == 1 as a Python key");
    }
}
