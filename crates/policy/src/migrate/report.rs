//! What a migration did, key by key: the record a user reads before
//! trusting a migrated run, and what `--json` prints.

use serde::Serialize;

/// What happened to one config key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// A component (reward, termination, observation) mapped onto today's
    /// function with the same math; its parameters carried over.
    Mapped,
    /// A field carried over under today's name.
    Renamed,
    /// An old field today's class does not have: not carried.
    Dropped,
    /// A field today's class has and the old release did not: today's default.
    Defaulted,
    /// A value set by a rule so that today's code computes what the old release did.
    Set,
    /// The old value could not be carried (another class there today): today's kept.
    KeptToday,
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Entry {
    /// The file it concerns: `configs` (both resolved-configs files) or `checkpoint`.
    pub file: &'static str,
    /// The dotted key in today's layout (the old key for `dropped`).
    pub key: String,
    /// What happened.
    pub action: Action,
    /// The old key, class or function, where it differs from `key`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Today's class, function or value, where it matters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// Why, for rules and mapped components.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// `v3.1` or `v3.0`.
    pub release: &'static str,
    /// `ppo_tracker`.
    pub family: &'static str,
    /// The old robot config's class.
    pub robot: String,
    /// The template of today's configs the old values were laid onto.
    pub template: &'static str,
    /// The old checkpoint.
    pub old_checkpoint: String,
    /// The old configs file read.
    pub old_configs: String,
    /// Files written into OUT_DIR, in order.
    pub written: Vec<String>,
    /// What happened, key by key.
    pub entries: Vec<Entry>,
    /// What the migrated files are good for with today's code, and what
    /// was not checked.
    pub caveats: Vec<String>,
}

impl Report {
    /// Adds one entry.
    pub(crate) fn push(&mut self, key: impl Into<String>, action: Action) -> &mut Entry {
        self.entries.push(Entry { file: "configs", key: key.into(), action, from: None, to: None, note: None });
        let last = self.entries.len() - 1;
        &mut self.entries[last]
    }

    /// How many entries of one action.
    pub fn count(&self, action: Action) -> usize {
        self.entries.iter().filter(|e| e.action == action).count()
    }
}

impl Entry {
    /// Sets `from`.
    pub(crate) fn from(&mut self, s: impl Into<String>) -> &mut Self {
        self.from = Some(s.into());
        self
    }

    /// Sets `to`.
    pub(crate) fn to(&mut self, s: impl Into<String>) -> &mut Self {
        self.to = Some(s.into());
        self
    }

    /// Sets `note`.
    pub(crate) fn note(&mut self, s: impl Into<String>) -> &mut Self {
        self.note = Some(s.into());
        self
    }

    /// Marks it as about the checkpoint.
    pub(crate) fn checkpoint(&mut self) -> &mut Self {
        self.file = "checkpoint";
        self
    }
}
