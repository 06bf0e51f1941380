//! From the object graph to the [`Value`] tree, without recursion.
//!
//! First an exact check of the graph reachable from the root: no cycles,
//! the tree it unfolds into (shared objects counted once per reference)
//! within `max_nodes` and `max_depth`. Only then is the tree built, moving
//! each node's content out of the arena at its last use and cloning it
//! before that, so memory stays proportional to the result.

use super::arena::{Arena, Id, Node};
use crate::{Limits, PickleError, ReadProblem, Result, Value};

/// Converts the graph under `root` into a tree; errors carry `stop_offset`.
pub(super) fn to_value(mut arena: Arena, root: Id, limits: &Limits, stop_offset: usize) -> Result<Value> {
    let order = check(&mut arena, root, limits, stop_offset)?;
    let uses = count_uses(&arena, root, &order);
    // Objects with identity (call results) that several references point to
    // directly are marked shared. (Not "used more than once": everything
    // inside a shared object is, without being referenced twice itself.)
    let mut refs = vec![0u32; arena.nodes.len()];
    for &id in &order {
        let node = &arena.nodes[id as usize];
        for child in (0..node.child_count()).filter_map(|k| node.child(k)) {
            refs[child as usize] = refs[child as usize].saturating_add(1);
        }
    }
    let shared: Vec<bool> = arena
        .nodes
        .iter()
        .zip(&refs)
        .map(|(n, &r)| r > 1 && matches!(n, Node::Reduce(_) | Node::NewObj(_) | Node::Build { .. }))
        .collect();
    Ok(build(arena, root, uses, &shared))
}

const WHITE: u8 = 0;
const GRAY: u8 = 1;
const BLACK: u8 = 2;

/// Depth-first search from `root`: rejects cycles, computes the exact size
/// and depth of every reachable node (stored in `arena.meta`), and returns
/// the reachable nodes in post-order (children before parents).
fn check(arena: &mut Arena, root: Id, limits: &Limits, stop_offset: usize) -> Result<Vec<Id>> {
    let mut color = vec![WHITE; arena.nodes.len()];
    let mut order = Vec::new();
    let mut stack: Vec<(Id, usize)> = vec![(root, 0)];
    color[root as usize] = GRAY;
    while let Some(&mut (id, ref mut next)) = stack.last_mut() {
        let node = &arena.nodes[id as usize];
        if let Some(child) = node.child(*next) {
            *next += 1;
            match color[child as usize] {
                WHITE => {
                    color[child as usize] = GRAY;
                    stack.push((child, 0));
                }
                GRAY => {
                    return Err(PickleError::Invalid {
                        offset: stop_offset,
                        opcode: "STOP",
                        problem: ReadProblem::Recursive(node.kind()),
                    });
                }
                _ => {}
            }
            continue;
        }
        // All children done: exact size and depth.
        let mut size = node.own_units();
        let mut depth = u32::from(node.is_container());
        for child in (0..node.child_count()).filter_map(|k| node.child(k)) {
            let m = arena.meta[child as usize];
            size = size.saturating_add(m.size);
            depth = depth.max(m.depth.saturating_add(1));
        }
        if size > limits.max_nodes {
            return Err(PickleError::Limit {
                offset: stop_offset,
                limit: "max_nodes",
                max: limits.max_nodes,
                needed: size,
            });
        }
        if depth as usize > limits.max_depth {
            let (max, needed) = (limits.max_depth as u64, u64::from(depth));
            return Err(PickleError::Limit { offset: stop_offset, limit: "max_depth", max, needed });
        }
        arena.meta[id as usize].size = size;
        arena.meta[id as usize].depth = depth;
        color[id as usize] = BLACK;
        order.push(id);
        stack.pop();
    }
    Ok(order)
}

/// How many times each node appears in the unfolded tree (the number of
/// paths from the root to it), indexed by id.
fn count_uses(arena: &Arena, root: Id, order: &[Id]) -> Vec<u64> {
    let mut uses = vec![0u64; arena.nodes.len()];
    uses[root as usize] = 1;
    for &id in order.iter().rev() {
        let node = &arena.nodes[id as usize];
        let n = uses[id as usize];
        for child in (0..node.child_count()).filter_map(|k| node.child(k)) {
            uses[child as usize] = uses[child as usize].saturating_add(n);
        }
    }
    uses
}

/// A container whose children are being converted: they are moved straight
/// into the vectors of the final value (no intermediate copies).
enum Frame {
    /// List, tuple, set, frozenset items; build object and state; the persistent id.
    Items(Vec<Value>),
    /// Dict entries, and a key waiting for its value.
    Pairs(Vec<(Value, Value)>, Option<Value>),
    /// A reduce or new-object record.
    Call(Box<CallFrame>),
}

struct CallFrame {
    /// Head, args and (if `has_kwargs`) kwargs, as they arrive.
    fixed: Vec<Value>,
    has_kwargs: bool,
    setitems: Vec<(Value, Value)>,
    setitems_len: usize,
    pending_key: Option<Value>,
    appends: Vec<Value>,
}

impl Frame {
    fn for_node(node: &Node) -> Frame {
        match node {
            Node::Dict(d) => Frame::Pairs(Vec::with_capacity(d.items.len()), None),
            Node::Reduce(c) | Node::NewObj(c) => Frame::Call(Box::new(CallFrame {
                fixed: Vec::with_capacity(3),
                has_kwargs: c.kwargs.is_some(),
                setitems: Vec::with_capacity(c.setitems.len()),
                setitems_len: c.setitems.len(),
                pending_key: None,
                appends: Vec::with_capacity(c.appends.len()),
            })),
            _ => Frame::Items(Vec::with_capacity(node.child_count())),
        }
    }

    /// Receives the next child value, in [`Node::child`] order.
    fn push(&mut self, v: Value) {
        match self {
            Frame::Items(items) => items.push(v),
            Frame::Pairs(pairs, pending) => match pending.take() {
                Some(k) => pairs.push((k, v)),
                None => *pending = Some(v),
            },
            Frame::Call(c) => {
                if c.fixed.len() < 2 + usize::from(c.has_kwargs) {
                    c.fixed.push(v);
                } else if c.setitems.len() < c.setitems_len {
                    match c.pending_key.take() {
                        Some(k) => c.setitems.push((k, v)),
                        None => c.pending_key = Some(v),
                    }
                } else {
                    c.appends.push(v);
                }
            }
        }
    }

    /// The finished value of `node` (whose children have all been pushed).
    fn finish(self, node: &Node) -> Value {
        match (self, node) {
            (Frame::Items(items), Node::List(_)) => Value::List(items),
            (Frame::Items(items), Node::Tuple(_)) => Value::Tuple(items),
            (Frame::Items(items), Node::Set(_)) => Value::Set(items),
            (Frame::Items(items), Node::FrozenSet(_)) => Value::FrozenSet(items),
            (Frame::Items(items), Node::Build { .. }) => {
                let mut it = items.into_iter();
                let object = Box::new(it.next().unwrap_or(Value::None));
                let state = Box::new(it.next().unwrap_or(Value::None));
                Value::Build { object, state }
            }
            (Frame::Items(items), Node::PersistentId(_)) => {
                Value::PersistentId(Box::new(items.into_iter().next().unwrap_or(Value::None)))
            }
            (Frame::Pairs(pairs, _), _) => Value::Dict(pairs),
            (Frame::Call(c), _) => {
                let CallFrame { fixed, has_kwargs, setitems, appends, .. } = *c;
                let mut it = fixed.into_iter();
                let mut next = || Box::new(it.next().unwrap_or(Value::None));
                let (head, args) = (next(), next());
                let kwargs = has_kwargs.then(next);
                if matches!(node, Node::NewObj(_)) {
                    Value::NewObj { cls: head, args, kwargs, setitems, appends }
                } else {
                    Value::Reduce { callable: head, args, setitems, appends }
                }
            }
            (Frame::Items(_), _) => Value::None,
        }
    }
}

/// Unfolds the (checked, acyclic) graph into the tree: a depth-first walk
/// with an explicit stack (as deep as the tree, never recursing), visiting
/// each node once per use.
fn build(mut arena: Arena, root: Id, mut uses: Vec<u64>, shared: &[bool]) -> Value {
    // (container being built, next child to visit), and its frame.
    let mut stack: Vec<(Id, usize)> = Vec::new();
    let mut frames: Vec<Frame> = Vec::new();
    let mut result = Value::None;
    let mut next = Some(root);
    loop {
        // Visit `next` if any: a leaf is delivered at once, a container opens a frame.
        let delivered = match next.take() {
            Some(id) => {
                let left = &mut uses[id as usize];
                *left = left.saturating_sub(1);
                let last_use = *left == 0;
                match leaf_value(&mut arena.nodes[id as usize], last_use) {
                    Some(leaf) => Some(leaf),
                    None => {
                        frames.push(Frame::for_node(&arena.nodes[id as usize]));
                        stack.push((id, 0));
                        None
                    }
                }
            }
            None => {
                let Some(&mut (id, ref mut k)) = stack.last_mut() else {
                    break;
                };
                let node = &arena.nodes[id as usize];
                if let Some(child) = node.child(*k) {
                    *k += 1;
                    next = Some(child);
                    continue;
                }
                // All children delivered: finish this container.
                stack.pop();
                let frame = frames.pop().unwrap_or(Frame::Items(Vec::new()));
                let mut value = frame.finish(node);
                if shared[id as usize] {
                    value = Value::Shared { id: u64::from(id), value: Box::new(value) };
                }
                if uses[id as usize] == 0 {
                    arena.nodes[id as usize] = Node::Taken;
                }
                Some(value)
            }
        };
        if let Some(value) = delivered {
            match frames.last_mut() {
                Some(parent) => parent.push(value),
                None => result = value,
            }
        }
    }
    result
}

/// The value of a leaf node (moved out at its last use, cloned before); `None` for containers.
fn leaf_value(slot: &mut Node, last_use: bool) -> Option<Value> {
    let take = |slot: &mut Node| std::mem::replace(slot, Node::Taken);
    Some(match slot {
        Node::None => Value::None,
        Node::Bool(b) => Value::Bool(*b),
        Node::Int(i) => Value::Int(*i),
        Node::Float(f) => Value::Float(*f),
        Node::BigInt(_) | Node::Str(_) | Node::Bytes(_) | Node::ByteArray(_) | Node::Global(_) if last_use => {
            match take(slot) {
                Node::BigInt(b) => Value::BigInt(b),
                Node::Str(s) => Value::Str(s),
                Node::Bytes(b) => Value::Bytes(b),
                Node::ByteArray(b) => Value::ByteArray(b),
                Node::Global(g) => Value::Global { module: g.0, name: g.1 },
                _ => Value::None,
            }
        }
        Node::BigInt(b) => Value::BigInt(b.clone()),
        Node::Str(s) => Value::Str(s.clone()),
        Node::Bytes(b) => Value::Bytes(b.clone()),
        Node::ByteArray(b) => Value::ByteArray(b.clone()),
        Node::Global(g) => Value::Global { module: g.0.clone(), name: g.1.clone() },
        Node::Taken => Value::None,
        _ => return None,
    })
}
