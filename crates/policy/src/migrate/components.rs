//! v3.1's reward, termination and observation components as today's
//! `MdpComponent`s: each mapped through [`V31_COMPONENTS`] onto today's
//! template component computing the same function (its context bindings,
//! `dynamic_vars`, are today's), with v3.1's parameters as `static_params`.
//! One without a same-math counterpart is refused naming it, or dropped
//! (rewards and terminations only, `drop_unmatched_terms`) and reported:
//! training then runs without that term.

use pmstate_ckpt::{Dict, DictKind, Node};

use super::objects::{import_old, join, key_text, rebuild};
use super::read::field;
use super::report::{Action, Report};
use super::tables::{
    ComponentMap, Kind, ANCHOR_FRAME_WHY, DENSITY_WHY, NOT_IN_TEMPLATE_WHY, V31_COMPONENTS, V31_NO_COUNTERPART,
};
use super::MigrateError;

/// `module.name` of a global node.
fn global_name(n: Option<&Node>) -> Option<String> {
    match n {
        Some(Node::Global { module, name }) => Some(format!("{module}.{name}")),
        _ => None,
    }
}

/// What a component migration needs.
pub(crate) struct Ctx<'a> {
    /// The old configs file (for errors).
    pub file: &'a str,
    /// The old robot config (body-name groups, contact bodies).
    pub old_robot: Option<&'a Node>,
    /// Drop rewards/terminations without a counterpart instead of refusing.
    pub drop_unmatched: bool,
    /// The old robot's `anchor_body_index` (0, the root, when unset).
    pub old_anchor: i64,
}

/// Today's component table for `kind`, from v3.1's and the template's.
pub(crate) fn migrate_table(
    kind: Kind,
    today_env: &Node,
    old_env: &Node,
    ctx: &Ctx<'_>,
    report: &mut Report,
) -> Result<Node, MigrateError> {
    let key = join("env", kind.field());
    let empty = Dict::new(DictKind::Plain);
    let today = field(today_env, kind.field()).and_then(Node::as_dict).unwrap_or(&empty);
    let Some(old) = field(old_env, kind.field()).and_then(Node::as_dict) else {
        return Ok(Node::Dict(Dict::new(DictKind::Plain)));
    };
    let mut out = Vec::new();
    for (k, oc) in old.entries() {
        let name = key_text(k);
        let ckey = join(&key, &name);
        let old_fn = global_name(field(oc, "function")).ok_or_else(|| MigrateError::Malformed {
            file: ctx.file.to_owned(),
            key: join(&ckey, "function"),
            expected: "a function (global)",
            found: field(oc, "function").map_or("nothing", Node::kind).to_owned(),
        })?;
        let vars =
            field(oc, "variables").and_then(Node::as_dict).cloned().unwrap_or_else(|| Dict::new(DictKind::Plain));
        // v3.1's density-weighted rewards average over bodies with weights
        // today's functions do not take: never the same math
        let density = kind == Kind::Reward && matches!(field(oc, "use_density_weights"), Some(Node::Bool(true)));
        let found = if density { None } else { find_map(kind, &old_fn, &vars) };
        let template_comp = found.and_then(|map| {
            let fits = |c: &&Node| {
                global_name(field(c, "compute_func")).as_deref() == Some(map.today_fn)
                    && map.today_noisy.is_none_or(|noisy| reads_noisy(c) == noisy)
                    && map.today_binds.iter().all(|(arg, path)| binding_path(c, arg).as_deref() == Some(*path))
            };
            today
                .get(&name)
                .filter(fits)
                .or_else(|| today.entries().iter().map(|(_, v)| v).find(fits))
                .map(|tc| (map, tc))
        });
        // v3.1 takes it in the root's frame; today's, bound to the anchor,
        // in the anchor body's: only the same where the anchor is the root
        let anchor_bound = template_comp.is_some_and(|(map, tc)| {
            map.root_frame && ctx.old_anchor != 0 && binding_path(tc, "anchor_body_index").is_some()
        });
        let Some((map, tc)) = template_comp.filter(|_| !anchor_bound) else {
            let why = match found {
                Some(map) if anchor_bound => {
                    format!("{}: {ANCHOR_FRAME_WHY} (robot.anchor_body_index {})", map.today_fn, ctx.old_anchor)
                }
                Some(map) => format!("{}: {NOT_IN_TEMPLATE_WHY}", map.today_fn),
                None if density => DENSITY_WHY.to_owned(),
                None => no_counterpart_why(&old_fn, &vars),
            };
            if ctx.drop_unmatched && kind != Kind::Observation {
                report
                    .push(ckey, Action::Dropped)
                    .from(old_fn)
                    .note(format!("no same-math counterpart today ({why}); training runs without this term"));
                continue;
            }
            return Err(MigrateError::NoCounterpart { file: ctx.file.to_owned(), key: ckey, function: old_fn, why });
        };
        let params = match static_params(kind, map, oc, &vars, tc, ctx, &ckey) {
            Ok(p) => p,
            // its function is matched but not these parameters: the same
            // choice as a term without a counterpart
            Err(MigrateError::NoCounterpart { why, .. }) if ctx.drop_unmatched && kind != Kind::Observation => {
                report
                    .push(ckey, Action::Dropped)
                    .from(old_fn)
                    .note(format!("no same-math counterpart today ({why}); training runs without this term"));
                continue;
            }
            Err(e) => return Err(e),
        };
        let mut comp = match tc {
            Node::Object(o) => (**o).clone(),
            _ => unreachable_component(ctx.file, &ckey)?,
        };
        let Some(fields) = comp.fields() else { return unreachable_component(ctx.file, &ckey).map(|_| Node::None) };
        let entries: Vec<(Node, Node)> = fields
            .entries()
            .iter()
            .map(|(fk, fv)| {
                if fk.as_str() == Some("static_params") {
                    (fk.clone(), params.clone())
                } else {
                    (fk.clone(), fv.clone())
                }
            })
            .collect();
        comp.state = Some(Node::Dict(rebuild(fields, entries, &ckey)?));
        let e = report.push(ckey, Action::Mapped);
        e.from(old_fn).to(map.today_fn);
        if !map.note.is_empty() {
            e.note(map.note);
        }
        out.push((k.clone(), Node::Object(Box::new(comp))));
    }
    Ok(Node::Dict(rebuild(today, out, &key)?))
}

/// The context path (`parent.name`, or `name` at the top) today's component
/// binds `arg` to: its `dynamic_vars` entry, a pickled `FieldPath` whose
/// state holds `name` and `_parent_path`.
fn binding_path(c: &Node, arg: &str) -> Option<String> {
    fn slots(n: &Node) -> Option<&Dict> {
        match n {
            Node::Dict(d) if d.get("name").is_some() => Some(d),
            Node::Tuple(v) | Node::List(v) => v.iter().find_map(slots),
            Node::Object(o) => o.state.as_ref().and_then(slots),
            _ => None,
        }
    }
    let fp = field(c, "dynamic_vars").and_then(Node::as_dict)?.get(arg)?;
    let d = slots(fp)?;
    let name = d.get("name")?.as_str()?;
    match d.get("_parent_path").and_then(Node::as_str) {
        Some(parent) if !parent.is_empty() => Some(format!("{parent}.{name}")),
        _ => Some(name.to_owned()),
    }
}

/// Whether a context path is one of today's noisy views (`noisy`,
/// `noisy_historical`) or under one.
fn is_noisy_view(p: &str) -> bool {
    ["noisy", "noisy_historical"].iter().any(|v| p == *v || p.strip_prefix(v).is_some_and(|r| r.starts_with('.')))
}

/// Whether a template component binds today's noisy context (a
/// `dynamic_vars` field path under `noisy` or `noisy_historical`).
fn reads_noisy(c: &Node) -> bool {
    fn walk(n: &Node) -> bool {
        match n {
            Node::Dict(d) => d
                .entries()
                .iter()
                .any(|(k, v)| (k.as_str() == Some("_parent_path") && v.as_str().is_some_and(is_noisy_view)) || walk(v)),
            Node::List(v) | Node::Tuple(v) => v.iter().any(walk),
            Node::Object(o) => o.state.as_ref().is_some_and(walk),
            _ => false,
        }
    }
    field(c, "dynamic_vars").is_some_and(walk)
}

fn unreachable_component(file: &str, key: &str) -> Result<pmstate_ckpt::Object, MigrateError> {
    Err(MigrateError::Malformed {
        file: file.to_owned(),
        key: key.to_owned(),
        expected: "today's MdpComponent in the template",
        found: "another value".into(),
    })
}

/// The table entry for a v3.1 component: its function and exactly its
/// context bindings.
fn find_map(kind: Kind, old_fn: &str, vars: &Dict) -> Option<&'static ComponentMap> {
    let bound: Vec<(String, String)> =
        vars.entries().iter().filter_map(|(k, v)| v.as_str().map(|s| (key_text(k), s.to_owned()))).collect();
    V31_COMPONENTS.iter().find(|m| {
        m.kind == kind
            && m.old_fn == old_fn
            && m.bindings.len() == bound.len()
            && m.bindings.iter().all(|(k, v)| bound.iter().any(|(bk, bv)| bk == k && bv == v))
    })
}

fn no_counterpart_why(old_fn: &str, vars: &Dict) -> String {
    for n in V31_NO_COUNTERPART {
        if n.old_fn == old_fn && n.bindings.iter().all(|(k, v)| vars.get(k).and_then(Node::as_str) == Some(*v)) {
            return n.why.to_owned();
        }
    }
    "not a function (with these context bindings) whose math migrate has matched to today's".to_owned()
}

/// Today's `static_params` for a mapped component.
fn static_params(
    kind: Kind,
    map: &ComponentMap,
    oc: &Node,
    vars: &Dict,
    today: &Node,
    ctx: &Ctx<'_>,
    key: &str,
) -> Result<Node, MigrateError> {
    let refuse = |why: String| MigrateError::NoCounterpart {
        file: ctx.file.to_owned(),
        key: key.to_owned(),
        function: map.old_fn.to_owned(),
        why,
    };
    for (var, want) in map.require {
        let got = vars.get(var).map_or("null".to_owned(), |v| {
            if matches!(v, Node::None) {
                "null".into()
            } else {
                v.kind().into()
            }
        });
        if got != *want {
            return Err(refuse(format!("variables.{var} is set ({got}); only {want} is mapped")));
        }
    }
    let today_params = field(today, "static_params").and_then(Node::as_dict);
    // observations keep today's structural parameters (history_steps);
    // rewards and terminations take exactly the old release's
    let mut entries: Vec<(Node, Node)> = match (kind, today_params) {
        (Kind::Observation, Some(p)) => p.entries().to_vec(),
        _ => Vec::new(),
    };
    let mut set = |name: &str, v: Node| {
        if let Some(slot) = entries.iter_mut().find(|(k, _)| k.as_str() == Some(name)) {
            slot.1 = v;
        } else {
            entries.push((Node::Str(name.to_owned()), v));
        }
    };
    if kind == Kind::Reward {
        set("weight", import_old(field(oc, "weight").unwrap_or(&Node::Float(1.0))));
    }
    for (old, new) in map.params {
        if let Some(v) = vars.get(old) {
            set(new, import_old(v));
        }
    }
    match kind {
        Kind::Reward => {
            for opt in ["min_value", "max_value"] {
                if let Some(v) = field(oc, opt).filter(|v| !matches!(v, Node::None)) {
                    set(opt, import_old(v));
                }
            }
            if matches!(field(oc, "zero_during_grace_period"), Some(Node::Bool(true))) {
                set("zero_during_grace_period", Node::Bool(true));
            }
            // (use_density_weights = True never gets here: unmatched, see migrate_table)
            if matches!(field(oc, "multiplicative"), Some(Node::Bool(true))) {
                return Err(refuse("multiplicative = True is not mapped to today's MdpComponent".into()));
            }
        }
        Kind::Termination => {
            if matches!(field(oc, "terminate_on_true"), Some(Node::Bool(false))) {
                return Err(refuse("terminate_on_true = False is not mapped".into()));
            }
        }
        Kind::Observation => {}
    }
    check_indices(map, oc, ctx).map_err(refuse)?;
    let kind_of = today_params.map_or(DictKind::Plain, Dict::kind);
    Dict::from_entries(kind_of, entries).map(Node::Dict).map_err(|_| MigrateError::Malformed {
        file: ctx.file.to_owned(),
        key: join(key, "static_params"),
        expected: "unique keys",
        found: "a repeated key".into(),
    })
}

/// v3.1's `indices_subset`: none, or (contact matching) body-name groups
/// naming exactly the robot's contact bodies.
fn check_indices(map: &ComponentMap, oc: &Node, ctx: &Ctx<'_>) -> Result<(), String> {
    let Some(Node::List(groups)) = field(oc, "indices_subset") else { return Ok(()) };
    if map.today_fn != "protomotions.envs.rewards.regularization.compute_contact_match_rew" {
        return Err("indices_subset is set; today's function has no body subset".into());
    }
    let robot = ctx.old_robot.ok_or("no robot config to resolve indices_subset")?;
    let naming = field(robot, "common_naming_to_robot_body_names").and_then(Node::as_dict);
    let mut bodies: Vec<String> = Vec::new();
    for g in groups {
        let g = g.as_str().ok_or("indices_subset holds a non-string")?;
        match naming.and_then(|d| d.get(g)) {
            Some(Node::List(names)) => bodies.extend(names.iter().filter_map(Node::as_str).map(str::to_owned)),
            _ => bodies.push(g.to_owned()),
        }
    }
    let mut contact: Vec<String> = match field(robot, "contact_bodies") {
        Some(Node::List(names)) => names.iter().filter_map(Node::as_str).map(str::to_owned).collect(),
        _ => Vec::new(),
    };
    bodies.sort();
    bodies.dedup();
    contact.sort();
    if bodies != contact {
        let today = if contact.is_empty() {
            "(none: the robot names no contact_bodies)".to_owned()
        } else {
            contact.join(", ")
        };
        return Err(format!(
            "indices_subset names bodies {} but today's contact_body_ids are the robot's contact_bodies {today}",
            bodies.join(", "),
        ));
    }
    Ok(())
}
