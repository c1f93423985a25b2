//! Process start-up and the signal loop.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use serde_json::json;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};

use crate::admin::{self, Security};
use crate::admission::Admission;
use crate::config::{ConfigText, Diagnostic};
use crate::control::{Candidate, Control};
use crate::generation::{self, SharedState};
use crate::ids::GenerationId;
use crate::plan::{self, Spec};
use crate::proxy::ListenerSet;
use crate::runtime::{
    rfc3339, GenerationRecord, GenerationStore, History, OperationKind, PersistedState, Phase,
    PhaseCell, Source,
};
use crate::telemetry::{self, metrics as m};

/// How the process was asked to run.
#[derive(Debug, Clone)]
pub struct Options {
    pub config: PathBuf,
}

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot read configuration {0}: {1}")]
    Read(PathBuf, #[source] std::io::Error),
    #[error("configuration {origin} is invalid:\n{}", render(.origin, .diagnostics))]
    Invalid {
        origin: String,
        diagnostics: Vec<Diagnostic>,
    },
    #[error("cannot start the runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("cannot open the log: {0}")]
    Log(#[source] std::io::Error),
    #[error("{0}")]
    Build(#[from] generation::BuildError),
    #[error("{0}")]
    Bind(#[from] crate::proxy::BindError),
    #[error("cannot bind the {what} socket {bind}: {source}")]
    BindControl {
        what: &'static str,
        bind: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    History(#[from] crate::runtime::HistoryError),
}

fn render(origin: &str, diagnostics: &[Diagnostic]) -> String {
    diagnostics
        .iter()
        .map(|d| d.render(origin))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Runs the gateway until it is told to stop.
pub fn run(options: Options) -> Result<(), StartError> {
    let text = ConfigText::read(&options.config)
        .map_err(|e| StartError::Read(options.config.clone(), e))?;
    let spec = plan::validate(&text).map_err(|diagnostics| StartError::Invalid {
        origin: text.origin.clone(),
        diagnostics,
    })?;
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Some(threads) = spec.runtime.worker_threads {
        builder.worker_threads(threads);
    }
    let runtime = builder.build().map_err(StartError::Runtime)?;
    runtime.block_on(serve(options, text, spec))
}

/// Chooses the configuration to start with: the persisted active one when
/// a state dir has one that still validates, else the configuration file.
fn starting_point(
    text: ConfigText,
    spec: Spec,
    persisted: &PersistedState,
) -> (ConfigText, Arc<Spec>, GenerationId, bool) {
    let Some(last) = persisted.generations.back() else {
        return (text, Arc::new(spec), GenerationId::FIRST, true);
    };
    let resumed = ConfigText::inline(last.config.clone(), last.base_dir.clone(), &last.origin);
    match plan::validate(&resumed) {
        Ok(resumed_spec) => {
            tracing::info!(generation = %last.generation, "resuming the persisted active generation");
            (resumed, Arc::new(resumed_spec), last.generation, false)
        }
        Err(diagnostics) => {
            tracing::warn!(
                generation = %last.generation,
                errors = diagnostics.len(),
                first = diagnostics.first().map(|d| d.message.as_str()).unwrap_or(""),
                "the persisted active configuration no longer validates; starting from the configuration file"
            );
            (text, Arc::new(spec), last.generation.next(), true)
        }
    }
}

async fn serve(options: Options, text: ConfigText, file_spec: Spec) -> Result<(), StartError> {
    let log_level = telemetry::init_logging(&file_spec.log).map_err(StartError::Log)?;
    let prometheus = telemetry::init_metrics();
    let phase = Arc::new(PhaseCell::default());

    let state_dir = file_spec.runtime.state_dir.clone();
    let persisted = match &state_dir {
        Some(dir) => History::load(dir)?.unwrap_or_default(),
        None => PersistedState::default(),
    };
    let (text, spec, id, is_new) = starting_point(text, file_spec, &persisted);
    let mut history = History::new(spec.runtime.history_limit, state_dir, persisted);

    let shared = Arc::new(SharedState::default());
    let first = generation::build(Arc::clone(&spec), id, &shared)?;
    let store = Arc::new(GenerationStore::new(first));
    let admission = Admission::new(Arc::clone(&store));
    let listeners = ListenerSet::new(admission);
    let bound = listeners.bind_new(&spec.listeners)?;

    let admin_socket =
        TcpListener::bind(spec.admin.bind)
            .await
            .map_err(|source| StartError::BindControl {
                what: "admin",
                bind: spec.admin.bind,
                source,
            })?;
    let admin_address = admin_socket.local_addr().unwrap_or(spec.admin.bind);
    let metrics_socket = match spec.metrics_bind {
        Some(bind) => {
            Some(
                TcpListener::bind(bind)
                    .await
                    .map_err(|source| StartError::BindControl {
                        what: "metrics",
                        bind,
                        source,
                    })?,
            )
        }
        None => None,
    };

    if is_new {
        history.record_generation(GenerationRecord {
            generation: id,
            config_version: spec.config_version.clone(),
            activated_at: rfc3339(SystemTime::now()),
            source: Source::Startup,
            rolled_back_to: None,
            requested_by: None,
            reason: None,
            config: text.text.clone(),
            base_dir: text.base_dir.clone(),
            origin: text.origin.clone(),
        });
    }
    history.persist()?;
    listeners.start(bound);

    let control = Arc::new(Control::new(
        Arc::clone(&store),
        shared,
        Arc::clone(&listeners),
        history,
        options.config.clone(),
        log_level,
        Arc::clone(&phase),
    ));
    let security = Security {
        address: admin_address,
        token: spec.admin.token.clone(),
    };
    let admin_router = admin::router(Arc::clone(&control), security);
    tokio::spawn(async move {
        if let Err(error) = axum::serve(admin_socket, admin_router).await {
            tracing::error!(%error, "admin server stopped");
        }
    });
    let metrics_address = match metrics_socket {
        Some(socket) => {
            let address = socket.local_addr().ok();
            let router = axum::Router::new().route(
                "/metrics",
                axum::routing::get(move || {
                    let prometheus = prometheus.clone();
                    async move { prometheus.render() }
                }),
            );
            tokio::spawn(async move {
                if let Err(error) = axum::serve(socket, router).await {
                    tracing::error!(%error, "metrics server stopped");
                }
            });
            address
        }
        None => None,
    };

    phase.advance(Phase::Running);
    metrics::gauge!(m::ACTIVE_GENERATION).set(id.0 as f64);
    tokio::spawn(refresh_gauges(Arc::clone(&control)));
    announce_ready(&control, admin_address, metrics_address);
    signal_loop(control).await
}

async fn refresh_gauges(control: Arc<Control>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tick.tick().await;
        telemetry::refresh_gauges(&control.store().loads(), control.phase().get());
    }
}

/// One JSON line on stdout once every socket is bound and the first
/// generation is active: what supervisors and tests wait for.
fn announce_ready(control: &Control, admin: SocketAddr, metrics: Option<SocketAddr>) {
    let listeners: Vec<_> = control
        .listeners()
        .info()
        .into_iter()
        .map(
            |l| json!({ "name": l.name, "address": l.address.to_string(), "protocol": l.protocol }),
        )
        .collect();
    let line = json!({
        "event": "ready",
        "pid": std::process::id(),
        "generation": control.store().active_id(),
        "admin": admin.to_string(),
        "metrics": metrics.map(|a| a.to_string()),
        "listeners": listeners,
    });
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}");
    let _ = stdout.flush();
    tracing::info!(%admin, generation = %control.store().active_id(), "cutover ready");
}

async fn signal_loop(control: Arc<Control>) -> Result<(), StartError> {
    let mut hangup = signal(SignalKind::hangup()).map_err(StartError::Runtime)?;
    let mut terminate = signal(SignalKind::terminate()).map_err(StartError::Runtime)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(StartError::Runtime)?;
    loop {
        tokio::select! {
            _ = hangup.recv() => {
                tracing::info!("SIGHUP: reloading the configuration file");
                match control.activate(Candidate::config_file(), OperationKind::Reload).await {
                    Ok(activation) => tracing::info!(outcome = activation.outcome, generation = %activation.generation, "reload finished"),
                    Err(error) => log_refusal(&error),
                }
            }
            _ = terminate.recv() => {
                tracing::info!("SIGTERM: draining");
                drain(&control).await;
                return Ok(());
            }
            _ = interrupt.recv() => {
                tracing::info!("SIGINT: stopping now");
                control.phase().advance(Phase::Stopped);
                return Ok(());
            }
        }
    }
}

fn log_refusal(error: &crate::control::ControlError) {
    use crate::control::ControlError;
    match error {
        ControlError::Invalid(plan) | ControlError::RestartRequired(plan) => {
            for d in &plan.errors {
                tracing::error!(code = d.code, line = d.line, column = d.column, path = %d.path, "{}", d.message);
            }
            for r in &plan.rejected {
                tracing::error!(path = %r.path, reason = r.reason, "{}", r.action);
            }
            tracing::error!("reload refused; the active generation is unchanged");
        }
        other => {
            tracing::error!(error = %other, "reload refused; the active generation is unchanged")
        }
    }
}

/// Stops accepting, lets in-flight work finish until `drain_timeout`,
/// then returns so the process exits.
async fn drain(control: &Control) {
    control.phase().advance(Phase::Draining);
    let timeout = control.store().load_full().spec.runtime.drain_timeout;
    control.listeners().drain();
    let left = control.listeners().wait_closed(timeout).await;
    if left > 0 {
        tracing::warn!(
            connections = left,
            ?timeout,
            "drain timeout reached; closing the remaining connections"
        );
    } else {
        tracing::info!("drained");
    }
    control.phase().advance(Phase::Stopped);
}
