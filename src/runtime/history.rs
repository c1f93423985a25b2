//! History: retained generations and the operation log, and their
//! persistence in `runtime.state_dir`.
//!
//! Keeps the last `history_limit` generations (with the configuration text
//! each was built from, so any of them can be rolled back to; held
//! LZ4-compressed in memory) and the last 256 operations. With a state
//! dir, each retained text is written once, to `configs/<sha256>.toml`,
//! and after every change `state.json` names them, with the operation
//! log; both atomically (temporary file, fsync, rename, fsync of the
//! folder), the texts before the state file that names them, and texts
//! no retained generation names are removed after it. Without a state
//! dir, nothing touches the disk.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

use crate::config::ConfigText;
use crate::files::write_atomically;
use crate::ids::GenerationId;

/// How many operations the log keeps.
pub const OPERATION_LIMIT: usize = 256;
const STATE_FILE: &str = "state.json";
/// Where the retained configuration texts are, one file per distinct text.
const CONFIG_DIR: &str = "configs";

/// How a generation came to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Startup,
    Activate,
    Reload,
    Rollback,
    Upgrade,
    /// A pending generation rolled back by the gateway itself (its confirm
    /// deadline passed).
    AutoRollback,
    /// A source a newer cutover wrote into the state, read by this one
    /// (after a binary downgrade): kept, never refused.
    #[serde(other)]
    Other,
}

/// One retained generation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GenerationRecord {
    pub generation: GenerationId,
    pub config_version: String,
    pub activated_at: String,
    pub source: Source,
    pub rolled_back_to: Option<GenerationId>,
    pub requested_by: Option<String>,
    pub reason: Option<String>,
    /// The authenticated admin caller that made it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<String>,
    /// The configuration text it was built from.
    pub config: RetainedText,
    /// Where that text's relative file references resolve.
    pub base_dir: PathBuf,
    /// Where the text came from (a path, or `<admin>`).
    pub origin: String,
}

impl GenerationRecord {
    /// The configuration this generation was built from, ready to plan.
    pub fn config_text(&self) -> Result<ConfigText, HistoryError> {
        let text = self
            .config
            .text()
            .ok_or(HistoryError::Damaged(self.generation))?;
        Ok(ConfigText::inline(
            text,
            self.base_dir.clone(),
            &self.origin,
        ))
    }
}

/// A retained configuration text, held LZ4-compressed: TOML configurations
/// shrink about sixfold, and a gateway retains `history_limit` of them
/// (16 by default; 1.2 MB each at 10 000 routes). Serialised as the plain
/// text, so the state file and the upgrade handover read as before.
#[derive(Clone)]
pub struct RetainedText(Arc<[u8]>);

impl RetainedText {
    pub fn new(text: &str) -> Self {
        Self(lz4_flex::compress_prepend_size(text.as_bytes()).into())
    }

    /// The text; `None` only if the compressed bytes were damaged, which
    /// nothing outside this type can do.
    pub fn text(&self) -> Option<String> {
        let bytes = lz4_flex::decompress_size_prepended(&self.0).ok()?;
        String::from_utf8(bytes).ok()
    }
}

impl std::fmt::Debug for RetainedText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RetainedText({} bytes compressed)", self.0.len())
    }
}

impl Serialize for RetainedText {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.text() {
            Some(text) => serializer.serialize_str(&text),
            None => Err(serde::ser::Error::custom(
                "retained configuration text is damaged",
            )),
        }
    }
}

impl<'de> Deserialize<'de> for RetainedText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Ok(Self::new(&text))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OperationKind {
    Preview,
    Activate,
    Reload,
    Rollback,
    /// A pending generation made final.
    Confirm,
    /// A pending generation rolled back by an operator.
    Abort,
    /// A pending generation rolled back when its confirm deadline passed.
    AutoRollback,
    ReloadCerts,
    /// A certificate cutover obtained (ACME issuance or renewal, or one
    /// a fleet peer ordered), or an order that failed.
    Certificate,
    Drain,
    Upgrade,
    /// Objects forgot from cache zones (`POST /admin/cache/purge`).
    CachePurge,
    /// An operation a newer cutover recorded, read by this one (after a
    /// binary downgrade): listed as `other`, never a reason to refuse
    /// the state.
    #[serde(other)]
    Other,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Still under way (an upgrade waiting for the new process).
    Running,
    Succeeded,
    Unchanged,
    Rejected,
    Conflict,
    Failed,
    /// An outcome a newer cutover recorded (see [`OperationKind::Other`]).
    #[serde(other)]
    Other,
}

/// One entry of the operation log.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OperationRecord {
    pub id: String,
    pub kind: OperationKind,
    pub at: String,
    pub duration_ms: u64,
    pub outcome: Outcome,
    pub generation: Option<GenerationId>,
    pub previous_generation: Option<GenerationId>,
    pub requested_by: Option<String>,
    pub reason: Option<String>,
    /// The authenticated admin caller (`admin.callers`), beside the free
    /// text of `requested_by`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<String>,
    /// The freeze window an operation went through by `override`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overrode_freeze: Option<crate::plan::Frozen>,
    /// The callers that approved it (DESIGN §23: a proposal carried out).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approved_by: Vec<String>,
    pub summary: String,
    pub error: Option<String>,
    pub pid: u32,
    /// For a drain-aware restart: the process that handed over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_pid: Option<u32>,
    /// An activation's shadow stage, what it showed (DESIGN §22).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<super::shadow::ShadowReport>,
    /// A certificate operation's certificate (DESIGN §21).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate: Option<CertificateRecord>,
}

/// The certificate a certificate operation installed, or asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CertificateRecord {
    pub domains: Vec<String>,
    /// `issued` (the first), `renewed`, `stored` (from state_dir at
    /// start), `fleet` (a peer's order), `failed`.
    pub event: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_after: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
}

/// Everything that survives a restart.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PersistedState {
    pub generations: VecDeque<GenerationRecord>,
    pub operations: VecDeque<OperationRecord>,
    pub next_operation: u64,
    /// The generation awaiting confirmation, so that a restart or an
    /// upgrade during its window resumes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<PendingRecord>,
    /// Changes waiting for approval, and the last ones decided.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub proposals: Vec<super::proposals::ProposalRecord>,
    #[serde(default)]
    pub next_proposal: u64,
}

/// A pending generation as the state keeps it (DESIGN §14): what a
/// restart or an upgrade needs to take it up again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingRecord {
    pub generation: GenerationId,
    pub rollback_to: GenerationId,
    /// The confirm deadline, milliseconds since the Unix epoch; none when
    /// only a guard or a canary settles it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_unix_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guard: Option<GuardRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<CanaryRecord>,
}

/// A pending generation's guard, as activate was given it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GuardRecord {
    pub window_ms: u64,
    pub min_requests: u64,
    pub max_error_ratio: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_p99_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_block_ratio: Option<f64>,
    pub fail_on_no_data: bool,
    pub confirm_on_pass: bool,
}

/// A pending generation's canary: its steps and the one it is on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CanaryRecord {
    pub steps: Vec<u8>,
    pub step_interval_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash_key: Option<String>,
    /// Index into `steps`.
    pub step: usize,
}

/// `state.json` as written: each generation names its text's file in
/// `configs/` instead of carrying the text. (The upgrade handover passes
/// `PersistedState` itself, texts included.)
#[derive(Serialize)]
struct StoredState<'a> {
    generations: Vec<StoredRecord<'a>>,
    operations: &'a VecDeque<OperationRecord>,
    next_operation: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pending: Option<&'a PendingRecord>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    proposals: &'a [super::proposals::ProposalRecord],
    next_proposal: u64,
}

#[derive(Serialize)]
struct StoredRecord<'a> {
    generation: GenerationId,
    config_version: &'a str,
    activated_at: &'a str,
    source: Source,
    rolled_back_to: Option<GenerationId>,
    requested_by: &'a Option<String>,
    reason: &'a Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    caller: &'a Option<String>,
    config_file: &'a str,
    base_dir: &'a Path,
    origin: &'a str,
}

/// `state.json` as read: texts by file name, or inline (state files
/// written before texts moved to `configs/`).
#[derive(Deserialize)]
struct LoadedState {
    generations: VecDeque<LoadedRecord>,
    operations: VecDeque<OperationRecord>,
    next_operation: u64,
    #[serde(default)]
    pending: Option<PendingRecord>,
    #[serde(default)]
    proposals: Vec<super::proposals::ProposalRecord>,
    #[serde(default)]
    next_proposal: u64,
}

#[derive(Deserialize)]
struct LoadedRecord {
    generation: GenerationId,
    config_version: String,
    activated_at: String,
    source: Source,
    rolled_back_to: Option<GenerationId>,
    requested_by: Option<String>,
    reason: Option<String>,
    #[serde(default)]
    caller: Option<String>,
    #[serde(default)]
    config_file: Option<String>,
    #[serde(default)]
    config: Option<String>,
    base_dir: PathBuf,
    origin: String,
}

/// The change event an operation record makes, if any (previews change
/// nothing): on record, and again when a long one finishes (an upgrade).
fn said(events: &super::events::Events, record: &OperationRecord) {
    let kind = match record.kind {
        OperationKind::Preview | OperationKind::Other => return,
        OperationKind::Activate | OperationKind::Reload => "activation",
        OperationKind::Rollback => "rollback",
        OperationKind::Confirm => "confirmed",
        OperationKind::Abort => "aborted",
        OperationKind::AutoRollback => "auto_rolled_back",
        OperationKind::ReloadCerts => "reload_certs",
        OperationKind::Certificate => "certificate",
        OperationKind::Drain => "drain",
        OperationKind::Upgrade => "upgrade",
        OperationKind::CachePurge => "cache_purge",
    };
    let operation = serde_json::to_value(record).unwrap_or(serde_json::Value::Null);
    events.emit(
        kind,
        serde_json::json!({ "generation": record.generation, "operation": operation }),
    );
}

/// Retained generations (newest last) and the operation log.
#[derive(Debug)]
pub struct History {
    limit: usize,
    state_dir: Option<PathBuf>,
    state: PersistedState,
    /// The name of each retained generation's text file in `configs/`,
    /// hashed once per process.
    stored: HashMap<GenerationId, String>,
    /// Set while a new process owns the state dir (during and after a
    /// drain-aware restart): this process then writes nothing.
    handed_over: bool,
    /// Told of every operation recorded or finished (change events).
    events: Option<std::sync::Arc<super::events::Events>>,
}

/// `SystemTime` as RFC 3339, UTC, millisecond precision.
pub fn rfc3339(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}

impl History {
    pub fn new(limit: usize, state_dir: Option<PathBuf>, state: PersistedState) -> Self {
        let mut history = Self {
            limit: limit.max(1),
            state_dir,
            state,
            stored: HashMap::new(),
            handed_over: false,
            events: None,
        };
        history.trim();
        history
    }

    /// Reads the persisted state from `dir`, if there is any, with every
    /// retained text its `state.json` names.
    pub fn load(dir: &Path) -> Result<Option<PersistedState>, HistoryError> {
        let path = dir.join(STATE_FILE);
        let loaded: LoadedState = match std::fs::read(&path) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes).map_err(|e| HistoryError::Corrupt(path, e))?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(HistoryError::Io(path, e)),
        };
        let mut generations = VecDeque::with_capacity(loaded.generations.len());
        for record in loaded.generations {
            let text = match (record.config_file, record.config) {
                (Some(name), _) => {
                    // Only names this type writes: nothing outside `configs/`.
                    if !is_text_file_name(&name) {
                        return Err(HistoryError::Missing(record.generation));
                    }
                    let file = dir.join(CONFIG_DIR).join(name);
                    std::fs::read_to_string(&file).map_err(|e| HistoryError::Io(file, e))?
                }
                (None, Some(text)) => text,
                (None, None) => return Err(HistoryError::Missing(record.generation)),
            };
            generations.push_back(GenerationRecord {
                generation: record.generation,
                config_version: record.config_version,
                activated_at: record.activated_at,
                source: record.source,
                rolled_back_to: record.rolled_back_to,
                requested_by: record.requested_by,
                reason: record.reason,
                caller: record.caller,
                config: RetainedText::new(&text),
                base_dir: record.base_dir,
                origin: record.origin,
            });
        }
        Ok(Some(PersistedState {
            generations,
            operations: loaded.operations,
            next_operation: loaded.next_operation,
            pending: loaded.pending,
            proposals: loaded.proposals,
            next_proposal: loaded.next_proposal,
        }))
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    pub fn set_limit(&mut self, limit: usize) {
        self.limit = limit.max(1);
        self.trim();
    }

    fn trim(&mut self) {
        while self.state.generations.len() > self.limit {
            self.state.generations.pop_front();
        }
        while self.state.operations.len() > OPERATION_LIMIT {
            self.state.operations.pop_front();
        }
    }

    /// Newest first.
    pub fn generations(&self) -> impl Iterator<Item = &GenerationRecord> {
        self.state.generations.iter().rev()
    }

    /// Newest first.
    pub fn operations(&self) -> impl Iterator<Item = &OperationRecord> {
        self.state.operations.iter().rev()
    }

    pub fn generation(&self, id: GenerationId) -> Option<&GenerationRecord> {
        self.state.generations.iter().find(|g| g.generation == id)
    }

    /// The record retained just before `id`, if any.
    pub fn predecessor(&self, id: GenerationId) -> Option<&GenerationRecord> {
        self.state
            .generations
            .iter()
            .rev()
            .find(|g| g.generation < id)
    }

    pub fn operation(&self, id: &str) -> Option<&OperationRecord> {
        self.state.operations.iter().find(|o| o.id == id)
    }

    /// The newest generation id ever recorded.
    pub fn last_generation(&self) -> Option<GenerationId> {
        self.state.generations.back().map(|g| g.generation)
    }

    /// A fresh operation id (`op-000042`).
    pub fn next_operation_id(&mut self) -> String {
        self.state.next_operation += 1;
        format!("op-{:06}", self.state.next_operation)
    }

    pub fn record_generation(&mut self, record: GenerationRecord) {
        self.state.generations.push_back(record);
        self.trim();
    }

    pub fn record_operation(&mut self, record: OperationRecord) {
        if let Some(events) = &self.events {
            said(events, &record);
        }
        self.state.operations.push_back(record);
        self.trim();
    }

    /// Updates an operation already in the log (an upgrade finishing, a
    /// shadow report attached); a changed outcome is an event again.
    pub fn update_operation(&mut self, id: &str, update: impl FnOnce(&mut OperationRecord)) {
        if let Some(record) = self.state.operations.iter_mut().find(|o| o.id == id) {
            let before = record.outcome;
            update(record);
            if let Some(events) = self.events.as_ref().filter(|_| record.outcome != before) {
                said(events, record);
            }
        }
    }

    /// Tells `events` of every operation from now on.
    pub fn observe(&mut self, events: std::sync::Arc<super::events::Events>) {
        self.events = Some(events);
    }

    /// Sets (or clears) the pending generation; persisted with the next
    /// write.
    pub fn set_pending(&mut self, pending: Option<PendingRecord>) {
        self.state.pending = pending;
    }

    pub fn pending(&self) -> Option<&PendingRecord> {
        self.state.pending.as_ref()
    }

    /// Everything a new process needs to continue this history.
    /// Proposals: open ones and the last ones decided, oldest first.
    pub fn proposals(&self) -> &[super::proposals::ProposalRecord] {
        &self.state.proposals
    }

    /// Changes the proposals (and then keeps at most
    /// `proposals::CLOSED_LIMIT` closed ones); persisted with the next
    /// write.
    pub fn update_proposals<T>(
        &mut self,
        update: impl FnOnce(&mut Vec<super::proposals::ProposalRecord>) -> T,
    ) -> T {
        use super::proposals::{ProposalState, CLOSED_LIMIT};
        let out = update(&mut self.state.proposals);
        let closed = self
            .state
            .proposals
            .iter()
            .filter(|p| p.state != ProposalState::Open)
            .count();
        let mut extra = closed.saturating_sub(CLOSED_LIMIT);
        self.state.proposals.retain(|p| {
            let drop = extra > 0 && p.state != ProposalState::Open;
            if drop {
                extra -= 1;
            }
            !drop
        });
        out
    }

    /// A fresh proposal id (`p-000007`).
    pub fn next_proposal_id(&mut self) -> String {
        self.state.next_proposal += 1;
        format!("p-{:06}", self.state.next_proposal)
    }

    pub fn snapshot(&self) -> PersistedState {
        self.state.clone()
    }

    /// Stops (or resumes) writing the state dir while another process owns it.
    pub fn set_handed_over(&mut self, handed_over: bool) {
        self.handed_over = handed_over;
    }

    /// Writes the state when a state dir is configured: first each
    /// retained text not on disk yet (once per distinct text, named by
    /// its SHA-256), then `state.json`, then the removal of texts no
    /// retained generation names any more.
    pub fn persist(&mut self) -> Result<(), HistoryError> {
        let Some(dir) = self.state_dir.clone() else {
            return Ok(());
        };
        if self.handed_over {
            return Ok(());
        }
        let configs = dir.join(CONFIG_DIR);
        let mut names = Vec::with_capacity(self.state.generations.len());
        for record in &self.state.generations {
            let text = || {
                record
                    .config
                    .text()
                    .ok_or(HistoryError::Damaged(record.generation))
            };
            let name = match self.stored.get(&record.generation) {
                Some(name) => name.clone(),
                None => format!("{:x}.toml", Sha256::digest(text()?.as_bytes())),
            };
            // Checked every time rather than remembered: a new process
            // that took over and then failed may have removed a text
            // this one still retains.
            let file = configs.join(&name);
            if !file.is_file() {
                let text = text()?;
                write_atomically(&configs, &name, |out| out.write_all(text.as_bytes()))
                    .map_err(|e| HistoryError::Io(file, e))?;
            }
            self.stored.insert(record.generation, name.clone());
            names.push(name);
        }
        let stored = StoredState {
            generations: self
                .state
                .generations
                .iter()
                .zip(&names)
                .map(|(g, name)| StoredRecord {
                    generation: g.generation,
                    config_version: &g.config_version,
                    activated_at: &g.activated_at,
                    source: g.source,
                    rolled_back_to: g.rolled_back_to,
                    requested_by: &g.requested_by,
                    reason: &g.reason,
                    caller: &g.caller,
                    config_file: name,
                    base_dir: &g.base_dir,
                    origin: &g.origin,
                })
                .collect(),
            operations: &self.state.operations,
            next_operation: self.state.next_operation,
            pending: self.state.pending.as_ref(),
            proposals: &self.state.proposals,
            next_proposal: self.state.next_proposal,
        };
        write_atomically(&dir, STATE_FILE, |out| {
            serde_json::to_writer_pretty(out, &stored).map_err(std::io::Error::other)
        })
        .map_err(|e| HistoryError::Io(dir.join(STATE_FILE), e))?;
        let generations = &self.state.generations;
        self.stored
            .retain(|id, _| generations.iter().any(|g| g.generation == *id));
        remove_unnamed(&configs, &names);
        Ok(())
    }
}

/// `<64 lower-case hex digits>.toml`, as `persist` names texts.
fn is_text_file_name(name: &str) -> bool {
    name.strip_suffix(".toml").is_some_and(|hash| {
        hash.len() == 64
            && hash
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Removes the files in `configs` that `names` does not list (texts of
/// generations no longer retained, temporary files of a crashed write).
/// Best effort: a file left behind costs disk space, not correctness.
fn remove_unnamed(configs: &Path, names: &[String]) {
    let Ok(entries) = std::fs::read_dir(configs) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !names.iter().any(|n| name == n.as_str()) {
            if let Err(error) = std::fs::remove_file(entry.path()) {
                tracing::warn!(file = %entry.path().display(), %error, "cannot remove a configuration text no generation retains");
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("cannot read or write state file {0}: {1}")]
    Io(PathBuf, #[source] std::io::Error),
    #[error("state file {0} is not valid: {1}")]
    Corrupt(PathBuf, #[source] serde_json::Error),
    #[error("the retained configuration of generation {0} is damaged")]
    Damaged(GenerationId),
    #[error("the state file names no valid configuration text file for generation {0}")]
    Missing(GenerationId),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: u64) -> GenerationRecord {
        GenerationRecord {
            generation: GenerationId(id),
            config_version: format!("sha256:{id}"),
            activated_at: rfc3339(SystemTime::now()),
            source: Source::Activate,
            rolled_back_to: None,
            requested_by: None,
            reason: None,
            caller: None,
            config: RetainedText::new(""),
            base_dir: ".".into(),
            origin: "<test>".into(),
        }
    }

    #[test]
    fn keeps_only_the_limit() {
        let mut h = History::new(3, None, PersistedState::default());
        for id in 1..=10 {
            h.record_generation(record(id));
        }
        let ids: Vec<u64> = h.generations().map(|g| g.generation.0).collect();
        assert_eq!(ids, vec![10, 9, 8]);
        assert_eq!(
            h.predecessor(GenerationId(10)).map(|g| g.generation.0),
            Some(9)
        );
    }

    #[test]
    fn retained_text_is_compressed_and_serialised_as_plain_text() {
        let mut text = String::from("# écrit à la main\n");
        for i in 0..2_000 {
            text.push_str(&format!(
                "[[routes]]\nname = \"r{i}\"\nlisteners = [\"web\"]\npath_prefix = \"/api/{i}/\"\nupstream = \"u{}\"\n\n",
                i % 50
            ));
        }
        let mut r = record(3);
        r.config = RetainedText::new(&text);
        assert!(
            r.config.0.len() * 4 < text.len(),
            "{} bytes held for {}",
            r.config.0.len(),
            text.len()
        );
        assert_eq!(r.config_text().expect("readable").text, text);

        let json = serde_json::to_value(&r).expect("serialises");
        assert_eq!(json["config"].as_str(), Some(text.as_str()));
        let back: GenerationRecord = serde_json::from_value(json).expect("deserialises");
        assert_eq!(back.config.text().as_deref(), Some(text.as_str()));
    }

    #[test]
    fn damaged_retained_text_is_an_error_not_a_panic() {
        let mut r = record(4);
        r.config = RetainedText(Arc::from(&b"\x40\x00\x00\x00\xf0garbage"[..]));
        assert!(matches!(
            r.config_text(),
            Err(HistoryError::Damaged(GenerationId(4)))
        ));
        assert!(serde_json::to_string(&r).is_err());
    }

    #[test]
    fn persists_and_reloads() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut h = History::new(4, Some(dir.path().to_owned()), PersistedState::default());
        h.record_generation(record(5));
        let op = h.next_operation_id();
        assert_eq!(op, "op-000001");
        h.persist().expect("persists");
        let loaded = History::load(dir.path()).expect("reads").expect("exists");
        assert_eq!(loaded.generations.back().map(|g| g.generation.0), Some(5));
        assert_eq!(loaded.next_operation, 1);
    }

    fn with_text(id: u64, text: &str) -> GenerationRecord {
        let mut r = record(id);
        r.config = RetainedText::new(text);
        r
    }

    fn config_files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir.join(CONFIG_DIR))
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    /// The retained texts `dir` holds, oldest first.
    fn texts(dir: &Path) -> Vec<String> {
        History::load(dir)
            .expect("reads")
            .expect("exists")
            .generations
            .iter()
            .filter_map(|g| g.config.text())
            .collect()
    }

    #[test]
    fn texts_are_written_once_each_and_named_by_the_state_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut h = History::new(3, Some(dir.path().to_owned()), PersistedState::default());
        let (a, b) = ("[admin]\n# a\n", "[admin]\n# b\n");
        for (id, text) in [(1, a), (2, b), (3, a)] {
            h.record_generation(with_text(id, text));
            h.persist().expect("persists");
        }
        // Two distinct texts, two files; the state file carries none.
        let files = config_files(dir.path());
        assert_eq!(files.len(), 2, "{files:?}");
        let state = std::fs::read_to_string(dir.path().join(STATE_FILE)).expect("state");
        assert!(!state.contains("# a") && !state.contains("# b"), "{state}");
        for name in &files {
            assert!(state.contains(name.as_str()), "{state}");
        }
        // Written before the state file names it: unchanged on disk.
        let before = std::fs::metadata(dir.path().join(CONFIG_DIR).join(&files[0]))
            .and_then(|m| m.modified())
            .expect("mtime");
        h.persist().expect("persists again");
        let after = std::fs::metadata(dir.path().join(CONFIG_DIR).join(&files[0]))
            .and_then(|m| m.modified())
            .expect("mtime");
        assert_eq!(before, after);

        assert_eq!(texts(dir.path()), vec![a, b, a]);
    }

    #[test]
    fn texts_no_retained_generation_names_are_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut h = History::new(2, Some(dir.path().to_owned()), PersistedState::default());
        for id in 1..=4 {
            h.record_generation(with_text(id, &format!("# text {id}\n")));
            h.persist().expect("persists");
        }
        std::fs::write(dir.path().join(CONFIG_DIR).join(".stray.tmp-1"), "x").expect("write");
        h.persist().expect("persists");
        assert_eq!(config_files(dir.path()).len(), 2);
        assert_eq!(texts(dir.path()), vec!["# text 3\n", "# text 4\n"]);
    }

    #[test]
    fn a_text_removed_under_a_retaining_process_is_written_again() {
        // A new process that took over, trimmed and failed may have
        // removed a text the old one, serving again, still retains.
        let dir = tempfile::tempdir().expect("tempdir");
        let mut h = History::new(4, Some(dir.path().to_owned()), PersistedState::default());
        h.record_generation(with_text(1, "# one\n"));
        h.persist().expect("persists");
        for name in config_files(dir.path()) {
            std::fs::remove_file(dir.path().join(CONFIG_DIR).join(name)).expect("remove");
        }
        h.record_generation(with_text(2, "# two\n"));
        h.persist().expect("persists");
        assert_eq!(texts(dir.path()), vec!["# one\n", "# two\n"]);
    }

    #[test]
    fn a_state_file_with_inline_texts_still_loads() {
        let dir = tempfile::tempdir().expect("tempdir");
        let legacy = PersistedState {
            generations: [with_text(7, "# inline\n")].into(),
            operations: VecDeque::new(),
            next_operation: 3,
            pending: None,
            ..PersistedState::default()
        };
        std::fs::write(
            dir.path().join(STATE_FILE),
            serde_json::to_vec(&legacy).expect("json"),
        )
        .expect("write");
        let loaded = History::load(dir.path()).expect("reads").expect("exists");
        assert_eq!(
            loaded.generations[0].config.text().as_deref(),
            Some("# inline\n")
        );
        // The next write moves the text out of the state file.
        let mut h = History::new(4, Some(dir.path().to_owned()), loaded);
        h.persist().expect("persists");
        assert_eq!(config_files(dir.path()).len(), 1);
        let state = std::fs::read_to_string(dir.path().join(STATE_FILE)).expect("state");
        assert!(!state.contains("# inline"), "{state}");
    }

    /// A binary downgrade: the state a newer cutover wrote, with an
    /// operation kind, an outcome, a generation source and a shadow
    /// verdict this one does not know (and a field it has no place for),
    /// loads; those read as `other`, and the state is written again.
    #[test]
    fn a_state_file_from_a_newer_cutover_loads() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join(STATE_FILE),
            r##"{
  "generations": [{"generation": 4, "config_version": "v", "activated_at": "t",
    "source": "gitops_sync", "rolled_back_to": null, "requested_by": null,
    "reason": null, "config": "# newer\n", "base_dir": "/", "origin": "<admin>",
    "signed_by": "ci"}],
  "operations": [{"id": "op-9", "kind": "bulk_import", "at": "t", "duration_ms": 1,
    "outcome": "partially_applied", "generation": 4, "previous_generation": 3,
    "requested_by": null, "reason": null, "summary": "imported 3 of 4",
    "error": null, "pid": 1}],
  "next_operation": 10
}"##,
        )
        .expect("write");
        let loaded = History::load(dir.path())
            .expect("a newer state file reads")
            .expect("exists");
        assert_eq!(loaded.generations[0].source, Source::Other);
        let op = &loaded.operations[0];
        assert_eq!(
            (op.kind, op.outcome, op.summary.as_str()),
            (OperationKind::Other, Outcome::Other, "imported 3 of 4")
        );
        let verdict: super::super::shadow::ShadowVerdict =
            serde_json::from_str("\"skipped_for_load\"").expect("a newer verdict reads");
        assert_eq!(verdict, super::super::shadow::ShadowVerdict::Other);
        let mut h = History::new(4, Some(dir.path().to_owned()), loaded);
        h.persist().expect("persists");
        let again = History::load(dir.path()).expect("reads").expect("exists");
        assert_eq!(again.operations[0].kind, OperationKind::Other);
        assert_eq!(
            again.generations[0].config.text().as_deref(),
            Some("# newer\n")
        );
    }

    #[test]
    fn a_state_file_naming_a_file_outside_configs_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut h = History::new(4, Some(dir.path().to_owned()), PersistedState::default());
        h.record_generation(with_text(3, "# three\n"));
        h.persist().expect("persists");
        let state = std::fs::read_to_string(dir.path().join(STATE_FILE)).expect("state");
        let name = config_files(dir.path()).remove(0);
        std::fs::write(
            dir.path().join(STATE_FILE),
            state.replace(&name, "../../etc/passwd"),
        )
        .expect("write");
        assert!(matches!(
            History::load(dir.path()),
            Err(HistoryError::Missing(GenerationId(3)))
        ));
    }

    #[test]
    fn a_missing_text_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut h = History::new(4, Some(dir.path().to_owned()), PersistedState::default());
        h.record_generation(with_text(2, "# gone\n"));
        h.persist().expect("persists");
        let file = config_files(dir.path()).remove(0);
        std::fs::remove_file(dir.path().join(CONFIG_DIR).join(&file)).expect("remove");
        let error = History::load(dir.path()).expect_err("missing text");
        assert!(error.to_string().contains(&file), "{error}");
    }
}
