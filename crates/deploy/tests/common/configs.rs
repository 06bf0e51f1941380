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
