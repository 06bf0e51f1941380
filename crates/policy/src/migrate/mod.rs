//! `pmstate migrate`: a v3.1 motion tracker's checkpoint and configs made
//! loadable by today's ProtoMotions (commit 607ca7a0), for evaluation and
//! for resuming training, with the same model outputs.
//!
//! Today's ProtoMotions cannot unpickle v3.1's configs (classes such as
//! `envs.obs.observation_component.ObservationComponentConfig` are gone),
//! so nothing of the old file can be loaded by it. `migrate` reads the old
//! configs inertly (`read`), lays their values onto a recorded template
//! of today's configs for the same robot (`templates`, `objects`):
//! every object keeps exactly today's fields, the old value where the old
//! release had the field (renamed per `tables`), today's default where
//! it had none; the reward, termination and observation components are
//! mapped one by one onto today's functions with the same math
//! (`components`); a few values are set by rule so today's code computes
//! what the old release did (below). The checkpoint's state dict needs no
//! renames (`state_dict`). Every decision is in the [`Report`].
//!
//! Rules (v3.1):
//! - `agent.model` normalizers: today's `norm_ema_decay` (absent in v3.1)
//!   is set to None: v3.1's running statistics are Welford's, and today's
//!   default (an EMA) would update the loaded moments differently on resume;
//! - `env.action_config`: v3.1's model ends in its own `output_activation`
//!   (kept) and its env clamps actions to `robot.control.clamp_actions`; today's
//!   template applies tanh in the action function, which would apply it twice,
//!   so `action_transform` becomes `clamp` with v3.1's bound;
//! - `env.num_state_history_steps`: at least today's template value (today's
//!   `previous_actions` observation reads the state history buffer);
//! - `agent.model` actor: `learnable_std` False (v3.1's log std is fixed).
//!
//! The template's action config holds tensors computed from the template
//! robot; the old robot must have the same joint limits, gains and action
//! scale (`action_source`).
//!
//! Refused, as typed [`MigrateError`]s: v3.0 (its observations are computed
//! in code, see `tables`), anything but a PPO motion tracker, a robot and
//! terrain without a recorded template (today: SMPL on flat and complex
//! terrain, G1 on flat), a model input no component computes (but the
//! terrain height map on complex terrain, `tables::CODE_INPUTS`), a component without a
//! same-math counterpart, or whose counterpart today's template does not
//! hold (its context bindings are the template's, never made up), unless
//! `drop_unmatched_terms`, rewards and terminations only: then it is
//! dropped and the report says training runs without it; a template whose
//! action function is not today's transform + clamp; a robot whose action
//! source differs from the template's.
//!
//! The G1 tracker (template `g1_tracker`: today's mlp_bm_l2c2 experiment
//! given v3.1's history and root-frame observations, anchor terms and the
//! generic PD action config from today's factories, by record_migrate.py)
//! migrates with its density-weighted rewards, physical action rate, soft
//! joint-limit reward and relative-body termination dropped (no same-math
//! counterpart, see `tables`).

mod action_source;
mod components;
mod error;
mod inference;
mod objects;
mod read;
mod report;
mod state_dict;
mod tables;
mod templates;
mod write;

use std::path::Path;

use pmstate_ckpt::{Checkpoint, Node};

pub use error::MigrateError;
pub use read::Release;
pub use report::{Action, Entry, Report};
pub use write::OUTPUT_FILES;

use components::Ctx;
use objects::{assemble, short, Overlay};
use read::field;
use tables::{Kind, V31_FIELD_RENAMES, V31_RULE_KEYS};

/// The top-level keys of a resolved-configs file (train_agent.py's save_configs order).
const TOP_KEYS: [&str; 7] = ["robot", "simulator", "terrain", "scene_lib", "motion_lib", "env", "agent"];

/// How to migrate.
#[derive(Debug, Clone, Copy, Default)]
pub struct MigrateOptions {
    /// Replace migrate's own files in an existing OUT_DIR (anything else there is still refused).
    pub force: bool,
    /// Drop rewards and terminations that have no same-math counterpart
    /// today instead of refusing (each is reported; training then runs without it).
    pub drop_unmatched_terms: bool,
}

/// A migration done in memory: what [`migrate`] writes.
pub struct Migrated {
    /// What was done.
    pub report: Report,
    /// The checkpoint (`last.ckpt`).
    pub checkpoint: Checkpoint,
    /// `resolved_configs.pt`.
    pub training: Checkpoint,
    /// `resolved_configs_inference.pt`.
    pub inference: Checkpoint,
}

/// Migrates in memory: reads `old_ckpt` and the resolved configs next to it.
///
/// # Errors
///
/// [`MigrateError`]: the files cannot be read, or are not a release and
/// family `migrate` handles, or hold something today's code has no
/// equivalent for (named).
pub fn plan(old_ckpt: &Path, opts: &MigrateOptions) -> Result<Migrated, MigrateError> {
    let configs_path = read::find_configs(old_ckpt)?;
    let old = read::read(&configs_path)?;
    let terrain = old.configs.get("terrain").and_then(read::class_of);
    let template = templates::for_configs(&old.robot_class, terrain.as_deref(), &old.file)?;
    let mut report = Report {
        release: old.release.name(),
        family: "ppo_tracker",
        robot: old.robot_class.clone(),
        template: template.name,
        old_checkpoint: old_ckpt.display().to_string(),
        old_configs: old.file.clone(),
        written: Vec::new(),
        entries: Vec::new(),
        caveats: Vec::new(),
    };
    check_inputs(&old, template, &mut report)?;
    let checkpoint = state_dict::read(old_ckpt, &mut report)?;
    let today = template.open(false)?;
    let today_inference = template.open(true)?;
    let root = migrate_configs(&old, &today, &mut report, opts)?;
    action_source::check(&old, &today, template.name)?;
    // the inference file: the migrated training configs with today's
    // inference overrides (what apply_all_inference_overrides changed in
    // the template: no termination, endless episodes, ...)
    let mut overridden = Vec::new();
    let inference_root = inference::apply(root.clone(), today.root(), today_inference.root(), "", &mut overridden);
    for key in overridden {
        report.push(key, Action::Set).note("resolved_configs_inference.pt only: today's inference override");
    }
    let training = assemble(root, &today, &old.configs)?;
    let inference = assemble(inference_root, &today, &old.configs)?;
    report.caveats = caveats(&report);
    Ok(Migrated { report, checkpoint, training, inference })
}

/// Migrates `old_ckpt` into `out_dir` (created; refused when it holds files,
/// unless `force` and they are migrate's own): last.ckpt, resolved_configs.pt,
/// resolved_configs_inference.pt and migrate_report.json, each written
/// atomically.
///
/// # Errors
///
/// As [`plan`], and [`MigrateError::OutDirNotEmpty`] or a write failure.
pub fn migrate(old_ckpt: &Path, out_dir: &Path, opts: &MigrateOptions) -> Result<Report, MigrateError> {
    let m = plan(old_ckpt, opts)?;
    write::prepare(out_dir, opts.force)?;
    write::torch_file(&m.checkpoint, &out_dir.join(OUTPUT_FILES[0]), false)?;
    write::torch_file(&m.training, &out_dir.join(OUTPUT_FILES[1]), true)?;
    write::torch_file(&m.inference, &out_dir.join(OUTPUT_FILES[2]), true)?;
    let mut report = m.report;
    report.written = OUTPUT_FILES.iter().map(|f| (*f).to_owned()).collect();
    let json = serde_json::to_vec_pretty(&report).map_err(|e| MigrateError::Io {
        path: out_dir.join(OUTPUT_FILES[3]).display().to_string(),
        source: std::io::Error::other(e),
    })?;
    write::json_file(&json, &out_dir.join(OUTPUT_FILES[3]))?;
    Ok(report)
}

/// One configs file: the template with the old values laid on.
fn migrate_configs(
    old: &read::Old,
    template: &Checkpoint,
    report: &mut Report,
    opts: &MigrateOptions,
) -> Result<Node, MigrateError> {
    let Node::Dict(root) = template.root() else {
        return Err(MigrateError::Malformed {
            file: template.path_str().to_owned(),
            key: "(root)".into(),
            expected: "a dict",
            found: template.root().kind().into(),
        });
    };
    let mut overlay = Overlay { report, renames: V31_FIELD_RENAMES, rule_keys: V31_RULE_KEYS };
    let mut entries = Vec::with_capacity(root.len());
    for (k, tv) in root.entries() {
        let key = objects::key_text(k);
        let v = match old.configs.get(&key) {
            Some(ov) if TOP_KEYS.contains(&key.as_str()) => overlay.overlay(tv, ov, &key)?,
            _ => tv.clone(),
        };
        entries.push((k.clone(), v));
    }
    let mut root = Node::Dict(objects::rebuild(root, entries, "(root)")?);
    apply_rules(&mut root, old, template, report, opts)?;
    Ok(root)
}

/// The component tables and the rules of the module docs.
fn apply_rules(
    root: &mut Node,
    old: &read::Old,
    template: &Checkpoint,
    report: &mut Report,
    opts: &MigrateOptions,
) -> Result<(), MigrateError> {
    let old_env = old.configs.get("env").cloned().unwrap_or(Node::None);
    let today_env = template.get("env").cloned().unwrap_or(Node::None);
    let ctx = Ctx {
        file: &old.file,
        old_robot: old.configs.get("robot"),
        drop_unmatched: opts.drop_unmatched_terms,
        old_anchor: old.configs.get("robot.anchor_body_index").and_then(Node::as_i64_opt).unwrap_or(0),
    };
    let mut tables = Vec::new();
    for kind in [Kind::Reward, Kind::Termination, Kind::Observation] {
        tables.push((kind.field(), components::migrate_table(kind, &today_env, &old_env, &ctx, report)?));
    }
    let env = object_fields_mut(root, "env", &old.file)?;
    for (name, table) in tables {
        env.insert(name, table);
    }
    // state history: at least what today's observations read
    let old_h = field(&old_env, "num_state_history_steps").and_then(Node::as_i64_opt).unwrap_or(0);
    let today_h = field(&today_env, "num_state_history_steps").and_then(Node::as_i64_opt).unwrap_or(0);
    let h = old_h.max(today_h);
    env.insert("num_state_history_steps", Node::Int(h));
    if h != old_h {
        report
            .push("env.num_state_history_steps", Action::Set)
            .from(old_h.to_string())
            .to(h.to_string())
            .note("today's previous_actions observation reads the state history buffer");
    }
    // actions: v3.1 clamps to robot.control.clamp_actions, its model applies its own output activation
    let clamp = old.configs.get("robot.control.clamp_actions").cloned().unwrap_or(Node::None);
    if let Some(Node::Dict(ac)) = env.get_mut("action_config") {
        // today's G1 experiment computes PD targets in its own action
        // function (bm_pd_action, its own per-joint scales and gains), not
        // by today's transform + clamp: v3.1's actions would drive other targets
        if ac.get("action_transform").is_none() {
            let class = global_name_of(ac.get("fn")).unwrap_or_else(|| "a dict without action_transform".into());
            return Err(MigrateError::NotMigratable {
                file: old.file.clone(),
                release: old.release.name(),
                key: "env.action_config".into(),
                class,
                why: "today's template computes actions with its own action function, not today's \
                      action_transform with v3.1's clamp, so v3.1's policy outputs would become other PD targets"
                    .into(),
            });
        }
        let (transform, note) = match clamp {
            Node::None => (Node::None, "v3.1 leaves actions unbounded when robot.control.clamp_actions is None"),
            _ => (Node::Str("clamp".into()), "v3.1's env clamps actions to robot.control.clamp_actions; its model's own output activation is kept, so today's tanh would apply twice"),
        };
        report.push("env.action_config.action_transform", Action::Set).to(short(&transform)).note(note);
        ac.insert("action_transform", transform);
        if !matches!(clamp, Node::None) {
            report
                .push("env.action_config.clamp_value", Action::Set)
                .to(short(&clamp))
                .from("robot.control.clamp_actions");
            ac.insert("clamp_value", clamp);
        }
    }
    // normalizers: Welford, as v3.1 trained them
    let agent = object_fields_mut(root, "agent", &old.file)?;
    if let Some(model) = agent.get_mut("model") {
        set_everywhere(model, "norm_ema_decay", &Node::None, "agent.model", WELFORD_NOTE, report);
        // the actor's log std: a constant in v3.1
        set_everywhere(model, "learnable_std", &Node::Bool(false), "agent.model", FIXED_STD_NOTE, report);
    }
    Ok(())
}

/// Every input the old model reads must be an observation component
/// (migrate maps components only) or one both releases' envs compute in
/// the same code from a config carried over ([`tables::CODE_INPUTS`]: the
/// `terrain` height map on a complex terrain); any other is refused naming it.
fn check_inputs(old: &read::Old, template: &templates::Template, report: &mut Report) -> Result<(), MigrateError> {
    let Some(Node::List(keys)) = old.configs.get("agent.model.in_keys") else { return Ok(()) };
    let components = old.configs.get("env.observation_components").and_then(Node::as_dict);
    for key in keys.iter().filter_map(Node::as_str) {
        if components.is_some_and(|c| c.get(key).is_some()) {
            continue;
        }
        if let Some(code) =
            tables::CODE_INPUTS.iter().find(|c| c.key == key && c.terrain_class == template.terrain_class)
        {
            report.push(format!("agent.model.in_keys.{key}"), Action::Mapped).to(code.computed_by).note(code.note);
            continue;
        }
        return Err(MigrateError::NotMigratable {
            file: old.file.clone(),
            release: old.release.name(),
            key: "agent.model.in_keys".into(),
            class: key.to_owned(),
            why: format!(
                "the model reads `{key}`, which no observation component computes: the old release's env computes \
                 it in code, and migrate maps such an input only where today's env computes it the same way from a \
                 config carried over (the `terrain` height map, on a complex terrain)"
            ),
        });
    }
    Ok(())
}

/// `module.name` of a global (a function in a config), if it is one.
fn global_name_of(n: Option<&Node>) -> Option<String> {
    match n {
        Some(Node::Global { module, name }) => Some(format!("{module}.{name}")),
        _ => None,
    }
}

/// `root[key]`'s fields, mutably.
fn object_fields_mut<'a>(
    root: &'a mut Node,
    key: &str,
    file: &str,
) -> Result<&'a mut pmstate_ckpt::Dict, MigrateError> {
    let malformed = || MigrateError::Malformed {
        file: file.to_owned(),
        key: key.to_owned(),
        expected: "a dataclass",
        found: "another value".into(),
    };
    let Node::Dict(d) = root else { return Err(malformed()) };
    match d.get_mut(key) {
        Some(Node::Object(o)) => match o.state.as_mut() {
            Some(Node::Dict(f)) => Ok(f),
            _ => Err(malformed()),
        },
        _ => Err(malformed()),
    }
}

/// Why the normalizers' `norm_ema_decay` is set to None.
const WELFORD_NOTE: &str = "v3.1's normalizers keep Welford running statistics; today's EMA default would \
    update the loaded moments differently";
/// Why the actor's `learnable_std` is set to False.
const FIXED_STD_NOTE: &str = "v3.1's actor keeps its log std fixed (a parameter without gradient); today's \
    template learns it (and adds an entropy bonus, agent.entropy_coef, only then)";

/// Sets `field` to `value` in every object of a subtree that has it with
/// another value, reporting each with `note`.
fn set_everywhere(n: &mut Node, name: &str, value: &Node, key: &str, note: &'static str, report: &mut Report) {
    match n {
        Node::Object(o) => {
            if let Some(Node::Dict(f)) = o.state.as_mut() {
                if let Some(v) = f.get_mut(name) {
                    if v != value {
                        report.push(format!("{key}.{name}"), Action::Set).from(short(v)).to(short(value)).note(note);
                        *v = value.clone();
                    }
                }
                let names: Vec<String> =
                    f.entries().iter().filter_map(|(k, _)| k.as_str().map(str::to_owned)).collect();
                for k in names {
                    if let Some(child) = f.get_mut(&k) {
                        set_everywhere(child, name, value, &format!("{key}.{k}"), note, report);
                    }
                }
            }
        }
        Node::List(v) => {
            for (i, c) in v.iter_mut().enumerate() {
                set_everywhere(c, name, value, &format!("{key}.{i}"), note, report);
            }
        }
        _ => {}
    }
}

/// What the report's reader must know.
fn caveats(report: &Report) -> Vec<String> {
    let mut c = vec![
        "model outputs: the migrated checkpoint and configs give v3.1's outputs with today's agent (verified by \
         testdata/migrate/record_migrate.py verify on the recorded case)"
            .to_owned(),
        "observations and rewards: mapped components compute v3.1's math with today's context; the env loop itself \
         (simulator, PD targets from today's action_config offsets/scales) was not run"
            .to_owned(),
    ];
    if std::path::Path::new(&report.old_configs).file_name().is_some_and(|n| n == "resolved_configs_inference.pt") {
        c.push(
            "training configs: no resolved_configs.pt next to the old checkpoint, so both migrated files come from the \
             old resolved_configs_inference.pt and carry the old release's inference overrides (e.g. no terminations, \
             endless episodes): resuming training from them trains with those"
                .to_owned(),
        );
    }
    let dropped: Vec<&str> = report
        .entries
        .iter()
        .filter(|e| e.action == Action::Dropped && e.key.starts_with("env.") && e.key.contains("_components."))
        .map(|e| e.key.as_str())
        .collect();
    if !dropped.is_empty() {
        c.push(format!(
            "resume: training continues WITHOUT {} (no same-math counterpart today); evaluation is unaffected",
            dropped.join(", ")
        ));
    }
    c
}

/// An int of a node, for the few integer fields the rules read.
trait AsI64 {
    fn as_i64_opt(&self) -> Option<i64>;
}

impl AsI64 for Node {
    fn as_i64_opt(&self) -> Option<i64> {
        match self {
            Node::Int(i) => Some(*i),
            _ => None,
        }
    }
}
