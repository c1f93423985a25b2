//! `cutover ctl`: a command-line client of the admin API for pipelines.
//!
//! Exit codes are the contract CI scripts rely on: 0 success (or
//! unchanged), 1 rejected or invalid, 2 conflict, 3 unreachable or any
//! other failure, 4 (`activate --wait`) rolled back, 5 (`activate
//! --max-moved`) too much traffic would move, 6 (`activate --shadow`)
//! the shadow stage refused it.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use http::StatusCode;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

mod client;
mod follow;
mod print;
mod tables;

use client::Client;
use follow::wait_settled;
use print::{print_human, print_json, watch_status};

use crate::admin::Started;
#[cfg(feature = "fleet")]
use crate::fleet::FleetStatus;
use crate::ids::GenerationId;
use crate::plan::Plan;
use crate::runtime::{OperationRecord, Outcome};
use crate::writer::{Activated, Status};

pub const EXIT_OK: u8 = 0;
pub const EXIT_REJECTED: u8 = 1;
pub const EXIT_CONFLICT: u8 = 2;
pub const EXIT_OTHER: u8 = 3;
pub const EXIT_ROLLED_BACK: u8 = 4;
/// `activate --max-moved`: more of the sampled traffic would move.
pub const EXIT_MOVED: u8 = 5;
/// `activate --shadow`: the shadow stage refused the activation (a
/// breach, no data with `--shadow-on-no-data fail`, or an abort).
pub const EXIT_SHADOW: u8 = 6;
/// A freeze window (`[[admin.freeze]]`) refused the change: a pipeline
/// tries again after it (`freeze.until` in `--json`).
pub const EXIT_FROZEN: u8 = 7;
/// The change waits for approval (`[admin.approval]`): a proposal was
/// made (202; `--json` has its id).
pub const EXIT_PROPOSED: u8 = 8;

#[derive(Debug, Args)]
pub struct CtlArgs {
    /// Admin API base URL.
    #[arg(long, default_value = "http://127.0.0.1:9190", env = "CUTOVER_ADMIN")]
    admin: String,
    /// File holding the admin bearer token.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// With an https:// admin URL: the CA bundle to verify the admin
    /// listener with (default: the WebPKI roots).
    #[arg(long)]
    cacert: Option<PathBuf>,
    /// With an https:// admin URL: a client certificate (PEM chain) that
    /// names this caller (`client_cert` in `[[admin.callers]]`).
    #[arg(long, requires = "key")]
    cert: Option<PathBuf>,
    /// The client certificate's key.
    #[arg(long, requires = "cert")]
    key: Option<PathBuf>,
    /// Print the API's JSON answer instead of a summary.
    #[arg(long)]
    json: bool,
    #[command(subcommand)]
    command: CtlCommand,
}

#[derive(Debug, Args)]
struct Meta {
    /// Generation the candidate was planned against (expected_generation).
    #[arg(long = "expect")]
    expect: Option<u64>,
    /// Why the change is made, for history.
    #[arg(long)]
    reason: Option<String>,
    /// Who or what makes the change, for history.
    #[arg(long, default_value = "cutover-ctl")]
    requested_by: String,
}

/// A guarded activation (DESIGN §14): a confirm window, a guard, canary
/// steps, and whether to follow it to its end.
#[derive(Debug, Args)]
struct Guarded {
    /// Roll back unless confirmed within this long ("2m").
    #[arg(long = "confirm-within")]
    confirm_within: Option<String>,
    /// Guard: roll back when the new generation's 5xx ratio exceeds the
    /// previous generation's by more than this (0.01 = one point).
    #[arg(long = "guard-error-ratio")]
    guard_error_ratio: Option<f64>,
    /// Guard: roll back when the new generation's p99 exceeds this ("500ms").
    #[arg(long = "guard-p99")]
    guard_p99: Option<String>,
    /// Guard: roll back when the share of requests the web application
    /// firewall refuses exceeds the previous generation's by more than
    /// this (0.02 = two points).
    #[arg(long = "guard-block-ratio")]
    guard_block_ratio: Option<f64>,
    /// Guard: answers needed before it judges (default 100).
    #[arg(long = "min-requests")]
    min_requests: Option<u64>,
    /// Guard: how long it watches; passing it confirms the generation
    /// (default 1m; shorter than --confirm-within).
    #[arg(long = "guard-window")]
    guard_window: Option<String>,
    /// Guard: when the window closes with fewer than --min-requests
    /// answers, "hold" (the deadline decides) or "fail" (roll back).
    #[arg(long = "on-no-data")]
    on_no_data: Option<String>,
    /// Canary: the share of new requests per step ("1,10,50,100").
    #[arg(long, value_delimiter = ',')]
    steps: Vec<u8>,
    /// Canary: how long each step lasts ("30s").
    #[arg(long = "step-interval")]
    step_interval: Option<String>,
    /// Canary: keep each value of this key on one side
    /// ("header:x-user", "cookie:NAME", "client_ip", "path").
    #[arg(long = "hash-key")]
    hash_key: Option<String>,
    /// Follow the activation until it is final (exit 0) or rolled back
    /// (exit 4).
    #[arg(long)]
    wait: bool,
    #[command(flatten)]
    shadow: Shadowed,
}

/// A shadow stage before the activation (DESIGN §22).
#[derive(Debug, Args)]
struct Shadowed {
    /// Shadow the candidate this long first ("60s", at most 1h): copies
    /// of live GET/HEAD/OPTIONS requests go through it and its answers are
    /// compared with the active generation's; a breach refuses (exit 6).
    #[arg(id = "shadow_duration", long = "shadow")]
    duration: Option<String>,
    /// Shadow: the share of requests copied (default 10).
    #[arg(id = "shadow_percent", long = "shadow-percent", value_parser = parse_percent)]
    percent: Option<f64>,
    /// Shadow: how much worse the candidate's 5xx ratio may be (default 0.01).
    #[arg(id = "shadow_error_ratio", long = "shadow-error-ratio")]
    error_ratio: Option<f64>,
    /// Shadow: how many times the active generation's p99 the
    /// candidate's may be ("1.5"; default: latency does not decide).
    #[arg(id = "shadow_p99_ratio", long = "shadow-p99-ratio")]
    p99_ratio: Option<f64>,
    /// Shadow: a WAF shadow (DESIGN §24): the candidate's firewall judges
    /// live requests in detection mode instead of copies going upstream.
    #[arg(id = "shadow_waf", long = "shadow-waf")]
    waf: bool,
    /// WAF shadow: how much the share of requests the candidate's
    /// firewall would refuse may exceed the active one's, on any route
    /// (default 0.01).
    #[arg(id = "shadow_block_increase", long = "shadow-block-increase")]
    block_increase: Option<f64>,
    /// Shadow: copies in flight at once (default 64).
    #[arg(id = "shadow_max_inflight", long = "shadow-max-inflight")]
    max_inflight: Option<u32>,
    /// Shadow: requests compared before it judges (default 100).
    #[arg(id = "shadow_min_requests", long = "shadow-min-requests")]
    min_requests: Option<u64>,
    /// Shadow: fewer than --shadow-min-requests at its end: "fail"
    /// (refuse; the default) or "hold" (activate anyway).
    #[arg(id = "shadow_on_no_data", long = "shadow-on-no-data")]
    on_no_data: Option<String>,
}

impl Shadowed {
    /// The `shadow` of an activate request, when asked for.
    fn body(&self) -> Option<Value> {
        let duration = self.duration.as_ref()?;
        let mut shadow = json!({ "duration": duration });
        let fields = [
            ("percent", self.percent.map(|v| json!(v))),
            ("max_error_ratio", self.error_ratio.map(|v| json!(v))),
            ("max_p99_ratio", self.p99_ratio.map(|v| json!(v))),
            ("waf", self.waf.then_some(json!(true))),
            ("max_block_increase", self.block_increase.map(|v| json!(v))),
            ("max_inflight", self.max_inflight.map(|v| json!(v))),
            ("min_requests", self.min_requests.map(|v| json!(v))),
            ("on_no_data", self.on_no_data.as_ref().map(|v| json!(v))),
        ];
        for (name, value) in fields {
            if let Some(value) = value {
                shadow[name] = value;
            }
        }
        Some(shadow)
    }

    /// How long the activate call may take: the stage, and two minutes.
    fn wait(&self) -> Duration {
        let stage = self
            .duration
            .as_deref()
            .and_then(|d| humantime::parse_duration(d).ok())
            .unwrap_or_default();
        stage + Duration::from_secs(120)
    }
}

impl Guarded {
    /// Adds this guarded activation's fields to an activate request.
    fn apply(&self, body: &mut Value) {
        if let Some(within) = &self.confirm_within {
            body["confirm_within"] = json!(within);
        }
        let guarded = self.guard_error_ratio.is_some()
            || self.guard_p99.is_some()
            || self.guard_block_ratio.is_some()
            || self.min_requests.is_some()
            || self.guard_window.is_some()
            || self.on_no_data.is_some();
        if guarded {
            let mut guard = json!({ "window": self.guard_window.as_deref().unwrap_or("1m") });
            if let Some(ratio) = self.guard_error_ratio {
                guard["max_error_ratio"] = json!(ratio);
            }
            if let Some(p99) = &self.guard_p99 {
                guard["max_p99"] = json!(p99);
            }
            if let Some(ratio) = self.guard_block_ratio {
                guard["max_block_ratio"] = json!(ratio);
            }
            if let Some(n) = self.min_requests {
                guard["min_requests"] = json!(n);
            }
            if let Some(on_no_data) = &self.on_no_data {
                guard["on_no_data"] = json!(on_no_data);
            }
            body["guard"] = guard;
            // A pipeline's guard decides: a pass makes it final.
            body["confirm_on_pass"] = json!(true);
        }
        if !self.steps.is_empty() {
            body["steps"] = json!(self.steps);
        }
        if let Some(interval) = &self.step_interval {
            body["step_interval"] = json!(interval);
        }
        if let Some(key) = &self.hash_key {
            body["hash_key"] = json!(key);
        }
        if let Some(shadow) = self.shadow.body() {
            body["shadow"] = shadow;
        }
    }
}

// Parsed once per process: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum CtlCommand {
    /// Plan a candidate file against the active generation; records nothing.
    Validate { file: PathBuf },
    /// Plan a candidate and record the preview in history.
    Preview {
        file: PathBuf,
        #[command(flatten)]
        meta: Meta,
    },
    /// Activate a candidate file; prints the diff it applied.
    Activate {
        file: PathBuf,
        #[command(flatten)]
        meta: Meta,
        #[command(flatten)]
        guarded: Guarded,
        /// Refuse (exit 5) when more than this share of the sampled
        /// requests would move to another route or upstream or find no
        /// route ("5%" or "5"); the candidate is validated first.
        #[arg(long = "max-moved", value_parser = parse_percent)]
        max_moved: Option<f64>,
        /// The same, held against the upper end of the share's 95 %
        /// interval: refuses unless the sample shows, with 95 %
        /// confidence, that no more than this would move.
        #[arg(long = "max-moved-upper", value_parser = parse_percent)]
        max_moved_upper: Option<f64>,
        /// Activate even when --max-moved or --max-moved-upper would
        /// refuse.
        #[arg(long)]
        force: bool,
        /// Go through a freeze window (`[[admin.freeze]]`): needs the
        /// `override` scope and --reason, which history keeps.
        #[arg(long = "override-freeze", requires = "reason")]
        override_freeze: bool,
    },
    /// Propose a candidate file for approval (`[admin.approval]`): it is
    /// planned now and carried out as asked once approved.
    Propose {
        file: PathBuf,
        #[command(flatten)]
        meta: Meta,
        #[command(flatten)]
        guarded: Guarded,
    },
    /// List proposals: the open ones and the last ones decided.
    Proposals,
    /// Approve a proposal; the last approval needed carries it out.
    Approve {
        id: String,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Reject a proposal, with a reason.
    Reject {
        id: String,
        #[arg(long)]
        reason: String,
    },
    /// Make the pending generation final.
    Confirm {
        generation: u64,
        #[command(flatten)]
        meta: Meta,
    },
    /// Follow a pending generation until it is final (exit 0) or rolled
    /// back (exit 4), as `activate --wait` does.
    Wait { generation: u64 },
    /// Roll the pending generation back now.
    Abort {
        generation: u64,
        #[command(flatten)]
        meta: Meta,
    },
    /// Show retained generations and the operation log.
    History,
    /// Print the active generation's configuration, as it was activated
    /// (to commit it back, or to compare with the file).
    Export,
    /// Activate a retained generation's configuration again (`rollback
    /// 7` or `rollback --to 7`). Rolling back to the active generation
    /// changes nothing and exits 0.
    Rollback {
        /// The retained generation whose configuration to activate again
        /// (`ctl history` lists them).
        #[arg(
            value_name = "GENERATION",
            required_unless_present = "to",
            conflicts_with = "to"
        )]
        generation: Option<u64>,
        /// The same as GENERATION.
        #[arg(long = "to", value_name = "GENERATION")]
        to: Option<u64>,
        #[command(flatten)]
        meta: Meta,
    },
    /// Show the active generation, live generations with their in-flight
    /// work, request and error rates, backends and recent history.
    Status {
        /// Refresh in place until interrupted.
        #[arg(long)]
        watch: bool,
        /// Time between refreshes with `--watch`.
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        interval: Duration,
        /// Stop after this many refreshes (default: never).
        #[arg(long)]
        count: Option<u64>,
    },
    /// Show every backend of the active generation: health, ejection,
    /// in-flight requests, latency, attempts and failures.
    Backends,
    /// Re-read listener certificates (all TLS listeners, or `--listener`).
    ReloadCerts {
        #[arg(long = "listener")]
        listeners: Vec<String>,
    },
    /// The fleet this gateway is in (`[fleet]`).
    #[command(subcommand)]
    Fleet(FleetCommand),
    /// The cache zones (`[cache.zones]`): their use, and purges.
    #[command(subcommand)]
    Cache(CacheCommand),
    /// Start draining the gateway (as SIGTERM).
    Drain,
    /// Drain-aware restart on the active configuration, or on `--config`
    /// (which may carry restart-required changes); waits for the outcome.
    Upgrade {
        #[arg(long)]
        config: Option<PathBuf>,
        /// Start this executable instead of the file the gateway was
        /// started from (a path on the gateway's machine).
        #[arg(long)]
        binary: Option<PathBuf>,
        /// Go through a freeze window (`[[admin.freeze]]`): needs the
        /// `override` scope and --reason, which history keeps.
        #[arg(long = "override-freeze", requires = "reason")]
        override_freeze: bool,
        #[command(flatten)]
        meta: Meta,
    },
}

#[derive(Debug, Subcommand)]
enum FleetCommand {
    /// The fleet's active generation and, per instance, synced, applying,
    /// nacked (with the error), stale or gone; exit 0 only when every
    /// instance is synced.
    Status,
    /// Stop listing a gone instance (scaled down, renamed).
    Forget { instance: String },
}

#[derive(Debug, Subcommand)]
enum CacheCommand {
    /// Every zone the active generation names: its size and use, what
    /// it counted, its routes and its disk.
    Show,
    /// Forget objects now, by key, key prefix or surrogate key (in one
    /// zone or all); recorded as a `cache_purge` operation.
    Purge(Purge),
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("selector").required(true).args(["key", "prefix", "tag"])))]
struct Purge {
    /// One key: `host path?query upstream`, or without ` upstream` the
    /// object of every upstream.
    #[arg(long)]
    key: Option<String>,
    /// Every key that starts with this (`example.com /static/`).
    #[arg(long)]
    prefix: Option<String>,
    /// Every object whose `Surrogate-Key` or `Cache-Tag` names this.
    #[arg(long)]
    tag: Option<String>,
    /// Only this zone (default: every zone).
    #[arg(long)]
    zone: Option<String>,
    /// Why, for the operation log.
    #[arg(long)]
    reason: Option<String>,
    /// Who or what purges, for the operation log.
    #[arg(long, default_value = "cutover-ctl")]
    requested_by: String,
}

/// An admin API answer: its status and its JSON, read as the API's own
/// types where a command needs its facts.
struct Answer {
    status: StatusCode,
    body: Value,
}

impl Answer {
    /// The answer as `T`, the type the admin API serialized it from;
    /// `None` when it does not read as one (another version's shape).
    fn read<T: DeserializeOwned>(&self) -> Option<T> {
        T::deserialize(&self.body).ok()
    }
}

#[derive(Debug, thiserror::Error)]
enum CtlError {
    #[error("cannot read {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("invalid admin URL '{0}'")]
    Url(String),
    #[error("cannot reach the admin API at {0}: {1}")]
    Unreachable(String, String),
    #[error("TLS towards the admin API: {0}")]
    Tls(String),
}

/// Runs one ctl command and returns the process exit code.
pub fn run(args: CtlArgs) -> u8 {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cutover ctl: {e}");
            return EXIT_OTHER;
        }
    };
    match runtime.block_on(execute(&args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cutover ctl: {e}");
            EXIT_OTHER
        }
    }
}

/// `"5%"`, `"5"`, `"0.5 %"`: a share from 0 to 100.
fn parse_percent(text: &str) -> Result<f64, String> {
    let number = text.trim().trim_end_matches('%').trim();
    match number.parse::<f64>() {
        Ok(p) if (0.0..=100.0).contains(&p) => Ok(p),
        _ => Err(format!("'{text}' is not a percentage from 0 to 100")),
    }
}

fn read(path: &PathBuf) -> Result<String, CtlError> {
    std::fs::read_to_string(path).map_err(|e| CtlError::Read(path.clone(), e))
}

impl CtlCommand {
    /// The configuration file the command sends, if it sends one.
    fn file(&self) -> Option<&std::path::Path> {
        match self {
            CtlCommand::Validate { file }
            | CtlCommand::Preview { file, .. }
            | CtlCommand::Activate { file, .. }
            | CtlCommand::Propose { file, .. } => Some(file),
            _ => None,
        }
    }
}

fn candidate(file: &PathBuf, meta: Option<&Meta>) -> Result<Value, CtlError> {
    let mut body = json!({ "config": read(file)? });
    if let Some(meta) = meta {
        body["expected_generation"] = json!(meta.expect);
        body["reason"] = json!(meta.reason);
        body["requested_by"] = json!(meta.requested_by);
    }
    Ok(body)
}

async fn execute(args: &CtlArgs) -> Result<u8, CtlError> {
    let token = match &args.token_file {
        Some(path) => Some(read(path)?.trim().to_owned()),
        None => None,
    };
    let tls = if args.admin.starts_with("https://") {
        let spec = crate::tls::UpstreamTlsSpec {
            ca: args.cacert.clone(),
            server_name: None,
            client_cert: args.cert.clone().zip(args.key.clone()),
            subject_alt_names: Vec::new(),
            files_fingerprint: String::new(),
        };
        let mut config =
            crate::tls::client_config(&spec).map_err(|e| CtlError::Tls(e.to_string()))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Some(std::sync::Arc::new(config))
    } else {
        None
    };
    let client = Client {
        base: args.admin.trim_end_matches('/').to_owned(),
        token,
        tls,
    };
    let answer = match &args.command {
        CtlCommand::Validate { file } => {
            client
                .post("/admin/runtime/validate", candidate(file, None)?)
                .await?
        }
        CtlCommand::Preview { file, meta } => {
            client
                .post("/admin/runtime/preview", candidate(file, Some(meta))?)
                .await?
        }
        CtlCommand::Activate {
            file,
            meta,
            guarded,
            max_moved,
            max_moved_upper,
            force,
            override_freeze,
        } => {
            if max_moved.is_some() || max_moved_upper.is_some() {
                let checked = client
                    .post("/admin/runtime/validate", candidate(file, None)?)
                    .await?;
                let impact = checked
                    .read::<crate::plan::Plan>()
                    .and_then(|plan| plan.impact);
                // The share itself against --max-moved, the upper end of
                // its interval against --max-moved-upper.
                let refusal = impact.as_ref().and_then(|impact| {
                    let share = impact.moved_percent();
                    let [low, high] = impact.moved_interval();
                    let of = format!(
                        "{share:.2} % of the sampled requests (95 % interval {low:.2}–{high:.2} %, {} sampled) would move or find no route",
                        impact.sample_size
                    );
                    match (max_moved, max_moved_upper) {
                        (Some(max), _) if share > *max => {
                            Some(format!("{of}, more than --max-moved {max} %"))
                        }
                        (_, Some(max)) if impact.sample_size > 0 && high > *max => Some(format!(
                            "{of}: the interval reaches above --max-moved-upper {max} %"
                        )),
                        _ => None,
                    }
                });
                if let (Some(refusal), Some(impact)) = (refusal, impact) {
                    if *force {
                        eprintln!("--force: {refusal}; activating anyway");
                    } else {
                        if args.json {
                            print_json(&checked.body);
                        } else {
                            print::print_impact(&impact);
                        }
                        eprintln!("refused: {refusal} (--force activates anyway)");
                        return Ok(EXIT_MOVED);
                    }
                }
            }
            let mut body = candidate(file, Some(meta))?;
            if *override_freeze {
                body["override_freeze"] = json!(true);
            }
            guarded.apply(&mut body);
            let answer = client
                .post_within("/admin/runtime/activate", body, guarded.shadow.wait())
                .await?;
            let pending = match answer.read::<Activated>() {
                Some(Activated::Local(activation)) => {
                    activation.pending.as_ref().map(|p| p.generation)
                }
                // A fleet's answer names the pending generation at the top.
                #[cfg(feature = "fleet")]
                Some(Activated::Fleet(activation)) => activation
                    .pending
                    .is_some()
                    .then_some(activation.generation),
                None => None,
            };
            match pending {
                Some(generation) if guarded.wait && answer.status.is_success() => {
                    if !args.json {
                        print_human(&args.command, &answer);
                    }
                    return wait_settled(&client, generation, args.json).await;
                }
                _ => answer,
            }
        }
        CtlCommand::Propose {
            file,
            meta,
            guarded,
        } => {
            let mut body = candidate(file, Some(meta))?;
            guarded.apply(&mut body);
            client.post("/admin/runtime/proposals", body).await?
        }
        CtlCommand::Proposals => client.get("/admin/runtime/proposals").await?,
        CtlCommand::Approve { id, reason } => {
            client
                .post_within(
                    &format!("/admin/runtime/proposals/{id}/approve"),
                    json!({ "reason": reason }),
                    // The last approval carries the change out (a shadow
                    // stage included).
                    Duration::from_secs(3720),
                )
                .await?
        }
        CtlCommand::Reject { id, reason } => {
            client
                .post(
                    &format!("/admin/runtime/proposals/{id}/reject"),
                    json!({ "reason": reason }),
                )
                .await?
        }
        CtlCommand::Confirm { generation, meta } | CtlCommand::Abort { generation, meta } => {
            let path = if matches!(args.command, CtlCommand::Confirm { .. }) {
                "/admin/runtime/confirm"
            } else {
                "/admin/runtime/abort"
            };
            let body = json!({
                "generation": generation,
                "expected_active_generation": meta.expect,
                "reason": meta.reason,
                "requested_by": meta.requested_by,
            });
            client.post(path, body).await?
        }
        CtlCommand::Rollback {
            generation,
            to,
            meta,
        } => {
            let body = json!({
                "target_generation": generation.or(*to),
                "expected_active_generation": meta.expect,
                "reason": meta.reason,
                "requested_by": meta.requested_by,
            });
            client.post("/admin/runtime/rollback", body).await?
        }
        CtlCommand::Wait { generation } => {
            return wait_settled(&client, GenerationId(*generation), args.json).await;
        }
        CtlCommand::History => client.get("/admin/runtime/history").await?,
        CtlCommand::Export => {
            let status = client.get("/admin/runtime/status").await?;
            match status.read::<Status>() {
                Some(active) if status.status.is_success() => {
                    let id = active.local.active_generation;
                    client.get(&format!("/admin/runtime/history/{id}")).await?
                }
                _ => status,
            }
        }
        CtlCommand::Status {
            watch,
            interval,
            count,
        } if !args.json => {
            let frames = if *watch { *count } else { Some(1) };
            return watch_status(&client, *interval, frames).await;
        }
        CtlCommand::Status { .. } => client.get("/admin/runtime/status").await?,
        CtlCommand::Backends => client.get("/admin/runtime/backends").await?,
        CtlCommand::Fleet(FleetCommand::Status) => client.get("/admin/fleet/status").await?,
        CtlCommand::Fleet(FleetCommand::Forget { instance }) => {
            client
                .post("/admin/fleet/forget", json!({ "instance": instance }))
                .await?
        }
        CtlCommand::Cache(CacheCommand::Show) => client.get("/admin/cache").await?,
        CtlCommand::Cache(CacheCommand::Purge(purge)) => {
            let mut body = json!({ "requested_by": purge.requested_by, "reason": purge.reason });
            for (field, value) in [
                ("key", &purge.key),
                ("prefix", &purge.prefix),
                ("tag", &purge.tag),
                ("zone", &purge.zone),
            ] {
                if let Some(value) = value {
                    body[field] = json!(value);
                }
            }
            client.post("/admin/cache/purge", body).await?
        }
        CtlCommand::Drain => client.post("/admin/lifecycle/drain", json!({})).await?,
        CtlCommand::ReloadCerts { listeners } => {
            let body = if listeners.is_empty() {
                json!({})
            } else {
                json!({ "listeners": listeners })
            };
            client.post("/admin/runtime/reload-certs", body).await?
        }
        CtlCommand::Upgrade {
            config,
            binary,
            override_freeze,
            meta,
        } => {
            let mut body = json!({ "reason": meta.reason, "requested_by": meta.requested_by });
            if *override_freeze {
                body["override_freeze"] = json!(true);
            }
            if let Some(file) = config {
                body["config"] = json!(read(file)?);
            }
            if let Some(binary) = binary {
                let absolute = std::path::absolute(binary).unwrap_or_else(|_| binary.clone());
                body["binary"] = json!(absolute);
            }
            let started = client.post("/admin/lifecycle/upgrade", body).await?;
            match started.read::<Started>() {
                Some(s) if started.status == StatusCode::ACCEPTED => {
                    client.follow(&s.operation_id).await?
                }
                _ => started,
            }
        }
    };
    if args.json {
        print_json(&answer.body);
    } else {
        print_human(&args.command, &answer);
    }
    Ok(exit_code(&args.command, &answer))
}

fn exit_code(command: &CtlCommand, answer: &Answer) -> u8 {
    let refusal = || answer.read::<crate::admin::ErrorBody>()?.error;
    match answer.status {
        StatusCode::CONFLICT
            if matches!(
                refusal().as_deref(),
                Some("shadow_breach" | "shadow_aborted")
            ) =>
        {
            EXIT_SHADOW
        }
        // Rolled back to what is already active: nothing to do.
        StatusCode::CONFLICT
            if matches!(command, CtlCommand::Rollback { .. })
                && refusal().as_deref() == Some("target_active") =>
        {
            EXIT_OK
        }
        StatusCode::CONFLICT => EXIT_CONFLICT,
        StatusCode::LOCKED => EXIT_FROZEN,
        StatusCode::ACCEPTED if answer.body.get("proposal").is_some() => EXIT_PROPOSED,
        s if s.is_success() => match command {
            CtlCommand::Upgrade { .. } => match answer.read::<OperationRecord>() {
                Some(op) if op.outcome != Outcome::Failed => EXIT_OK,
                _ => EXIT_OTHER,
            },
            // Answered, but not every instance serves the active generation.
            #[cfg(feature = "fleet")]
            CtlCommand::Fleet(FleetCommand::Status) => match answer.read::<FleetStatus>() {
                Some(fleet) if fleet.synced == fleet.total => EXIT_OK,
                _ => EXIT_OTHER,
            },
            CtlCommand::Validate { .. } | CtlCommand::Preview { .. } => {
                match answer.read::<Plan>() {
                    Some(plan) if plan.activatable => EXIT_OK,
                    _ => EXIT_REJECTED,
                }
            }
            _ => EXIT_OK,
        },
        StatusCode::BAD_REQUEST
        | StatusCode::NOT_FOUND
        | StatusCode::PAYLOAD_TOO_LARGE
        | StatusCode::UNSUPPORTED_MEDIA_TYPE
        | StatusCode::UNPROCESSABLE_ENTITY
        | StatusCode::PRECONDITION_REQUIRED
        | StatusCode::FORBIDDEN => EXIT_REJECTED,
        _ => EXIT_OTHER,
    }
}
