//! Canonical ids for dict keys and set items.
//!
//! Two keys get the same canonical id exactly when they are structurally
//! equal (floats by bit pattern, tuples and frozensets item by item, in
//! order). Objects (reduce / new-object / build results, persistent ids)
//! compare by identity, as Python's default `__eq__` does, and the
//! unhashable kinds (list, dict, set, bytearray) are refused as Python
//! refuses them. Each node is canonicalized at most once, so the total work
//! stays linear in the input even when memoized keys are reused.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};

use super::arena::{Arena, Id, Node};
use crate::ReadProblem;

/// The canonical-id table of one pickle.
#[derive(Default)]
pub(super) struct Keys {
    next: u32,
    /// Canonical id of every node canonicalized so far.
    cache: HashMap<Id, u32>,
    /// Hash of a node's canonical content -> (representative node, canonical id).
    buckets: HashMap<u64, Vec<(Id, u32)>>,
    hasher: RandomState,
}

/// Content hashed for a node: its kind tag and its data or its children's canonical ids.
#[derive(Hash, PartialEq)]
enum Content<'a> {
    None,
    Bool(bool),
    Int(i64),
    BigInt(&'a [u8]),
    Float(u64),
    Str(&'a str),
    Bytes(&'a [u8]),
    Global(&'a str, &'a str),
    Tuple(&'a [u32]),
    FrozenSet(&'a [u32]),
}

impl Keys {
    /// The canonical id of the key `id`, or why it cannot be a key (an
    /// unhashable part, named by its Python type; a key that contains itself).
    pub(super) fn canon(&mut self, arena: &Arena, id: Id) -> Result<u32, ReadProblem> {
        // Explicit stack of (node, next child to canonicalize) so nested tuples never recurse.
        let mut work: Vec<(Id, usize)> = vec![(id, 0)];
        let mut child_canons: Vec<u32> = Vec::new();
        while let Some(&mut (top, ref mut next_child)) = work.last_mut() {
            if self.cache.contains_key(&top) {
                work.pop();
                continue;
            }
            let node = arena.node(top);
            let content = match node {
                Node::List(_) | Node::Dict(_) | Node::Set(_) | Node::ByteArray(_) | Node::Taken => {
                    return Err(ReadProblem::Unhashable(node.kind()));
                }
                Node::Reduce(_) | Node::NewObj(_) | Node::Build { .. } | Node::PersistentId(_) => {
                    let c = self.fresh();
                    self.cache.insert(top, c);
                    work.pop();
                    continue;
                }
                Node::Tuple(items) | Node::FrozenSet(items) => {
                    if let Some(&child) = items.get(*next_child) {
                        *next_child += 1;
                        if !self.cache.contains_key(&child) {
                            if work.len() > arena.nodes.len() {
                                return Err(ReadProblem::RecursiveKey);
                            }
                            work.push((child, 0));
                        }
                        continue;
                    }
                    child_canons.clear();
                    child_canons.extend(items.iter().filter_map(|c| self.cache.get(c).copied()));
                    if matches!(node, Node::Tuple(_)) {
                        Content::Tuple(&child_canons)
                    } else {
                        Content::FrozenSet(&child_canons)
                    }
                }
                Node::None => Content::None,
                Node::Bool(b) => Content::Bool(*b),
                Node::Int(i) => Content::Int(*i),
                Node::BigInt(b) => Content::BigInt(b),
                Node::Float(f) => Content::Float(f.to_bits()),
                Node::Str(s) => Content::Str(s),
                Node::Bytes(b) => Content::Bytes(b),
                Node::Global(g) => Content::Global(&g.0, &g.1),
            };
            let hash = self.hasher.hash_one(&content);
            let found = self.buckets.get(&hash).and_then(|reps| {
                reps.iter()
                    .find(|&&(rep, _)| self.content_of(arena, rep).is_some_and(|c| c == content))
                    .map(|&(_, c)| c)
            });
            let c = match found {
                Some(c) => c,
                None => {
                    let c = self.fresh();
                    self.buckets.entry(hash).or_default().push((top, c));
                    c
                }
            };
            self.cache.insert(top, c);
            work.pop();
        }
        self.cache.get(&id).copied().ok_or_else(|| ReadProblem::Unhashable(arena.node(id).kind()))
    }

    fn fresh(&mut self) -> u32 {
        let c = self.next;
        self.next = self.next.wrapping_add(1);
        c
    }

    /// The content of an already canonicalized representative node.
    fn content_of<'a>(&self, arena: &'a Arena, rep: Id) -> Option<OwnedContent<'a>> {
        let canons = |items: &[Id]| items.iter().map(|c| self.cache.get(c).copied()).collect::<Option<Vec<u32>>>();
        Some(match arena.node(rep) {
            Node::None => OwnedContent::Plain(Content::None),
            Node::Bool(b) => OwnedContent::Plain(Content::Bool(*b)),
            Node::Int(i) => OwnedContent::Plain(Content::Int(*i)),
            Node::BigInt(b) => OwnedContent::Plain(Content::BigInt(b)),
            Node::Float(f) => OwnedContent::Plain(Content::Float(f.to_bits())),
            Node::Str(s) => OwnedContent::Plain(Content::Str(s)),
            Node::Bytes(b) => OwnedContent::Plain(Content::Bytes(b)),
            Node::Global(g) => OwnedContent::Plain(Content::Global(&g.0, &g.1)),
            Node::Tuple(items) => OwnedContent::Tuple(canons(items)?),
            Node::FrozenSet(items) => OwnedContent::FrozenSet(canons(items)?),
            _ => return None,
        })
    }
}

/// [`Content`] of a representative, with its children's canonical ids collected.
enum OwnedContent<'a> {
    Plain(Content<'a>),
    Tuple(Vec<u32>),
    FrozenSet(Vec<u32>),
}

impl PartialEq<Content<'_>> for OwnedContent<'_> {
    fn eq(&self, other: &Content<'_>) -> bool {
        match (self, other) {
            (OwnedContent::Tuple(a), Content::Tuple(b)) | (OwnedContent::FrozenSet(a), Content::FrozenSet(b)) => {
                a.as_slice() == *b
            }
            (OwnedContent::Plain(a), b) => a == b,
            _ => false,
        }
    }
}
