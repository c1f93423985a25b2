//! History: retained generations and the operation log, and their
//! persistence in `runtime.state_dir`.
//!
//! Keeps the last `history_limit` generations (with the configuration text
//! each was built from, so any of them can be rolled back to; held
//! LZ4-compressed in memory) and the last 256 operations. With a state dir, both are written after every change as
//! one JSON file, atomically: temporary file, fsync, rename, fsync of the
//! folder. Without one, nothing touches the disk.

use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::config::ConfigText;
use crate::ids::GenerationId;

/// How many operations the log keeps.
pub const OPERATION_LIMIT: usize = 256;
const STATE_FILE: &str = "state.json";

/// How a generation came to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Startup,
    Activate,
    Reload,
    Rollback,
    Upgrade,
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
/// (16 by default; 1.3 MiB each at 10 000 routes). Serialised as the plain
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
    ReloadCerts,
    Drain,
    Upgrade,
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
    pub summary: String,
    pub error: Option<String>,
    pub pid: u32,
    /// For a drain-aware restart: the process that handed over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_pid: Option<u32>,
}

/// Everything that survives a restart.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PersistedState {
    pub generations: VecDeque<GenerationRecord>,
    pub operations: VecDeque<OperationRecord>,
    pub next_operation: u64,
}

/// Retained generations (newest last) and the operation log.
#[derive(Debug)]
pub struct History {
    limit: usize,
    state_dir: Option<PathBuf>,
    state: PersistedState,
    /// Set while a new process owns the state dir (during and after a
    /// drain-aware restart): this process then writes nothing.
    handed_over: bool,
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
            handed_over: false,
        };
        history.trim();
        history
    }

    /// Reads the persisted state from `dir`, if there is any.
    pub fn load(dir: &Path) -> Result<Option<PersistedState>, HistoryError> {
        let path = dir.join(STATE_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| HistoryError::Corrupt(path, e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(HistoryError::Io(path, e)),
        }
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
        self.state.operations.push_back(record);
        self.trim();
    }

    /// Updates an operation already in the log (an upgrade finishing).
    pub fn update_operation(&mut self, id: &str, update: impl FnOnce(&mut OperationRecord)) {
        if let Some(record) = self.state.operations.iter_mut().find(|o| o.id == id) {
            update(record);
        }
    }

    /// Everything a new process needs to continue this history.
    pub fn snapshot(&self) -> PersistedState {
        self.state.clone()
    }

    /// Stops (or resumes) writing the state dir while another process owns it.
    pub fn set_handed_over(&mut self, handed_over: bool) {
        self.handed_over = handed_over;
    }

    /// Writes the state when a state dir is configured.
    pub fn persist(&self) -> Result<(), HistoryError> {
        let Some(dir) = &self.state_dir else {
            return Ok(());
        };
        if self.handed_over {
            return Ok(());
        }
        let path = dir.join(STATE_FILE);
        // Streamed into the file: the retained texts are decompressed one
        // at a time instead of the whole state being built in memory.
        write_atomically(dir, STATE_FILE, |out| {
            serde_json::to_writer_pretty(out, &self.state).map_err(std::io::Error::other)
        })
        .map_err(|e| HistoryError::Io(path, e))
    }
}

/// Temporary file, fsync, rename over the target, fsync of the folder: a
/// crash leaves either the old or the new file, never a torn one.
fn write_atomically(
    dir: &Path,
    name: &str,
    write: impl FnOnce(&mut std::io::BufWriter<&std::fs::File>) -> std::io::Result<()>,
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    {
        let file = std::fs::File::create(&tmp)?;
        let mut out = std::io::BufWriter::with_capacity(64 * 1024, &file);
        write(&mut out)?;
        out.flush()?;
        drop(out);
        file.sync_all()?;
    }
    std::fs::rename(&tmp, dir.join(name))?;
    std::fs::File::open(dir)?.sync_all()
}

#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("cannot read or write state file {0}: {1}")]
    Io(PathBuf, #[source] std::io::Error),
    #[error("state file {0} is not valid: {1}")]
    Corrupt(PathBuf, #[source] serde_json::Error),
    #[error("the retained configuration of generation {0} is damaged")]
    Damaged(GenerationId),
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
        let dir = std::env::temp_dir().join(format!("cutover-history-{}", std::process::id()));
        let mut h = History::new(4, Some(dir.clone()), PersistedState::default());
        h.record_generation(record(5));
        let op = h.next_operation_id();
        assert_eq!(op, "op-000001");
        h.persist().expect("persists");
        let loaded = History::load(&dir).expect("reads").expect("exists");
        assert_eq!(loaded.generations.back().map(|g| g.generation.0), Some(5));
        assert_eq!(loaded.next_operation, 1);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
