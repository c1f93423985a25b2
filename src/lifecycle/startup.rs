//! Process start-up and the signal loop.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use serde_json::json;

use super::control_server::Gate;
use super::handover::{self, SocketRole, UpgradeState};
use super::running::{refresh_gauges, signal_loop, Signals};
use super::upgrade::Process;
use crate::admin::{self, Security};
use crate::admission::Admission;
use crate::config::{ConfigText, Diagnostic};
use crate::control::{Control, ControlParts};
use crate::generation::{self, SharedState};
use crate::ids::GenerationId;
use crate::plan::{self, Spec};
use crate::proxy::{ListenerSet, Workers};
use crate::runtime::{
    rfc3339, GenerationRecord, GenerationStore, History, Outcome, PersistedState, Phase, PhaseCell,
    RetainedText, Source,
};
use crate::telemetry::{self, metrics as m};
use crate::tls::CertStore;
use crate::writer::Writer;

/// How the process was asked to run.
#[derive(Debug, Clone)]
pub struct Options {
    pub config: PathBuf,
    /// `--watch`: activate the file (and what it references) when it
    /// changes.
    pub watch: bool,
    /// `--gateway-api DIR`: `config` is written from DIR's Gateway API
    /// resources (and its settings file) at start, and again whenever
    /// DIR changes with `--watch`.
    pub gateway_api: Option<crate::gatewayapi::Source>,
    /// Hands memory the allocator holds but no longer uses back to the
    /// system. Called after loading a configuration (startup, each
    /// activation), on the thread that loaded it: the transient peak of
    /// parsing a large one would otherwise stay resident in an idle
    /// process. The binary knows its allocator; the library does not.
    pub release_memory: fn(),
}

/// How long the exit waits for blocking control-plane work after draining.
const EXIT_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot read configuration {0}: {1}")]
    Read(PathBuf, #[source] std::io::Error),
    #[error("cannot import the Gateway API resources: {0}")]
    GatewayApi(String),
    #[error("cannot watch the configuration: {0}")]
    Watch(String),
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
    #[error("admin.tls: {0}")]
    AdminTls(String),
    #[error("cannot take over from the previous process: {0}")]
    Handover(#[source] std::io::Error),
}

fn render(origin: &str, diagnostics: &[Diagnostic]) -> String {
    diagnostics
        .iter()
        .map(|d| d.render(origin))
        .collect::<Vec<_>>()
        .join("\n")
}

/// What the process starts from: a configuration, the generation id it
/// runs as, and the history it continues.
struct Start {
    text: ConfigText,
    spec: Arc<Spec>,
    id: GenerationId,
    /// `Some` when the id is new and must be recorded, with how it came to be.
    new_record: Option<Source>,
    /// For a new record minted at startup: the generation it brings back.
    rolled_back_to: Option<GenerationId>,
    history: PersistedState,
    upgrade: Option<UpgradeState>,
    /// Said before logging was set up; logged right after.
    notes: Vec<String>,
}

/// Runs the gateway until it is told to stop.
pub fn run(options: Options) -> Result<(), StartError> {
    // Before anything else: the file at this path may be replaced while
    // we run, and an upgrade must start the new one.
    let binary = super::upgrade::Binary::resolve();
    // Reported once logging is set up.
    let imported = match &options.gateway_api {
        Some(source) => crate::gatewayapi::compose_into(source, &options.config)
            .map_err(StartError::GatewayApi)?,
        None => None,
    };
    let upgrade = handover::take_state().map_err(StartError::Handover)?;
    let start = choose_start(&options, upgrade)?;
    // Connections are served on `worker_threads` data-plane threads (one
    // per core by default), each its own current-thread runtime; the
    // control plane (admin, activation, accept loops, health checks) has a
    // runtime of its own, with one thread and the blocking pool.
    let threads = start.spec.runtime.worker_threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let workers = Arc::new(Workers::start(threads).map_err(StartError::Runtime)?);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("cutover-control")
        .enable_all()
        .build()
        .map_err(StartError::Runtime)?;
    let result = runtime.block_on(serve(options, start, binary, workers, imported));
    // Control-plane work still running on the blocking pool (planning a
    // huge candidate) must not hold the exit once draining is over: its
    // caller is gone, and nothing it could finish would be recorded.
    runtime.shutdown_timeout(EXIT_GRACE);
    // The last requests' access lines, before the process is gone.
    crate::telemetry::access::flush(EXIT_GRACE);
    crate::telemetry::audit::flush(EXIT_GRACE);
    result
}

fn validate(text: &ConfigText) -> Result<Spec, StartError> {
    plan::validate(text).map_err(|diagnostics| StartError::Invalid {
        origin: text.origin.clone(),
        diagnostics,
    })
}

/// After an upgrade: the configuration the old process handed over. Else
/// the persisted active configuration when a state dir has one that still
/// validates; else the configuration file.
fn choose_start(options: &Options, upgrade: Option<UpgradeState>) -> Result<Start, StartError> {
    if let Some(state) = upgrade {
        let text = ConfigText::inline(state.config.clone(), state.base_dir.clone(), &state.origin);
        let spec = Arc::new(validate(&text)?);
        let last = state.history.generations.back();
        let (id, new_record) = match last {
            Some(last) if last.config_version == spec.config_version => (last.generation, None),
            Some(last) => (last.generation.next(), Some(Source::Upgrade)),
            None => (GenerationId::FIRST, Some(Source::Upgrade)),
        };
        return Ok(Start {
            text,
            spec,
            id,
            new_record,
            rolled_back_to: None,
            history: state.history.clone(),
            notes: vec![format!(
                "taking over from pid {} ({})",
                state.parent_pid, state.operation_id
            )],
            upgrade: Some(state),
        });
    }
    let text = ConfigText::read(&options.config)
        .map_err(|e| StartError::Read(options.config.clone(), e))?;
    let file_spec = validate(&text)?;
    let persisted = match &file_spec.runtime.state_dir {
        Some(dir) => History::load(dir)?.unwrap_or_default(),
        None => PersistedState::default(),
    };
    let Some(last) = persisted.generations.back().cloned() else {
        return Ok(Start {
            text,
            spec: Arc::new(file_spec),
            id: GenerationId::FIRST,
            new_record: Some(Source::Startup),
            rolled_back_to: None,
            history: persisted,
            upgrade: None,
            notes: Vec::new(),
        });
    };
    // A pending generation whose confirm deadline passed while no process
    // ran: start on the generation it would have been rolled back to.
    let expired = persisted.pending.clone().filter(|p| {
        p.generation == last.generation
            && p.deadline_unix_ms.is_some_and(|ms| {
                SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(ms) <= SystemTime::now()
            })
    });
    if let Some(pending) = expired {
        let target = persisted
            .generations
            .iter()
            .find(|g| g.generation == pending.rollback_to)
            .map(GenerationRecord::config_text)
            .transpose()?;
        if let Some(spec) = target.as_ref().and_then(|t| plan::validate(t).ok()) {
            let mut history = persisted;
            history.pending = None;
            return Ok(Start {
                text: target.unwrap_or(text),
                spec: Arc::new(spec),
                id: last.generation.next(),
                new_record: Some(Source::AutoRollback),
                rolled_back_to: Some(pending.rollback_to),
                history,
                upgrade: None,
                notes: vec![format!(
                    "generation {} was pending and its confirm deadline passed while no process ran: starting on generation {}",
                    pending.generation, pending.rollback_to
                )],
            });
        }
    }
    let resumed = last.config_text()?;
    Ok(match plan::validate(&resumed) {
        Ok(spec) => Start {
            text: resumed,
            spec: Arc::new(spec),
            id: last.generation,
            new_record: None,
            rolled_back_to: None,
            history: persisted,
            upgrade: None,
            notes: vec![format!("resuming the persisted active generation {}", last.generation)],
        },
        Err(diagnostics) => Start {
            notes: vec![format!(
                "the persisted active generation {} no longer validates ({}); starting from the configuration file",
                last.generation,
                diagnostics.first().map(|d| d.render(&last.origin)).unwrap_or_default()
            )],
            text,
            spec: Arc::new(file_spec),
            id: last.generation.next(),
            new_record: Some(Source::Startup),
            rolled_back_to: None,
            history: persisted,
            upgrade: None,
        },
    })
}

/// A control socket (admin, metrics): inherited when the bind matches,
/// else bound. Returns the tokio listener and a duplicate kept for the
/// next hand-over.
fn control_socket(
    role: SocketRole,
    bind: SocketAddr,
    inherited: &mut Vec<(SocketRole, SocketAddr, std::net::TcpListener)>,
) -> Result<(tokio::net::TcpListener, std::net::TcpListener), StartError> {
    let what = match role {
        SocketRole::Admin => "admin",
        _ => "metrics",
    };
    let fail = |source| StartError::BindControl { what, bind, source };
    let socket = match inherited
        .iter()
        .position(|(r, b, _)| *r == role && *b == bind)
    {
        Some(index) => inherited.swap_remove(index).2,
        None => std::net::TcpListener::bind(bind).map_err(fail)?,
    };
    socket.set_nonblocking(true).map_err(fail)?;
    let kept = socket.try_clone().map_err(fail)?;
    Ok((
        tokio::net::TcpListener::from_std(socket).map_err(fail)?,
        kept,
    ))
}

/// Listeners' sockets handed over, by listener name and bound address.
type InheritedListeners = Vec<(String, std::net::SocketAddr, std::os::fd::OwnedFd)>;
/// HTTP/3 listeners' UDP groups handed over.
type InheritedQuic = Vec<(String, std::net::SocketAddr, crate::proxy::InheritedGroup)>;

/// What a process started by a drain-aware upgrade takes over: the
/// sockets the previous process handed over (its listeners', and the
/// admin and metrics ones), and the pipe it closes once it stops
/// accepting on the latter.
struct Inherited {
    accept_after: Option<std::os::fd::OwnedFd>,
    listeners: InheritedListeners,
    /// HTTP/3 listeners' UDP groups, by listener name and bound address.
    quic: InheritedQuic,
    control: Vec<(SocketRole, std::net::SocketAddr, std::net::TcpListener)>,
}

impl Inherited {
    fn adopt(upgrade: Option<&UpgradeState>) -> Result<Self, StartError> {
        let accept_after = upgrade
            .and_then(|u| u.accept_after)
            .map(handover::adopt_pipe)
            .transpose()
            .map_err(StartError::Handover)?;
        let mut listeners = Vec::new();
        let mut control = Vec::new();
        for socket in upgrade.iter().flat_map(|u| u.sockets.iter()) {
            let listener = handover::adopt(socket).map_err(StartError::Handover)?;
            match socket.role {
                SocketRole::Listener => {
                    listeners.push((socket.name.clone(), socket.bind, listener))
                }
                role => control.push((role, socket.bind, std::net::TcpListener::from(listener))),
            }
        }
        let mut quic = Vec::new();
        for group in upgrade.iter().flat_map(|u| u.quic.iter()) {
            let sockets = group
                .sockets
                .iter()
                .map(|&fd| {
                    handover::adopt(&handover::HandedSocket {
                        role: SocketRole::Listener,
                        name: group.name.clone(),
                        bind: group.address,
                        fd,
                    })
                    .map(std::net::UdpSocket::from)
                })
                .collect::<std::io::Result<Vec<_>>>()
                .map_err(StartError::Handover)?;
            let relays = group
                .relays
                .iter()
                .map(|&fd| handover::adopt_relay(fd))
                .collect::<std::io::Result<Vec<_>>>()
                .map_err(StartError::Handover)?;
            let tag = crate::proxy::QuicTag::new(group.tag);
            quic.push((
                group.name.clone(),
                group.address,
                crate::proxy::InheritedGroup {
                    tag,
                    sockets,
                    relays,
                },
            ));
        }
        Ok(Self {
            accept_after,
            listeners,
            quic,
            control,
        })
    }
}

/// The process from its first generation to its exit, as steps: the
/// telemetry, the data plane (the first generation and its listeners),
/// the admin and metrics sockets, the start recorded, the control plane,
/// the admin and metrics endpoints, ready; then the signals until it
/// stops.
async fn serve(
    options: Options,
    start: Start,
    binary: super::upgrade::Binary,
    workers: Arc<Workers>,
    imported: Option<crate::gatewayapi::Imported>,
) -> Result<(), StartError> {
    let signals = Signals::install().map_err(StartError::Runtime)?;
    let (log_level, prometheus) = telemetry_up(&start, imported.as_ref())?;
    let phase = Arc::new(PhaseCell::default());
    let Start {
        text,
        spec,
        id,
        new_record,
        rolled_back_to,
        history,
        upgrade,
        ..
    } = start;
    let state_dir = spec.runtime.state_dir.clone();
    let mut history = History::new(spec.runtime.history_limit, state_dir.clone(), history);
    let Inherited {
        accept_after,
        listeners: inherited_listeners,
        quic: inherited_quic,
        control: mut inherited_control,
    } = Inherited::adopt(upgrade.as_ref())?;
    let plane = DataPlane::start(
        &spec,
        id,
        workers,
        &options,
        (inherited_listeners, inherited_quic),
    )
    .await?;
    let sockets = ControlSockets::bind(&spec, &mut inherited_control)?;
    drop(inherited_control);

    record_start(
        &mut history,
        (id, &spec, &text),
        (new_record, rolled_back_to),
        upgrade.as_ref(),
    );
    // This future runs as long as the process: what it no longer needs
    // goes now, not at exit (the text is 1.2 MB at 10 000 routes, kept
    // compressed in history), and the pages freed since go back to the
    // system.
    drop(text);
    drop(upgrade);
    history.persist()?;
    (options.release_memory)();
    plane.listeners.start(plane.bound);

    let control = Arc::new(Control::new(ControlParts {
        store: plane.store,
        shared: plane.shared,
        listeners: Arc::clone(&plane.listeners),
        certificates: plane.certificates,
        history,
        config_file: options.config.clone(),
        log_level,
        phase: Arc::clone(&phase),
        release_memory: options.release_memory,
    }));
    let hashed = binary.hashed();
    let process = Process::new(
        options.config.clone(),
        options.watch,
        options.gateway_api.clone(),
        binary,
        sockets.kept,
        state_dir.unwrap_or_else(std::env::temp_dir),
    );
    control.set_process(Arc::clone(&process) as Arc<dyn crate::control::ProcessControl>);
    let writer = control_plane(&control, &spec, &options)?;

    let admin_router = admin::router(
        writer.clone(),
        Security::new(
            sockets.admin_address,
            &spec.admin.callers,
            spec.admin.max_body,
        ),
    );
    // Status names the running binary's hash from its first answer, and
    // an upgrading parent keeps the admin socket until this process can
    // answer it fully.
    hashed.await;
    let metrics_address = serve_endpoints(
        sockets.admin,
        admin_router,
        sockets
            .metrics
            .map(|socket| (socket, metrics_router(Arc::clone(&control), prometheus))),
        &spec,
        &process,
        accept_after,
    )?;

    phase.advance(Phase::Running);
    metrics::gauge!(m::ACTIVE_GENERATION).set(id.0 as f64);
    tokio::spawn(refresh_gauges(Arc::clone(&control)));
    // Subscribed before anyone can learn we are ready: a drain requested
    // the moment after the announcement must still be seen.
    let stopping = process.stopping();
    announce_ready(&control, sockets.admin_address, metrics_address);
    signal_loop(writer, process, signals, stopping).await;
    Ok(())
}

/// Logging, the audit log, the notes of the start and of a Gateway API
/// import, metrics and trace export.
fn telemetry_up(
    start: &Start,
    imported: Option<&crate::gatewayapi::Imported>,
) -> Result<
    (
        telemetry::LogLevel,
        metrics_exporter_prometheus::PrometheusHandle,
    ),
    StartError,
> {
    let log_level = telemetry::init_logging(&start.spec.log).map_err(StartError::Log)?;
    if let Some(path) = &start.spec.admin.audit_log {
        telemetry::audit::init(path).map_err(StartError::Log)?;
    }
    for note in &start.notes {
        tracing::info!("{note}");
    }
    if let Some(imported) = imported {
        super::watch::report_import(imported);
    }
    let prometheus = telemetry::init_metrics();
    telemetry::otlp::init(&start.spec.tracing).map_err(StartError::Log)?;
    Ok((log_level, prometheus))
}

/// The first generation, the store that publishes it, the certificates
/// its listeners serve and the listeners themselves (inherited ones
/// adopted, new ones bound, not yet accepting).
struct DataPlane {
    shared: Arc<SharedState>,
    store: Arc<GenerationStore>,
    certificates: Arc<CertStore>,
    listeners: Arc<ListenerSet>,
    bound: Vec<crate::proxy::BoundListener>,
}

impl DataPlane {
    async fn start(
        spec: &Arc<Spec>,
        id: GenerationId,
        workers: Arc<Workers>,
        options: &Options,
        (inherited, quic): (InheritedListeners, InheritedQuic),
    ) -> Result<DataPlane, StartError> {
        // Before anything that exports series is made.
        telemetry::series::set_max_series(spec.metrics_max_series);
        let shared = Arc::new(SharedState::default());
        shared.discovery.configure(&spec.discovery);
        // Members from DNS and files are in before the first generation
        // serves (a source that does not answer in time follows later).
        let primed = shared
            .discovery
            .prime(spec, shared.discovery.patience())
            .await;
        let first = generation::build(Arc::clone(spec), id, &shared)?;
        drop(primed);
        // The parse tree is gone: its pages go back before anything else
        // is allocated (with only the collection further down, RSS at
        // 10 000 routes ends 1 MiB higher and peaks 2 MiB higher).
        (options.release_memory)();
        let store = Arc::new(GenerationStore::new(first));
        let admission = Admission::new(Arc::clone(&store));
        let certificates = Arc::new(CertStore::default());
        certificates.swap(generation::certificate_material(spec, store.active_id()));
        certificates.follow(Arc::clone(&store) as Arc<dyn crate::tls::ActiveMaterial>);
        let listeners = ListenerSet::new(admission, Arc::clone(&certificates), Some(workers));
        listeners.inherit(inherited);
        for (name, address, group) in quic {
            listeners.inherit_quic(name, address, group);
        }
        let bound = listeners.bind_new(&spec.listeners)?;
        listeners.release_unadopted();
        Ok(DataPlane {
            shared,
            store,
            certificates,
            listeners,
            bound,
        })
    }
}

/// The admin socket and the metrics one (inherited or bound), and the
/// copies kept to hand over at the next upgrade.
struct ControlSockets {
    admin: tokio::net::TcpListener,
    admin_address: SocketAddr,
    metrics: Option<tokio::net::TcpListener>,
    kept: Vec<(SocketRole, SocketAddr, std::net::TcpListener)>,
}

impl ControlSockets {
    fn bind(
        spec: &Spec,
        inherited: &mut Vec<(SocketRole, SocketAddr, std::net::TcpListener)>,
    ) -> Result<ControlSockets, StartError> {
        let (admin, admin_kept) = control_socket(SocketRole::Admin, spec.admin.bind, inherited)?;
        let admin_address = admin.local_addr().unwrap_or(spec.admin.bind);
        let mut kept = vec![(SocketRole::Admin, spec.admin.bind, admin_kept)];
        let metrics = match spec.metrics_bind {
            Some(bind) => {
                let (socket, metrics_kept) = control_socket(SocketRole::Metrics, bind, inherited)?;
                kept.push((SocketRole::Metrics, bind, metrics_kept));
                Some(socket)
            }
            None => None,
        };
        Ok(ControlSockets {
            admin,
            admin_address,
            metrics,
            kept,
        })
    }
}

/// What runs beside the writer: a pending generation taken up again,
/// the writer (local or the fleet's), the certificate keeper, the
/// freeze windows' events, webhooks and `--watch`.
fn control_plane(
    control: &Arc<Control>,
    spec: &Spec,
    options: &Options,
) -> Result<Writer, StartError> {
    // A generation that was pending when the last process stopped (or
    // handed over) is pending again, with what is left of its window.
    control.resume_pending();
    if spec.fleet.is_some() && options.watch {
        return Err(StartError::Watch(
            "--watch and [fleet] would be two sources of truth for the routes: a fleet instance takes its shared configuration from etcd".into(),
        ));
    }
    let writer = Writer::start(Arc::clone(control), spec.fleet.clone());
    // ACME orders and renewals, OCSP staples (DESIGN §21); after the
    // writer, so that a fleet instance orders through its fleet.
    control.keeper().start();
    control.watch_freeze();
    control.start_webhooks(&spec.admin.webhooks);
    if options.watch {
        match super::watch::spawn(Arc::clone(control), options.config.clone()) {
            Ok(()) => {
                tracing::info!(config = %options.config.display(), "watching the configuration file and the files it references")
            }
            Err(error) => return Err(StartError::Watch(error.to_string())),
        }
        if let Some(source) = &options.gateway_api {
            super::watch::spawn_gateway_api(source.clone(), options.config.clone())
                .map_err(|e| StartError::Watch(e.to_string()))?;
            tracing::info!(folder = %source.dir.display(), "watching the Gateway API resources");
        }
    }
    Ok(writer)
}

/// Serves the admin API (over TLS when `admin.tls` says so) and the
/// metrics endpoint; after a hand-over, only once the old process has
/// stopped accepting. Returns the metrics address.
fn serve_endpoints(
    admin_socket: tokio::net::TcpListener,
    admin_router: axum::Router,
    metrics: Option<(tokio::net::TcpListener, axum::Router)>,
    spec: &Spec,
    process: &Arc<Process>,
    accept_after: Option<std::os::fd::OwnedFd>,
) -> Result<Option<SocketAddr>, StartError> {
    let gate = match accept_after {
        Some(pipe) => Gate::until_closed(pipe),
        None => Gate::open(),
    };
    let admin_tls = match &spec.admin.tls {
        Some(tls) => Some(super::control_server::tls_acceptor(tls).map_err(StartError::AdminTls)?),
        None => None,
    };
    tokio::spawn(super::control_server::serve_tls(
        admin_socket,
        admin_router,
        process.stopping(),
        "admin",
        process.served(),
        gate.clone(),
        admin_tls,
    ));
    let Some((socket, router)) = metrics else {
        return Ok(None);
    };
    let address = socket.local_addr().ok();
    tokio::spawn(super::control_server::serve(
        socket,
        router,
        process.stopping(),
        "metrics",
        process.served(),
        gate,
    ));
    Ok(address)
}

/// Records how this process started: the generation it built (at a
/// start, a drain-aware restart, or the rollback a confirm deadline made
/// while no process ran) and, after an upgrade, that upgrade as done.
fn record_start(
    history: &mut History,
    (id, spec, text): (GenerationId, &crate::plan::Spec, &crate::config::ConfigText),
    (new_record, rolled_back_to): (Option<Source>, Option<GenerationId>),
    upgrade: Option<&UpgradeState>,
) {
    if let Some(source) = new_record {
        let (requested_by, reason) = if source == Source::AutoRollback {
            (
                Some("cutover".to_owned()),
                Some("confirm deadline passed while no process ran".to_owned()),
            )
        } else {
            upgrade.map_or((None, None), |u| (u.requested_by.clone(), u.reason.clone()))
        };
        history.record_generation(GenerationRecord {
            generation: id,
            config_version: spec.config_version.clone(),
            activated_at: rfc3339(SystemTime::now()),
            source,
            rolled_back_to,
            requested_by,
            reason,
            caller: upgrade.and_then(|u| u.caller.clone()),
            config: RetainedText::new(&text.text),
            base_dir: text.base_dir.clone(),
            origin: text.origin.clone(),
        });
    }
    if let Some(upgrade) = upgrade {
        history.update_operation(&upgrade.operation_id, |op| {
            op.outcome = Outcome::Succeeded;
            op.generation = Some(id);
            op.pid = std::process::id();
            op.previous_pid = Some(upgrade.parent_pid);
            op.summary = format!(
                "drain-aware restart: pid {} -> pid {}",
                upgrade.parent_pid,
                std::process::id()
            );
        });
    }
}

/// The metrics listener's routes: `/metrics` (rendered off the serving
/// threads, with the live generations' series) and `/ready` without the
/// admin token, for probes that cannot carry one.
fn metrics_router(
    control: Arc<Control>,
    prometheus: metrics_exporter_prometheus::PrometheusHandle,
) -> axum::Router {
    let scraped = Arc::clone(&control);
    let probed = control;
    axum::Router::new()
        // Readiness without the admin token, for probes that
        // cannot carry one (a kubelet): the phase, nothing more.
        .route(
            "/ready",
            axum::routing::get(move || {
                let running = probed.phase().get() == Phase::Running;
                async move {
                    if running {
                        (axum::http::StatusCode::OK, "ready\n")
                    } else {
                        (axum::http::StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
                    }
                }
            }),
        )
        .route(
            "/metrics",
            axum::routing::get(move || {
                let prometheus = prometheus.clone();
                let control = Arc::clone(&scraped);
                // Rendering thousands of series takes milliseconds:
                // not on a thread that serves requests.
                async move {
                    tokio::task::spawn_blocking(move || {
                        let pending = control.pending().map(|p| (p.generation, p.rollback_to));
                        let roles = control.store().roles(pending);
                        let generations: Vec<_> = roles
                            .iter()
                            .map(|(role, ledger)| telemetry::series::GenerationSeries {
                                role,
                                id: ledger.generation().0,
                                requests: ledger.requests.get(),
                                errors: ledger.errors.get(),
                                duration: &ledger.duration,
                            })
                            .collect();
                        telemetry::series::scrape(&prometheus, &generations)
                    })
                    .await
                    .map_err(|_| axum::http::StatusCode::INTERNAL_SERVER_ERROR)
                }
            }),
        )
}

/// One JSON line on stdout once every socket is bound and the first
/// generation is active: what supervisors, tests and an upgrading parent
/// wait for. Under systemd (`Type=notify`) also `READY=1` with our pid.
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
    super::systemd::notify(&format!("READY=1\nMAINPID={}", std::process::id()));
    tracing::info!(%admin, generation = %control.store().active_id(), "cutover ready");
}
