//! The reader's object store: every pickle object is a [`Node`] addressed by
//! an [`Id`], so the stack and the memo hold ids and containers can be
//! mutated after they were memoized (as pickles do: `EMPTY_DICT BINPUT ...
//! SETITEMS`). Shared objects are only cloned when the final tree is built.

use std::collections::HashMap;

/// Index of a node in the [`Arena`].
pub(super) type Id = u32;

/// One pickle object, its children by [`Id`].
#[derive(Debug)]
pub(super) enum Node {
    None,
    Bool(bool),
    Int(i64),
    BigInt(Vec<u8>),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    ByteArray(Vec<u8>),
    List(Vec<Id>),
    Tuple(Vec<Id>),
    Dict(Box<Keyed<(Id, Id)>>),
    Set(Box<Keyed<Id>>),
    FrozenSet(Vec<Id>),
    Global(Box<(String, String)>),
    Reduce(Box<Call>),
    NewObj(Box<Call>),
    Build {
        object: Id,
        state: Id,
    },
    PersistentId(Id),
    /// Left behind once the node's content was moved into the result tree.
    Taken,
}

/// A `REDUCE` / `NEWOBJ` record (`head` is the callable or the class).
#[derive(Debug)]
pub(super) struct Call {
    pub head: Id,
    pub args: Id,
    pub kwargs: Option<Id>,
    pub setitems: Vec<(Id, Id)>,
    pub appends: Vec<Id>,
}

impl Call {
    pub(super) fn new(head: Id, args: Id, kwargs: Option<Id>) -> Self {
        Call { head, args, kwargs, setitems: Vec::new(), appends: Vec::new() }
    }
}

/// Dict entries or set items together with the canonical ids of their keys
/// (see the `keys` module), so that a repeated key is found without comparing trees.
#[derive(Debug, Default)]
pub(super) struct Keyed<T> {
    pub items: Vec<T>,
    canon: Vec<u32>,
    map: Option<HashMap<u32, usize>>,
}

/// Up to this many entries a linear scan of the canonical ids beats a hash map.
const LINEAR_SCAN_MAX: usize = 16;

impl<T> Keyed<T> {
    /// The position of the item whose key has canonical id `canon`.
    pub(super) fn find(&self, canon: u32) -> Option<usize> {
        match &self.map {
            Some(map) => map.get(&canon).copied(),
            None => self.canon.iter().position(|&c| c == canon),
        }
    }

    /// Appends an item whose key (known to be new) has canonical id `canon`.
    pub(super) fn push(&mut self, canon: u32, item: T) {
        let pos = self.items.len();
        self.items.push(item);
        self.canon.push(canon);
        if let Some(map) = &mut self.map {
            map.insert(canon, pos);
        } else if self.canon.len() > LINEAR_SCAN_MAX {
            self.map = Some(self.canon.iter().enumerate().map(|(i, &c)| (c, i)).collect());
        }
    }
}

impl Node {
    /// Python's name for the node's type, for error messages.
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Node::None => "None",
            Node::Bool(_) => "bool",
            Node::Int(_) | Node::BigInt(_) => "int",
            Node::Float(_) => "float",
            Node::Str(_) => "str",
            Node::Bytes(_) => "bytes",
            Node::ByteArray(_) => "bytearray",
            Node::List(_) => "list",
            Node::Tuple(_) => "tuple",
            Node::Dict(_) => "dict",
            Node::Set(_) => "set",
            Node::FrozenSet(_) => "frozenset",
            Node::Global(_) => "global",
            Node::Reduce(_) => "reduce result",
            Node::NewObj(_) => "new object",
            Node::Build { .. } => "built object",
            Node::PersistentId(_) => "persistent id",
            Node::Taken => "moved node",
        }
    }

    /// Whether the node is a container (counts one level of depth).
    pub(super) fn is_container(&self) -> bool {
        matches!(
            self,
            Node::List(_)
                | Node::Tuple(_)
                | Node::Dict(_)
                | Node::Set(_)
                | Node::FrozenSet(_)
                | Node::Reduce(_)
                | Node::NewObj(_)
                | Node::Build { .. }
                | Node::PersistentId(_)
        )
    }

    /// Number of children, in the order of [`Node::child`].
    pub(super) fn child_count(&self) -> usize {
        match self {
            Node::List(xs) | Node::Tuple(xs) | Node::FrozenSet(xs) => xs.len(),
            Node::Set(s) => s.items.len(),
            Node::Dict(d) => 2 * d.items.len(),
            Node::Reduce(c) | Node::NewObj(c) => {
                2 + usize::from(c.kwargs.is_some()) + 2 * c.setitems.len() + c.appends.len()
            }
            Node::Build { .. } => 2,
            Node::PersistentId(_) => 1,
            _ => 0,
        }
    }

    /// The `k`-th child (`None` past [`Node::child_count`]): list items in
    /// order; dict key, value, key, value...; call head, args, kwargs (if
    /// any), setitems keys and values, appends; build object, state; the
    /// persistent id's value.
    pub(super) fn child(&self, k: usize) -> Option<Id> {
        match self {
            Node::List(xs) | Node::Tuple(xs) | Node::FrozenSet(xs) => xs.get(k).copied(),
            Node::Set(s) => s.items.get(k).copied(),
            Node::Dict(d) => pair_half(&d.items, k),
            Node::Reduce(c) | Node::NewObj(c) => {
                let fixed: &[Id] = match c.kwargs {
                    Some(kw) => &[c.head, c.args, kw],
                    None => &[c.head, c.args],
                };
                if let Some(&id) = fixed.get(k) {
                    return Some(id);
                }
                let k = k - fixed.len();
                if k < 2 * c.setitems.len() {
                    pair_half(&c.setitems, k)
                } else {
                    c.appends.get(k - 2 * c.setitems.len()).copied()
                }
            }
            Node::Build { object, state } => [*object, *state].get(k).copied(),
            Node::PersistentId(p) => (k == 0).then_some(*p),
            _ => None,
        }
    }
}

fn pair_half(pairs: &[(Id, Id)], k: usize) -> Option<Id> {
    let (key, value) = *pairs.get(k / 2)?;
    Some(if k.is_multiple_of(2) { key } else { value })
}

/// Lower bounds of a node's subtree size and depth, kept up to date as
/// containers are filled so that hostile input fails at the opcode that
/// crosses a limit. (A child that grows after being added does not update
/// its parents: the exact check runs on the finished graph, see `convert`.)
#[derive(Debug, Clone, Copy)]
pub(super) struct Meta {
    /// Nodes in the subtree, counting shared subtrees once per reference (saturating).
    pub size: u64,
    /// Container nesting: 0 for a scalar, 1 + the deepest child for a container.
    pub depth: u32,
}

/// Bytes of a leaf's payload that count as one more node: a memo reference
/// to a long string costs what copying it costs.
pub(super) const BYTES_PER_UNIT: usize = 64;

impl Node {
    /// This node's own weight in [`crate::Limits::max_nodes`] units: 1, plus
    /// one per [`BYTES_PER_UNIT`] bytes of a string, bytes or big int payload.
    pub(super) fn own_units(&self) -> u64 {
        let payload = match self {
            Node::Str(s) => s.len(),
            Node::Bytes(b) | Node::ByteArray(b) | Node::BigInt(b) => b.len(),
            _ => 0,
        };
        1 + (payload / BYTES_PER_UNIT) as u64
    }
}

/// All nodes of one pickle.
#[derive(Debug, Default)]
pub(super) struct Arena {
    pub nodes: Vec<Node>,
    pub meta: Vec<Meta>,
}

impl Arena {
    /// Stores `node`, computing its [`Meta`] from its children. `None` when
    /// the arena is full (more than `u32::MAX` objects).
    pub(super) fn push(&mut self, node: Node) -> Option<Id> {
        let id = Id::try_from(self.nodes.len()).ok().filter(|&id| id != Id::MAX)?;
        let mut meta = Meta { size: node.own_units(), depth: u32::from(node.is_container()) };
        for child in (0..node.child_count()).filter_map(|k| node.child(k)) {
            let child = self.meta[child as usize];
            meta.size = meta.size.saturating_add(child.size);
            meta.depth = meta.depth.max(child.depth.saturating_add(1));
        }
        self.nodes.push(node);
        self.meta.push(meta);
        Some(id)
    }

    pub(super) fn node(&self, id: Id) -> &Node {
        &self.nodes[id as usize]
    }

    pub(super) fn node_mut(&mut self, id: Id) -> &mut Node {
        &mut self.nodes[id as usize]
    }

    pub(super) fn meta(&self, id: Id) -> Meta {
        self.meta[id as usize]
    }

    /// Records that `children` were added to `parent`; returns its new meta.
    pub(super) fn grow(&mut self, parent: Id, children: impl IntoIterator<Item = Id>) -> Meta {
        let mut meta = self.meta[parent as usize];
        for c in children {
            let child = self.meta[c as usize];
            meta.size = meta.size.saturating_add(child.size);
            meta.depth = meta.depth.max(child.depth.saturating_add(1));
        }
        self.meta[parent as usize] = meta;
        meta
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_stay_small() {
        // The reader's memory per pickle object (see the crate docs): keep rare variants boxed.
        assert!(std::mem::size_of::<Node>() <= 32);
        assert!(std::mem::size_of::<Meta>() <= 16);
    }
}
