//! Candidates: the configuration an operation is asked to plan.

use std::path::{Path, PathBuf};

use crate::config::ConfigText;
use crate::ids::GenerationId;

/// Where the candidate text comes from.
#[derive(Debug, Clone)]
pub enum CandidateSource {
    /// Text sent in the request.
    Text(String),
    /// A file: `None` is the file the process was started with.
    Path(Option<PathBuf>),
    /// Text composed by the gateway (a fleet generation with the
    /// instance's own file), named by `origin` in diagnostics.
    Composed { text: String, origin: String },
}

/// A candidate configuration and the metadata of the request that sent it.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub source: CandidateSource,
    pub expected_generation: Option<GenerationId>,
    pub reason: Option<String>,
    pub requested_by: Option<String>,
    /// The authenticated admin caller that sent it.
    pub caller: Option<String>,
    /// Activate only: roll back unless confirmed within this long.
    pub confirm_within: Option<std::time::Duration>,
    /// Activate only: judge the new generation by its own answers.
    pub guard: Option<GuardSpec>,
    /// Activate only: send the new generation a growing share of new
    /// requests.
    pub canary: Option<CanarySpec>,
    /// Activate only: before anything else, copy live requests through
    /// the candidate and compare its answers (DESIGN §22).
    pub shadow: Option<ShadowSpec>,
    /// How the active configuration's freeze windows apply to it.
    pub freeze: FreezeRule,
    /// The callers that approved it (a proposal carried out).
    pub approved_by: Vec<String>,
}

/// How a change meets a freeze window of the active configuration
/// (DESIGN §23).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FreezeRule {
    /// Refused in a window (423 `frozen`).
    #[default]
    Honour,
    /// Goes on in a window, which its record names: the admin API sets
    /// this only for a caller with `override` that gave a reason.
    Override,
    /// Not this instance's decision: a fleet generation this instance
    /// applies was admitted by the instance that wrote it.
    Exempt,
}

/// A shadow stage (DESIGN §22): for `duration`, `percent` % of the
/// active generation's safe requests are also sent through the
/// candidate; the activation goes on only when the candidate's answers
/// to them are no worse than the active generation's by more than the
/// thresholds.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ShadowSpec {
    pub percent: f64,
    pub duration: std::time::Duration,
    /// The candidate's 5xx ratio may exceed the active generation's, on
    /// the same requests, by at most this.
    pub max_error_ratio: f64,
    /// The candidate's p99 may be at most this many times the active
    /// generation's (latencies under 1 ms count as 1 ms).
    pub max_p99_ratio: Option<f64>,
    /// Copies in flight at once; more are dropped and counted.
    pub max_inflight: u32,
    /// Pairs of answers needed before it judges (in all, and per route
    /// for a route's own verdict).
    pub min_requests: u64,
    /// Fewer than `min_requests` when it ends: refuse (`fail`) or go on
    /// to the activation (`hold`: its confirm window or guard decides).
    pub fail_on_no_data: bool,
    /// A WAF shadow stage (DESIGN §24): the candidate's firewall judges
    /// live requests in detection mode, nothing is copied upstream, and
    /// the share of requests it would refuse may exceed the active
    /// generation's, on any route, by at most this.
    pub max_block_increase: Option<f64>,
}

/// Canary steps (DESIGN §14): the pending generation takes `steps[i]` %
/// of new requests for `step_interval` each (sticky by `key` when set);
/// the last step, 100, makes it final.
#[derive(Debug, Clone, PartialEq)]
pub struct CanarySpec {
    pub steps: Vec<u8>,
    pub step_interval: std::time::Duration,
    pub key: Option<crate::plan::HashKey>,
}

/// A guard (DESIGN §14): the pending generation's answers over `window`,
/// judged once `min_requests` of them came.
#[derive(Debug, Clone, PartialEq)]
pub struct GuardSpec {
    pub window: std::time::Duration,
    pub min_requests: u64,
    /// Answers 5xx (by the gateway or the backend) over answers.
    pub max_error_ratio: f64,
    pub max_p99: Option<std::time::Duration>,
    /// Requests the web application firewall refused over answers, above
    /// the previous generation's (DESIGN §24).
    pub max_block_ratio: Option<f64>,
    /// Fewer than `min_requests` when the window closes: keep waiting
    /// (the confirm deadline decides) or roll back.
    pub fail_on_no_data: bool,
    /// A window passed makes the generation final.
    pub confirm_on_pass: bool,
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl GuardSpec {
    /// As a pending record keeps it.
    pub fn record(&self) -> crate::runtime::GuardRecord {
        crate::runtime::GuardRecord {
            window_ms: millis(self.window),
            min_requests: self.min_requests,
            max_error_ratio: self.max_error_ratio,
            max_p99_ms: self.max_p99.map(millis),
            max_block_ratio: self.max_block_ratio,
            fail_on_no_data: self.fail_on_no_data,
            confirm_on_pass: self.confirm_on_pass,
        }
    }

    pub fn from_record(record: &crate::runtime::GuardRecord) -> Self {
        Self {
            window: std::time::Duration::from_millis(record.window_ms),
            min_requests: record.min_requests,
            max_error_ratio: record.max_error_ratio,
            max_p99: record.max_p99_ms.map(std::time::Duration::from_millis),
            max_block_ratio: record.max_block_ratio,
            fail_on_no_data: record.fail_on_no_data,
            confirm_on_pass: record.confirm_on_pass,
        }
    }
}

impl CanarySpec {
    /// As a pending record keeps it, on step `step`.
    pub fn record(&self, step: usize) -> crate::runtime::CanaryRecord {
        crate::runtime::CanaryRecord {
            steps: self.steps.clone(),
            step_interval_ms: millis(self.step_interval),
            hash_key: self.key.as_ref().map(ToString::to_string),
            step,
        }
    }

    /// `None` when the record's `hash_key` does not read.
    pub fn from_record(record: &crate::runtime::CanaryRecord) -> Option<Self> {
        let key = match &record.hash_key {
            Some(text) => Some(crate::plan::parse_hash_key(text)?),
            None => None,
        };
        Some(Self {
            steps: record.steps.clone(),
            step_interval: std::time::Duration::from_millis(record.step_interval_ms),
            key,
        })
    }
}

impl Candidate {
    /// The process's own configuration file, with no metadata.
    pub fn config_file() -> Self {
        Self {
            source: CandidateSource::Path(None),
            expected_generation: None,
            reason: None,
            requested_by: None,
            caller: None,
            confirm_within: None,
            guard: None,
            canary: None,
            shadow: None,
            freeze: FreezeRule::Honour,
            approved_by: Vec::new(),
        }
    }

    pub fn text(text: String) -> Self {
        Self {
            source: CandidateSource::Text(text),
            expected_generation: None,
            reason: None,
            requested_by: None,
            caller: None,
            confirm_within: None,
            guard: None,
            canary: None,
            shadow: None,
            freeze: FreezeRule::Honour,
            approved_by: Vec::new(),
        }
    }
}

/// Why a candidate could not even be read.
#[derive(Debug, thiserror::Error)]
pub enum CandidateError {
    #[error("cannot read {0}: {1}")]
    Unreadable(PathBuf, std::io::Error),
    #[error("config_path {0} is outside the configuration folder {1}")]
    OutsideConfigFolder(PathBuf, PathBuf),
}

/// Reads the candidate text. Text sent inline resolves relative file
/// references against the configuration file's folder; `config_path`
/// may only name files inside that folder.
pub fn read(source: &CandidateSource, config_file: &Path) -> Result<ConfigText, CandidateError> {
    let folder = config_file
        .parent()
        .map(Path::to_path_buf)
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or_else(|| PathBuf::from("."));
    match source {
        CandidateSource::Text(text) => Ok(ConfigText::inline(text.clone(), folder, "<admin>")),
        CandidateSource::Composed { text, origin } => {
            Ok(ConfigText::inline(text.clone(), folder, origin))
        }
        CandidateSource::Path(None) => ConfigText::read(config_file)
            .map_err(|e| CandidateError::Unreadable(config_file.to_path_buf(), e)),
        CandidateSource::Path(Some(path)) => {
            let path = folder.join(path);
            let canonical_folder = folder
                .canonicalize()
                .map_err(|e| CandidateError::Unreadable(folder.clone(), e))?;
            let canonical = path
                .canonicalize()
                .map_err(|e| CandidateError::Unreadable(path.clone(), e))?;
            if !canonical.starts_with(&canonical_folder) {
                return Err(CandidateError::OutsideConfigFolder(path, folder));
            }
            ConfigText::read(&canonical).map_err(|e| CandidateError::Unreadable(path, e))
        }
    }
}

/// How a pending generation is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    Confirm,
    Abort,
    /// The deadline passed (the gateway's own timer).
    Expired,
}

/// A request to confirm or abort the pending generation.
#[derive(Debug, Clone)]
pub struct SettleRequest {
    pub generation: GenerationId,
    pub expected_active_generation: Option<GenerationId>,
    pub requested_by: Option<String>,
    pub reason: Option<String>,
    pub caller: Option<String>,
}

/// A rollback request.
#[derive(Debug, Clone)]
pub struct RollbackRequest {
    pub target_generation: GenerationId,
    pub expected_active_generation: Option<GenerationId>,
    pub reason: Option<String>,
    pub requested_by: Option<String>,
    pub caller: Option<String>,
    /// The callers that approved it (a proposal carried out).
    pub approved_by: Vec<String>,
}
