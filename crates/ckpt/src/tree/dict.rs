//! [`Dict`]: an ordered dict with O(1) lookups by string or int key.

use std::collections::HashMap;
use std::fmt;
use std::sync::OnceLock;

use super::Node;

/// Dicts with fewer entries are searched linearly (faster than building an index).
const INDEX_FROM: usize = 16;

/// A dict: `dict` or `collections.OrderedDict`, entries in order, keys unique.
///
/// Lookups by a string or int key are O(1) (an index built on first use
/// for dicts of 16 entries or more): a state dict of 50,000 keys costs no
/// more per lookup than one of 5.
#[derive(Clone)]
pub struct Dict {
    ordered: bool,
    entries: Vec<(Node, Node)>,
    state: Option<Box<Node>>,
    index: OnceLock<Box<Index>>,
}

#[derive(Default)]
struct Index {
    strs: HashMap<String, usize>,
    ints: HashMap<i64, usize>,
}

impl Clone for Index {
    fn clone(&self) -> Self {
        Index { strs: self.strs.clone(), ints: self.ints.clone() }
    }
}

/// Two entries with equal keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DuplicateKey(pub String);

impl Dict {
    /// An empty dict (`ordered`: an `OrderedDict`).
    pub fn new(ordered: bool) -> Dict {
        Dict { ordered, entries: Vec::new(), state: None, index: OnceLock::new() }
    }

    /// A dict of `entries`, in order; two equal keys are an error naming
    /// the key (Python dicts cannot hold them, and a reader could keep
    /// either one). Keys compare as Python compares them: strings and ints
    /// by value, other keys structurally.
    pub fn from_entries(ordered: bool, entries: Vec<(Node, Node)>) -> Result<Dict, DuplicateKey> {
        let mut strs: HashMap<&str, ()> = HashMap::with_capacity(entries.len());
        let mut ints: HashMap<i64, ()> = HashMap::new();
        let mut others: HashMap<String, ()> = HashMap::new();
        for (k, _) in &entries {
            let fresh = match k {
                Node::Str(s) => strs.insert(s, ()).is_none(),
                Node::Int(i) => ints.insert(*i, ()).is_none(),
                // Python: True == 1, False == 0 as keys.
                Node::Bool(b) => ints.insert(i64::from(*b), ()).is_none(),
                other => others.insert(super::json::fingerprint(other), ()).is_none(),
            };
            if !fresh {
                return Err(DuplicateKey(k.to_string()));
            }
        }
        Ok(Dict { ordered, entries, state: None, index: OnceLock::new() })
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

    /// The entries, taken apart (key, value) in order, and the state.
    pub fn into_parts(self) -> (bool, Vec<(Node, Node)>, Option<Node>) {
        (self.ordered, self.entries, self.state.map(|b| *b))
    }

    /// How many entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it has no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether it is a `collections.OrderedDict` (else a plain `dict`).
    pub fn is_ordered(&self) -> bool {
        self.ordered
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

impl PartialEq for Dict {
    fn eq(&self, other: &Self) -> bool {
        self.ordered == other.ordered && self.entries == other.entries && self.state == other.state
    }
}

impl fmt::Debug for Dict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dict")
            .field("ordered", &self.ordered)
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
        Dict::from_entries(true, entries).unwrap()
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
        let ints = Dict::from_entries(false, (0..40).map(|i| (Node::Int(i), Node::Int(-i))).collect()).unwrap();
        assert_eq!(ints.position_of_label("39"), Some(39));
        assert_eq!(ints.position_of_label("x"), None);
    }

    #[test]
    fn equal_keys_are_refused() {
        let dup = vec![(Node::Str("a".into()), Node::None), (Node::Str("a".into()), Node::Int(1))];
        assert_eq!(Dict::from_entries(false, dup).unwrap_err(), DuplicateKey("'a'".into()));
        let tuples = vec![(Node::Tuple(vec![Node::Int(1)]), Node::None), (Node::Tuple(vec![Node::Int(1)]), Node::None)];
        assert!(Dict::from_entries(false, tuples).is_err());
        let bool_int = vec![(Node::Int(1), Node::None), (Node::Bool(true), Node::None)];
        assert!(Dict::from_entries(false, bool_int).is_err(), "True == 1 as a Python key");
    }
}
