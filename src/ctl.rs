//! `cutover ctl`: a command-line client of the admin API for pipelines.
//!
//! Exit codes are the contract CI scripts rely on: 0 success (or
//! unchanged), 1 rejected or invalid, 2 conflict, 3 unreachable or any
//! other failure, 4 (`activate --wait`) rolled back.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use clap::{Args, Subcommand};
use http::{header, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

use crate::admin::{ErrorBody, Started};
use crate::control::{
    Activation, BackendsView, CertReload, GenerationDetail, HistoryView, RecordedPlan, StatusView,
};
#[cfg(feature = "fleet")]
use crate::fleet::{FleetActivation, FleetStatus};
use crate::ids::GenerationId;
use crate::plan::{Diff, Plan};
use crate::runtime::{OperationKind, OperationRecord, Outcome};
use crate::writer::{Activated, Settlement, Status};

pub const EXIT_OK: u8 = 0;
pub const EXIT_REJECTED: u8 = 1;
pub const EXIT_CONFLICT: u8 = 2;
pub const EXIT_OTHER: u8 = 3;
pub const EXIT_ROLLED_BACK: u8 = 4;

#[derive(Debug, Args)]
pub struct CtlArgs {
    /// Admin API base URL.
    #[arg(long, default_value = "http://127.0.0.1:9190", env = "CUTOVER_ADMIN")]
    admin: String,
    /// File holding the admin bearer token.
    #[arg(long)]
    token_file: Option<PathBuf>,
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
}

impl Guarded {
    /// Adds this guarded activation's fields to an activate request.
    fn apply(&self, body: &mut Value) {
        if let Some(within) = &self.confirm_within {
            body["confirm_within"] = json!(within);
        }
        let guarded = self.guard_error_ratio.is_some()
            || self.guard_p99.is_some()
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
    }
}

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
    /// Activate a retained generation's configuration again.
    Rollback {
        #[arg(long = "to")]
        to: u64,
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

fn read(path: &PathBuf) -> Result<String, CtlError> {
    std::fs::read_to_string(path).map_err(|e| CtlError::Read(path.clone(), e))
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
    let client = Client {
        base: args.admin.trim_end_matches('/').to_owned(),
        token,
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
        } => {
            let mut body = candidate(file, Some(meta))?;
            guarded.apply(&mut body);
            let answer = client.post("/admin/runtime/activate", body).await?;
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
        CtlCommand::Rollback { to, meta } => {
            let body = json!({
                "target_generation": to,
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
            meta,
        } => {
            let mut body = json!({ "reason": meta.reason, "requested_by": meta.requested_by });
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

fn print_json(value: &impl Serialize) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_default()
    );
}

/// An enum as the admin API spells it (`auto_rollback`, `startup`).
fn spelled(value: &impl Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(text)) => text,
        Ok(other) => other.to_string(),
        Err(_) => "-".into(),
    }
}

/// One poll of a follower (`wait`).
enum Polled<T> {
    Read(T),
    /// Failed, but not for long enough to give up: poll again.
    Again,
    /// Gave up: the exit code.
    Failed(u8),
}

/// GETs `path` for a follower. The admin socket may pass to a new process
/// on the way (an upgrade), and etcd may be away for a while (a fleet):
/// up to a minute of failed polls, half a second apart, is not the end.
async fn poll<T: DeserializeOwned>(
    client: &Client,
    path: &str,
    failures: &mut u32,
) -> Result<Polled<T>, CtlError> {
    match client.get(path).await {
        Ok(answer) if answer.status.is_success() => match answer.read() {
            Some(read) => {
                *failures = 0;
                Ok(Polled::Read(read))
            }
            None => {
                eprintln!("cutover ctl: {path} answered in a shape this ctl does not read");
                Ok(Polled::Failed(EXIT_OTHER))
            }
        },
        Ok(_) | Err(_) if *failures < 120 => {
            *failures += 1;
            tokio::time::sleep(Duration::from_millis(500)).await;
            Ok(Polled::Again)
        }
        Ok(answer) => Ok(Polled::Failed(exit_code(&CtlCommand::History, &answer))),
        Err(error) => Err(error),
    }
}

/// Follows pending generation `generation` until it is settled: exit 0
/// when it was confirmed, 4 when it was rolled back, 2 when another
/// activation superseded it. Prints the operation that settled it.
async fn wait_settled(
    client: &Client,
    generation: GenerationId,
    json: bool,
) -> Result<u8, CtlError> {
    let mut percent = None;
    let mut failures = 0;
    loop {
        let status: Status = match poll(client, "/admin/runtime/status", &mut failures).await? {
            Polled::Read(status) => status,
            Polled::Again => continue,
            Polled::Failed(code) => return Ok(code),
        };
        #[cfg(feature = "fleet")]
        if status.fleet.is_some() {
            return wait_fleet_settled(client, generation, json).await;
        }
        if let Some(pending) = status.local.pending.filter(|p| p.generation == generation) {
            if !json && pending.canary_percent != percent {
                percent = pending.canary_percent;
                if let Some(percent) = percent {
                    println!("canary: generation {generation} takes {percent} % of new requests");
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        let history = client.get("/admin/runtime/history").await?;
        let operations = history
            .read::<HistoryView>()
            .map(|h| h.operations)
            .unwrap_or_default();
        let settled = operations.into_iter().rev().find(|op| {
            op.outcome == Outcome::Succeeded
                && match op.kind {
                    OperationKind::Confirm => op.generation == Some(generation),
                    OperationKind::Abort
                    | OperationKind::AutoRollback
                    | OperationKind::Rollback => op.previous_generation == Some(generation),
                    _ => false,
                }
        });
        let (code, what) = match &settled {
            Some(op) if op.kind == OperationKind::Confirm => (EXIT_OK, "confirmed"),
            Some(_) => (EXIT_ROLLED_BACK, "rolled back"),
            None => (EXIT_CONFLICT, "superseded"),
        };
        if json {
            print_json(&settled);
        } else {
            let op = settled.as_ref();
            println!(
                "generation {generation} {what}{}{}",
                because(op.and_then(|op| op.reason.as_deref())),
                by(op.and_then(|op| op.requested_by.as_deref())),
            );
            if settled.is_none() {
                println!(
                    "generation {} is active: another activation replaced it",
                    status.local.active_generation
                );
            }
        }
        return Ok(code);
    }
}

fn because(reason: Option<&str>) -> String {
    reason.map_or(String::new(), |r| format!(": {r}"))
}

fn by(who: Option<&str>) -> String {
    who.map_or(String::new(), |by| format!(" (by {by})"))
}

/// `wait_settled` in a fleet: follows the fleet's `active` record until
/// `generation` is no longer pending; its settlement says how it ended.
#[cfg(feature = "fleet")]
async fn wait_fleet_settled(
    client: &Client,
    generation: GenerationId,
    json: bool,
) -> Result<u8, CtlError> {
    let mut failures = 0;
    loop {
        let status: FleetStatus = match poll(client, "/admin/fleet/status", &mut failures).await? {
            Polled::Read(status) => status,
            Polled::Again => continue,
            Polled::Failed(code) => return Ok(code),
        };
        let Some(active) = status.active else {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        if active.generation == generation && active.pending.is_some() {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        let settlement = active.settlement.filter(|s| s.generation == generation);
        let (code, what) = match &settlement {
            None => (EXIT_CONFLICT, "superseded"),
            Some(s) if s.outcome == "confirmed" => (EXIT_OK, "confirmed"),
            Some(_) => (EXIT_ROLLED_BACK, "rolled back"),
        };
        if json {
            print_json(&settlement);
        } else {
            let s = settlement.as_ref();
            println!(
                "fleet generation {generation} {what}{}{}",
                because(s.and_then(|s| s.reason.as_deref())),
                by(s.and_then(|s| s.by.as_deref())),
            );
            if what != "confirmed" {
                println!("fleet generation {} is active", active.generation);
            }
        }
        return Ok(code);
    }
}

fn exit_code(command: &CtlCommand, answer: &Answer) -> u8 {
    match answer.status {
        StatusCode::CONFLICT => EXIT_CONFLICT,
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
        | StatusCode::PRECONDITION_REQUIRED => EXIT_REJECTED,
        _ => EXIT_OTHER,
    }
}

fn or_dash(id: Option<GenerationId>) -> String {
    id.map_or("-".into(), |id| id.to_string())
}

fn print_plan(plan: &Plan) {
    println!(
        "activatable: {}  (against generation {}, config_version {})",
        if plan.activatable { "yes" } else { "no" },
        or_dash(plan.active_generation),
        plan.config_version.as_deref().unwrap_or("-")
    );
    for e in &plan.errors {
        println!(
            "error: {}:{}: {}: {}",
            e.line.map_or("?".into(), |l| l.to_string()),
            e.column.map_or("?".into(), |c| c.to_string()),
            e.code.as_str(),
            e.message
        );
    }
    for r in &plan.rejected {
        println!(
            "restart required: {} ({} → {}); {}",
            r.path, r.from, r.to, r.action
        );
    }
    print_diff(&plan.diff);
}

fn print_diff(diff: &Diff) {
    let s = &diff.summary;
    if !diff.changes.is_empty() {
        println!(
            "changes: {} added, {} removed, {} modified, {} restart-required",
            s.added, s.removed, s.modified, s.restart_required
        );
    }
    print!("{}", diff.text);
}

/// A summary of `answer` for a person; an answer this ctl cannot read
/// (a gateway of another version) is printed as its JSON.
fn print_human(command: &CtlCommand, answer: &Answer) {
    if !answer.status.is_success() {
        let refusal = answer.read::<ErrorBody>();
        let plan = answer.read::<Plan>();
        eprintln!(
            "{} {}: {}",
            answer.status.as_u16(),
            refusal
                .as_ref()
                .and_then(|r| r.error.as_deref())
                .unwrap_or(if plan.is_some() { "rejected" } else { "error" }),
            refusal
                .as_ref()
                .and_then(|r| r.message.as_deref())
                .unwrap_or("")
        );
        if let Some(plan) = &plan {
            print_plan(plan);
        }
        return;
    }
    if summarize(command, answer).is_none() {
        eprintln!("(an answer this ctl does not know the shape of; as sent:)");
        print_json(&answer.body);
    }
}

/// `print_human` for a successful answer; `None` when it does not read
/// as the type the command expects.
fn summarize(command: &CtlCommand, answer: &Answer) -> Option<()> {
    match command {
        CtlCommand::Validate { .. } => print_plan(&answer.read::<Plan>()?),
        CtlCommand::Preview { .. } => {
            let recorded = answer.read::<RecordedPlan>()?;
            print_plan(&recorded.plan);
            println!("recorded as {}", recorded.operation_id);
        }
        CtlCommand::Activate { .. } | CtlCommand::Rollback { .. } => {
            match answer.read::<Activated>()? {
                Activated::Local(activation) => print_activation(&activation),
                #[cfg(feature = "fleet")]
                Activated::Fleet(activation) => print_fleet_activation(&activation),
            }
        }
        CtlCommand::Confirm { .. } | CtlCommand::Abort { .. } => {
            let (outcome, generation, rolled_back_to, operation) = match answer
                .read::<Settlement>()?
            {
                Settlement::Local(s) => (s.outcome, s.generation, s.rolled_back_to, s.operation_id),
                #[cfg(feature = "fleet")]
                Settlement::Fleet(s) => (s.outcome, s.generation, s.rolled_back_to, "fleet".into()),
            };
            println!(
                "{outcome}: generation {generation} active{} ({operation})",
                rolled_back_to.map_or(String::new(), |to| format!(", the configuration of {to}")),
            );
        }
        CtlCommand::History => {
            let history = answer.read::<HistoryView>()?;
            println!(
                "active generation {} (keeping {})",
                history.active_generation, history.history_limit
            );
            for g in &history.generations {
                println!(
                    "{:>6}  {:<9} {:<8} {}  {}{}",
                    g.generation,
                    g.status,
                    spelled(&g.source),
                    g.activated_at,
                    g.config_version,
                    if g.rollback_candidate {
                        "  (rollback candidate)"
                    } else {
                        ""
                    }
                );
            }
        }
        // Printed as it follows the generation.
        CtlCommand::Wait { .. } => {}
        // The text as it was activated, byte for byte.
        CtlCommand::Export => print!("{}", answer.read::<GenerationDetail>()?.config),
        CtlCommand::Status { .. } => print_json(&answer.read::<Status>()?),
        #[cfg(feature = "fleet")]
        CtlCommand::Fleet(FleetCommand::Status) => {
            print!("{}", fleet_table(&answer.read::<FleetStatus>()?))
        }
        #[cfg(not(feature = "fleet"))]
        CtlCommand::Fleet(FleetCommand::Status) => return None,
        CtlCommand::Fleet(FleetCommand::Forget { instance }) => {
            println!("instance {instance} forgotten")
        }
        CtlCommand::Backends => {
            println!(
                "{:<16} {:<24} {:<10} {:<9} {:>8} {:>9} {:>10} {:>9}",
                "upstream",
                "backend",
                "health",
                "ejected",
                "inflight",
                "ewma_ms",
                "attempts",
                "failures"
            );
            for upstream in &answer.read::<BackendsView>()?.upstreams {
                for b in &upstream.backends {
                    println!(
                        "{:<16} {:<24} {:<10} {:<9} {:>8} {:>9.1} {:>10} {:>9}",
                        upstream.name,
                        b.addr,
                        spelled(&b.health),
                        yes_no(b.ejected),
                        b.inflight,
                        b.ewma_ms.unwrap_or(0.0),
                        b.attempts,
                        b.failures,
                    );
                }
            }
        }
        CtlCommand::Drain => println!("draining ({})", answer.read::<Started>()?.operation_id),
        CtlCommand::ReloadCerts { .. } => {
            let reload = answer.read::<CertReload>()?;
            for listener in &reload.listeners {
                for cert in &listener.certificates {
                    println!(
                        "{}: {} {:?} not_after {}{}",
                        listener.listener,
                        cert.fingerprint,
                        cert.names,
                        cert.not_after,
                        if cert.changed { " (changed)" } else { "" }
                    );
                }
            }
            for warning in &reload.warnings {
                println!("warning: {warning}");
            }
        }
        CtlCommand::Upgrade { .. } => {
            let op = answer.read::<OperationRecord>()?;
            println!(
                "upgrade {}: {} ({})",
                spelled(&op.outcome),
                op.summary,
                op.id
            );
            if let Some(error) = &op.error {
                println!("error: {error}");
            }
        }
    }
    Some(())
}

fn yes_no(flag: bool) -> &'static str {
    if flag {
        "yes"
    } else {
        "no"
    }
}

fn print_activation(activation: &Activation) {
    println!(
        "{}: generation {} (previous {}), {} in {} ms",
        activation.outcome,
        activation.generation,
        activation.previous_generation,
        activation.operation_id,
        activation.duration_ms
    );
    if let Some(pending) = &activation.pending {
        match &pending.deadline {
            Some(deadline) => println!(
                "pending: confirm generation {} by {deadline} or it rolls back to {}",
                pending.generation, pending.rollback_to
            ),
            None => println!(
                "pending: generation {} is judged by its guard (rollback to {})",
                pending.generation, pending.rollback_to
            ),
        }
    }
    print_diff(&activation.diff);
}

#[cfg(feature = "fleet")]
fn print_fleet_activation(activation: &FleetActivation) {
    use crate::fleet::InstanceOutcome;
    println!(
        "{}: fleet generation {} (previous {}), {}",
        activation.outcome,
        activation.generation,
        or_dash(activation.previous_generation),
        activation.config_version,
    );
    if let Some(pending) = &activation.pending {
        let mut how = Vec::new();
        if let Some(ms) = pending.deadline_unix_ms {
            let at = std::time::UNIX_EPOCH + Duration::from_millis(ms);
            how.push(format!(
                "confirm by {}",
                humantime::format_rfc3339_seconds(at)
            ));
        }
        if pending.guard.is_some() {
            how.push("its guard judges every instance's answers".into());
        }
        if let Some(canary) = &pending.canary {
            how.push(format!("canary steps {:?}", canary.steps));
        }
        println!(
            "pending: rolls back to fleet generation {} unless settled ({})",
            pending.rollback_to,
            how.join("; ")
        );
    }
    match &activation.instance {
        InstanceOutcome::Serving {
            instance,
            generation,
            local_generation,
        } => println!(
            "instance {instance}: serves fleet generation {generation} as local generation {local_generation}"
        ),
        InstanceOutcome::Applied {
            instance,
            activation,
        } => {
            println!(
                "instance {instance}: local generation {} ({})",
                activation.generation, activation.outcome
            );
            print_diff(&activation.diff);
        }
        InstanceOutcome::Refused { instance, error } => println!("instance {instance}: {error}"),
    }
    println!("other instances follow through etcd: `cutover ctl fleet status`");
}

/// `ctl status`: one frame, or (`--watch`) a frame every `interval`,
/// redrawn in place on a terminal, until `frames` have been shown.
async fn watch_status(
    client: &Client,
    interval: Duration,
    frames: Option<u64>,
) -> Result<u8, CtlError> {
    use std::io::{IsTerminal, Write};
    let terminal = std::io::stdout().is_terminal();
    let mut last: Option<(std::time::Instant, u64, u64)> = None;
    // History plans every retained configuration: read again only when
    // the last operation changed.
    let mut history: Option<(Option<String>, HistoryView)> = None;
    let mut shown = 0u64;
    loop {
        let answer = client.get("/admin/runtime/status").await?;
        let Some(status) = answer
            .status
            .is_success()
            .then(|| answer.read::<Status>())
            .flatten()
        else {
            print_human(&CtlCommand::History, &answer);
            return Ok(EXIT_OTHER);
        };
        let status = status.local;
        let backends = client
            .get("/admin/runtime/backends")
            .await?
            .read::<BackendsView>();
        let last_operation = status.last_operation.as_ref().map(|o| o.id.clone());
        if history
            .as_ref()
            .is_none_or(|(seen, _)| *seen != last_operation)
        {
            let answer = client.get("/admin/runtime/history").await?;
            history = answer.read().map(|h| (last_operation, h));
        }
        let now = std::time::Instant::now();
        let totals = (status.requests_total, status.errors_total);
        let rates = last.map(|(at, requests, errors)| {
            let seconds = now.duration_since(at).as_secs_f64().max(1e-3);
            (
                totals.0.saturating_sub(requests) as f64 / seconds,
                totals.1.saturating_sub(errors) as f64 / seconds,
            )
        });
        last = Some((now, totals.0, totals.1));
        let frame = status_frame(
            &status,
            backends.as_ref(),
            history.as_ref().map(|(_, h)| h),
            rates,
        );
        let mut out = std::io::stdout().lock();
        if terminal && frames != Some(1) {
            // Home and clear: the frame replaces the last one.
            let _ = write!(out, "\x1b[H\x1b[2J");
        } else if shown > 0 {
            let _ = writeln!(out);
        }
        let _ = write!(out, "{frame}");
        let _ = out.flush();
        drop(out);
        shown += 1;
        if frames.is_some_and(|n| shown >= n) {
            return Ok(EXIT_OK);
        }
        tokio::time::sleep(interval).await;
    }
}

/// `ctl fleet status`: one line per instance.
#[cfg(feature = "fleet")]
fn fleet_table(fleet: &FleetStatus) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "fleet {}: generation {} ({}), {} of {} instances synced",
        fleet.prefix,
        or_dash(fleet.active.as_ref().map(|a| a.generation)),
        fleet
            .active
            .as_ref()
            .map_or("-", |a| a.config_version.as_str()),
        fleet.synced,
        fleet.total
    );
    let _ = writeln!(
        out,
        "{:<20} {:<9} {:>10}  {:<5}  error",
        "instance", "status", "generation", "drift"
    );
    for i in &fleet.instances {
        let _ = writeln!(
            out,
            "{:<20} {:<9} {:>10}  {:<5}  {}",
            i.instance,
            i.status,
            or_dash(i.generation),
            yes_no(i.drift),
            i.error.as_deref().unwrap_or("")
        );
    }
    out
}

/// The facts of one `ctl status` frame, as text.
fn status_frame(
    status: &StatusView,
    backends: Option<&BackendsView>,
    history: Option<&HistoryView>,
    rates: Option<(f64, f64)>,
) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "cutover pid {}  {}  generation {}  config {}  activated {}",
        status.pid,
        status.phase.as_str(),
        status.active_generation,
        status.config_version,
        status.activated_at,
    );
    if let Some(pending) = &status.pending {
        let when = pending
            .seconds_left
            .map_or("when its guard says so".to_owned(), |s| {
                format!("in {s:.0}s unless confirmed")
            });
        let _ = writeln!(
            out,
            "PENDING: generation {} rolls back to {} {when}",
            pending.generation, pending.rollback_to,
        );
    }
    match rates {
        Some((requests, errors)) => {
            let ratio = if requests > 0.0 {
                errors / requests * 100.0
            } else {
                0.0
            };
            let _ = writeln!(
                out,
                "requests {requests:.1}/s  errors {errors:.1}/s ({ratio:.2} %)"
            );
        }
        None => {
            let _ = writeln!(
                out,
                "requests {} answered since start, {} of them 5xx",
                status.requests_total, status.errors_total
            );
        }
    }
    let _ = writeln!(out, "\nlive generations");
    let _ = writeln!(
        out,
        "  {:>6}  {:<10} {:>9} {:>11} {:>10} {:>8}",
        "gen", "state", "inflight", "connections", "requests", "errors"
    );
    for g in &status.generations {
        let state = match g.superseded_secs {
            Some(secs) => format!("old {secs:.0}s"),
            None => "active".to_owned(),
        };
        let _ = writeln!(
            out,
            "  {:>6}  {:<10} {:>9} {:>11} {:>10} {:>8}",
            g.generation, state, g.inflight_requests, g.open_connections, g.requests, g.errors,
        );
    }
    let _ = writeln!(out, "\nbackends");
    let _ = writeln!(
        out,
        "  {:<16} {:<24} {:<10} {:<8} {:>8} {:>9} {:>9}",
        "upstream", "backend", "health", "ejected", "inflight", "attempts", "failures"
    );
    for upstream in backends.iter().flat_map(|b| &b.upstreams) {
        for b in &upstream.backends {
            let _ = writeln!(
                out,
                "  {:<16} {:<24} {:<10} {:<8} {:>8} {:>9} {:>9}",
                upstream.name,
                b.addr,
                spelled(&b.health),
                yes_no(b.ejected),
                b.inflight,
                b.attempts,
                b.failures,
            );
        }
    }
    let _ = writeln!(out, "\nhistory (newest first)");
    for g in history.iter().flat_map(|h| &h.generations).take(10) {
        let who = [g.requested_by.as_deref(), g.reason.as_deref()]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(": ");
        let _ = writeln!(
            out,
            "  {:>6}  {:<9} {:<13} {}  {}",
            g.generation,
            g.status,
            spelled(&g.source),
            g.activated_at,
            who,
        );
    }
    out
}

struct Client {
    base: String,
    token: Option<String>,
}

impl Client {
    async fn get(&self, path: &str) -> Result<Answer, CtlError> {
        self.send(Method::GET, path, None).await
    }

    async fn post(&self, path: &str, body: Value) -> Result<Answer, CtlError> {
        self.send(Method::POST, path, Some(body)).await
    }

    /// Polls an operation until it is no longer running (an upgrade).
    async fn follow(&self, id: &str) -> Result<Answer, CtlError> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            // The admin socket passes to the new process mid-way: a poll
            // may briefly fail while it does.
            if let Ok(answer) = self.get(&format!("/admin/runtime/operations/{id}")).await {
                let settled = answer
                    .read::<OperationRecord>()
                    .is_some_and(|op| op.outcome != Outcome::Running);
                if answer.status.is_success() && settled {
                    return Ok(answer);
                }
            }
            if tokio::time::Instant::now() > deadline {
                return Err(CtlError::Unreachable(
                    self.base.clone(),
                    format!("operation {id} did not finish in time"),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Answer, CtlError> {
        let url = format!("{}{}", self.base, path);
        let uri: Uri = url.parse().map_err(|_| CtlError::Url(self.base.clone()))?;
        let authority = uri
            .authority()
            .ok_or_else(|| CtlError::Url(self.base.clone()))?
            .clone();
        if uri.scheme_str() != Some("http") {
            return Err(CtlError::Url(format!(
                "{} (only http:// is supported)",
                self.base
            )));
        }
        let port = authority.port_u16().unwrap_or(80);
        let unreachable =
            |e: &dyn std::fmt::Display| CtlError::Unreachable(self.base.clone(), e.to_string());
        let stream = tokio::time::timeout(
            Duration::from_secs(10),
            tokio::net::TcpStream::connect((authority.host().trim_matches(['[', ']']), port)),
        )
        .await
        .map_err(|e| unreachable(&e))?
        .map_err(|e| unreachable(&e))?;
        let _ = stream.set_nodelay(true);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| unreachable(&e))?;
        tokio::spawn(conn);
        let mut request = Request::builder()
            .method(method)
            .uri(uri.path_and_query().map_or("/", |p| p.as_str()))
            .header(header::HOST, authority.as_str());
        if let Some(token) = &self.token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let payload = match body {
            Some(body) => {
                request = request.header(header::CONTENT_TYPE, "application/json");
                Bytes::from(body.to_string())
            }
            None => Bytes::new(),
        };
        let request = request
            .body(Full::new(payload))
            .map_err(|e| unreachable(&e))?;
        let response = tokio::time::timeout(Duration::from_secs(120), sender.send_request(request))
            .await
            .map_err(|e| unreachable(&e))?
            .map_err(|e| unreachable(&e))?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| unreachable(&e))?
            .to_bytes();
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| json!({ "error": "unexpected_response", "message": String::from_utf8_lossy(&bytes) }));
        Ok(Answer { status, body })
    }
}
