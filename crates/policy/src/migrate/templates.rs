//! Today's configs the old values are laid onto, recorded from today's
//! ProtoMotions by `testdata/migrate/record_migrate.py templates` (its own
//! `build_standard_configs` on the shipped experiment, then
//! `apply_all_inference_overrides` for the inference file): pickles of
//! today's dataclasses with every field today's classes have, so a
//! migrated object carries each attribute today's code reads, with today's
//! default where the old release has no counterpart. Data, not code: read
//! inertly like any other configs file.

use pmstate_ckpt::{Checkpoint, ReadOptions};

use super::MigrateError;

/// One recorded template.
pub(crate) struct Template {
    /// Its name in reports (`smpl_tracker`).
    pub name: &'static str,
    /// The robot config class it is for.
    pub robot_class: &'static str,
    /// The terrain config class it holds: an old run's terrain is carried
    /// only onto a template of its class (a template object of another
    /// class is kept as today's, which for the terrain would change what
    /// the robot walks on and what a terrain input reads).
    pub terrain_class: &'static str,
    /// `resolved_configs.pt` (training).
    pub training: &'static [u8],
    /// `resolved_configs_inference.pt`.
    pub inference: &'static [u8],
}

/// Every recorded template.
pub(crate) const TEMPLATES: &[Template] = &[
    Template {
        name: "smpl_tracker",
        robot_class: "protomotions.robot_configs.smpl.SmplRobotConfig",
        terrain_class: FLAT,
        training: include_bytes!("../../../../testdata/migrate/templates/smpl_tracker/resolved_configs.pt"),
        inference: include_bytes!("../../../../testdata/migrate/templates/smpl_tracker/resolved_configs_inference.pt"),
    },
    // today's PPO G1 tracker, examples/experiments/mimic/mlp_bm_l2c2.py,
    // given by record_migrate.py's g1_for_v31 (today's factories) the
    // history and root-frame observations, anchor terms and generic PD
    // action config v3.1's G1 tracker reads
    Template {
        name: "g1_tracker",
        robot_class: "protomotions.robot_configs.g1.G1RobotConfig",
        terrain_class: FLAT,
        training: include_bytes!("../../../../testdata/migrate/templates/g1_tracker/resolved_configs.pt"),
        inference: include_bytes!("../../../../testdata/migrate/templates/g1_tracker/resolved_configs_inference.pt"),
    },
    // today's smpl tracker on complex terrain, examples/experiments/mimic/mlp_complex_terrain.py
    // (v3.1's smpl-terrains tracker: the terrain height map as an input)
    Template {
        name: "smpl_terrains_tracker",
        robot_class: "protomotions.robot_configs.smpl.SmplRobotConfig",
        terrain_class: COMPLEX,
        training: include_bytes!("../../../../testdata/migrate/templates/smpl_terrains_tracker/resolved_configs.pt"),
        inference: include_bytes!(
            "../../../../testdata/migrate/templates/smpl_terrains_tracker/resolved_configs_inference.pt"
        ),
    },
];

/// Today's (and v3.1's) flat terrain config.
const FLAT: &str = "protomotions.components.terrains.config.TerrainConfig";
/// Today's (and v3.1's) complex terrain config.
pub(crate) const COMPLEX: &str = "protomotions.components.terrains.config.ComplexTerrainConfig";

/// The template for a robot class on a terrain class (the old terrain
/// config's; flat when the old configs name none).
pub(crate) fn for_configs(robot: &str, terrain: Option<&str>, file: &str) -> Result<&'static Template, MigrateError> {
    let terrain = terrain.unwrap_or(FLAT);
    let known = || {
        TEMPLATES
            .iter()
            .map(|t| format!("{} on {}", t.robot_class, short_class(t.terrain_class)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if !TEMPLATES.iter().any(|t| t.robot_class == robot) {
        return Err(MigrateError::NoTemplate { file: file.to_owned(), class: robot.to_owned(), known: known() });
    }
    TEMPLATES.iter().find(|t| t.robot_class == robot && t.terrain_class == terrain).ok_or_else(|| {
        MigrateError::NoTemplate { file: file.to_owned(), class: format!("{robot} on {terrain}"), known: known() }
    })
}

/// A class's name without its module.
fn short_class(q: &str) -> &str {
    q.rsplit('.').next().unwrap_or(q)
}

impl Template {
    /// The training or inference configs, parsed.
    pub(crate) fn open(&self, inference: bool) -> Result<Checkpoint, MigrateError> {
        let (bytes, name) = if inference {
            (self.inference, "resolved_configs_inference.pt")
        } else {
            (self.training, "resolved_configs.pt")
        };
        Ok(Checkpoint::from_bytes(
            bytes.to_vec(),
            &format!("<template {}/{name}>", self.name),
            &ReadOptions::default(),
        )?)
    }
}
