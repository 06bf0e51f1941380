//! Reading one object of a resolved config tree: its fields by name, each
//! read recorded so that [`Obj::finish`] can refuse a field nobody parsed.
//! Shared by the model config parser and the module-operation parser.

use std::cell::RefCell;
use std::collections::BTreeSet;

use pmstate_ckpt::{Dict, Node};

use crate::error::{PolicyError, Result};
use crate::problem::FieldProblem;

/// Fields each class has beyond those parsed, which never change the eval
/// forward (optimizers): skipped whatever they hold.
const TRAINING_ONLY: [&str; 4] =
    ["actor_optimizer", "critic_optimizer", "discriminator_optimizer", "disc_critic_optimizer"];

/// An object of the tree being parsed: its config path, class and fields,
/// and which fields were read (the rest are checked by [`Obj::finish`]).
pub(crate) struct Obj<'a> {
    pub(crate) path: String,
    pub(crate) class: String,
    /// `None`: an object pickled without a BUILD state (a dataclass without fields).
    pub(crate) fields: Option<&'a Dict>,
    used: RefCell<BTreeSet<String>>,
}

impl<'a> Obj<'a> {
    pub(crate) fn new(node: &'a Node, path: &str) -> Result<Self> {
        let wrong = |found: String| PolicyError::FieldType {
            path: parent(path),
            field: last(path),
            expected: "a config object",
            found,
        };
        match node {
            Node::Object(o) => {
                // A dataclass without fields pickles without a BUILD state.
                let fields = match &o.state {
                    None => None,
                    Some(_) => {
                        Some(o.fields().ok_or_else(|| wrong("an object whose state is not a dict of fields".into()))?)
                    }
                };
                Ok(Obj {
                    path: path.to_owned(),
                    class: o.class_name().unwrap_or_else(|| "<object>".into()),
                    fields,
                    used: RefCell::new(BTreeSet::new()),
                })
            }
            Node::Dict(d) => Ok(Obj {
                path: path.to_owned(),
                class: "dict".into(),
                fields: Some(d),
                used: RefCell::new(BTreeSet::new()),
            }),
            other => Err(wrong(other.to_string())),
        }
    }

    pub(crate) fn entries(&self) -> &'a [(Node, Node)] {
        self.fields.map_or(&[], |f| f.entries())
    }

    pub(crate) fn short_class(&self) -> &str {
        self.class.rsplit('.').next().unwrap_or(&self.class)
    }

    pub(crate) fn sub(&self, field: &str) -> String {
        format!("{}.{field}", self.path)
    }

    pub(crate) fn bad(&self, field: &str, problem: FieldProblem) -> PolicyError {
        PolicyError::BadField { path: self.path.clone(), field: field.to_owned(), problem }
    }

    pub(crate) fn get(&self, field: &str) -> Option<&'a Node> {
        self.used.borrow_mut().insert(field.to_owned());
        self.fields.and_then(|f| f.get(field))
    }

    /// The error for `field` holding `found` where `expected` is needed.
    pub(crate) fn wrong_type(&self, field: &str, expected: &'static str, found: &Node) -> PolicyError {
        PolicyError::FieldType { path: self.path.clone(), field: field.to_owned(), expected, found: found.to_string() }
    }

    pub(crate) fn req(&self, field: &str) -> Result<&'a Node> {
        self.get(field).ok_or_else(|| PolicyError::MissingField {
            path: self.path.clone(),
            class: self.short_class().to_owned(),
            field: field.to_owned(),
        })
    }

    pub(crate) fn string(&self, field: &str) -> Result<String> {
        match self.req(field)? {
            Node::Str(s) => Ok(s.clone()),
            other => Err(self.wrong_type(field, "a string", other)),
        }
    }

    pub(crate) fn opt_string(&self, field: &str) -> Result<Option<String>> {
        match self.get(field) {
            None | Some(Node::None) => Ok(None),
            Some(Node::Str(s)) => Ok(Some(s.clone())),
            Some(other) => Err(self.wrong_type(field, "a string or None", other)),
        }
    }

    pub(crate) fn bool_or(&self, field: &str, default: bool) -> Result<bool> {
        match self.get(field) {
            None => Ok(default),
            Some(Node::Bool(b)) => Ok(*b),
            Some(other) => Err(self.wrong_type(field, "True or False", other)),
        }
    }

    pub(crate) fn count(&self, field: &str) -> Result<usize> {
        match self.req(field)? {
            Node::Int(i) if *i > 0 => {
                usize::try_from(*i).map_err(|_| self.bad(field, FieldProblem::TooLarge { value: *i }))
            }
            other => Err(self.wrong_type(field, "a positive int", other)),
        }
    }

    pub(crate) fn list(&self, field: &str) -> Result<&'a [Node]> {
        match self.get(field) {
            None => Ok(&[]),
            Some(Node::List(xs)) | Some(Node::Tuple(xs)) => Ok(xs),
            Some(other) => Err(self.wrong_type(field, "a list", other)),
        }
    }

    pub(crate) fn strings(&self, field: &str) -> Result<Vec<String>> {
        self.list(field)?
            .iter()
            .map(|n| match n {
                Node::Str(s) => Ok(s.clone()),
                other => Err(self.wrong_type(field, "a list of strings", other)),
            })
            .collect()
    }

    pub(crate) fn first_out_key(&self) -> Result<String> {
        let keys = self.strings("out_keys")?;
        keys.into_iter()
            .next()
            .ok_or_else(|| self.bad("out_keys", FieldProblem::Empty { needs: "the module writes out_keys[0]" }))
    }

    /// Every field not read must be training-only or neutral.
    pub(crate) fn finish(&self) -> Result<()> {
        let used = self.used.borrow();
        for (k, v) in self.entries() {
            let Some(name) = k.as_str() else { continue };
            if used.contains(name) || TRAINING_ONLY.contains(&name) || is_neutral(v) {
                continue;
            }
            return Err(PolicyError::UnsupportedField {
                path: self.path.clone(),
                class: self.class.clone(),
                field: name.to_owned(),
                value: v.to_string(),
            });
        }
        Ok(())
    }
}

fn parent(path: &str) -> String {
    path.rsplit_once('.').map_or_else(String::new, |(p, _)| p.to_owned())
}

fn last(path: &str) -> String {
    path.rsplit_once('.').map_or(path, |(_, l)| l).to_owned()
}

/// `None`, `False`, an empty container or string: what an optional
/// feature's default looks like.
fn is_neutral(v: &Node) -> bool {
    match v {
        Node::None | Node::Bool(false) => true,
        Node::Str(s) => s.is_empty(),
        Node::List(xs) | Node::Tuple(xs) | Node::Set(xs) => xs.is_empty(),
        Node::Dict(d) => d.entries().is_empty(),
        _ => false,
    }
}

/// For the operations' own parsing: the same object reader.
pub(crate) fn op_fields(node: &Node, path: &str) -> Result<(String, Vec<(String, Node)>)> {
    let o = Obj::new(node, path)?;
    let fields = o.entries().iter().filter_map(|(k, v)| Some((k.as_str()?.to_owned(), v.clone()))).collect();
    Ok((o.class.clone(), fields))
}
