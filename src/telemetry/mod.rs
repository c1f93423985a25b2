//! Telemetry: tracing initialisation with a live log level, metric names,
//! and the Prometheus recorder.

pub mod access;
pub mod audit;
pub mod metrics;
#[cfg(feature = "otlp")]
pub mod otlp;
pub mod series;
mod settings;
pub mod trace;
pub mod waf;

pub use settings::{LogFormat, LogSpec, TracingSpec};

/// Without the `otlp` feature nothing is exported (and validation refuses
/// `tracing.otlp_endpoint`).
#[cfg(not(feature = "otlp"))]
pub mod otlp {
    pub fn init(spec: &super::TracingSpec) -> std::io::Result<()> {
        super::trace::set_sample_ratio(spec.sample_ratio);
        Ok(())
    }
}

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Registry};

/// Changes the log level of the running process (`log.level` is live).
pub struct LogLevel {
    handle: Option<reload::Handle<EnvFilter, Registry>>,
    current: Mutex<String>,
}

impl LogLevel {
    /// A handle that changes nothing (tests, or logging set up elsewhere).
    pub fn detached() -> Self {
        Self {
            handle: None,
            current: Mutex::new(String::new()),
        }
    }

    /// Applies `level` if it differs from the current one.
    pub fn apply(&self, level: &str) {
        let mut current = self
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *current == level {
            return;
        }
        let filter = EnvFilter::builder().parse(filter_directives(level));
        if let (Some(handle), Ok(filter)) = (&self.handle, filter) {
            match handle.reload(filter) {
                Ok(()) => {
                    tracing::info!(level, "log level changed");
                    *current = level.to_owned();
                }
                Err(error) => tracing::warn!(%error, "cannot change the log level"),
            }
        }
    }
}

/// The levels of the libraries cutover logs through, set here and
/// nowhere else. Their per-connection complaints about a client would
/// make the log grow with traffic: rustls warns about every ClientHello
/// that names an IP address as its server name (wrk, health probes and
/// many scripts do), 448 lines in a 6 s load run. An operator's level that
/// names one of them wins (`info,rustls=warn`).
const DEPENDENCY_LEVELS: &[(&str, &str)] = &[("rustls", "error"), ("tokio_rustls", "error")];

/// The filter for `log.level`: the operator's directives, plus the
/// dependency levels it does not set itself.
pub fn filter_directives(level: &str) -> String {
    let mut directives = level.to_owned();
    for (target, cap) in DEPENDENCY_LEVELS {
        let named = level
            .split(',')
            .any(|d| d.trim().split(['=', '[', ':']).next() == Some(*target));
        if !named {
            directives.push_str(&format!(",{target}={cap}"));
        }
    }
    directives
}

/// Installs the tracing subscriber: text or JSON, to stderr or a file.
pub fn init_logging(spec: &LogSpec) -> std::io::Result<LogLevel> {
    let filter = EnvFilter::builder().parse_lossy(filter_directives(&spec.level));
    let (filter, handle) = reload::Layer::new(filter);
    let writer = match &spec.file {
        Some(path) => {
            let file = Arc::new(Mutex::new(open_append(path)?));
            let _ = LOG_FILE.set((path.clone(), Arc::clone(&file)));
            tracing_subscriber::fmt::writer::BoxMakeWriter::new(SharedFile(file))
        }
        None => tracing_subscriber::fmt::writer::BoxMakeWriter::new(std::io::stderr),
    };
    access::init(spec)?;
    let ansi = spec.file.is_none() && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let registry = tracing_subscriber::registry().with(filter);
    let result = match spec.format {
        LogFormat::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(writer)
                    .with_ansi(ansi),
            )
            .try_init(),
        LogFormat::Json => registry
            .with(tracing_subscriber::fmt::layer().json().with_writer(writer))
            .try_init(),
    };
    if result.is_err() {
        return Ok(LogLevel::detached());
    }
    Ok(LogLevel {
        handle: Some(handle),
        current: Mutex::new(spec.level.clone()),
    })
}

/// The log file and its path, for reopening.
static LOG_FILE: OnceLock<(PathBuf, Arc<Mutex<File>>)> = OnceLock::new();

fn open_append(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

/// The log file as tracing writes it: one line per lock, so a reopen
/// swaps the file between lines.
struct SharedFile(Arc<Mutex<File>>);

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for SharedFile {
    type Writer = FileGuard<'a>;

    fn make_writer(&'a self) -> FileGuard<'a> {
        FileGuard(
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

struct FileGuard<'a>(std::sync::MutexGuard<'a, File>);

impl std::io::Write for FileGuard<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// Reopens the log file and the access log's (SIGUSR1, after logrotate
/// moved them); stderr needs nothing.
pub fn reopen_logs() {
    if let Some((path, file)) = LOG_FILE.get() {
        match open_append(path) {
            Ok(fresh) => {
                *file
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = fresh;
            }
            Err(error) => {
                tracing::error!(path = %path.display(), %error, "cannot reopen the log file; still writing to the old one")
            }
        }
    }
    access::reopen();
    audit::reopen();
}

/// How often recorded durations are folded into their histogram buckets.
/// Until then each sample waits in its series' lock-free buffer (16 bytes
/// a sample, about 1 MiB a second at 70 000 requests a second), so this
/// bounds that memory whether or not anything scrapes `/metrics`.
pub const UPKEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Installs the Prometheus recorder once per process and returns its
/// handle; later calls (tests) get a recorder-less handle. Durations are
/// exported as histograms with fixed buckets (aggregatable across
/// instances, unlike summaries), folded in by a background thread every
/// `UPKEEP_INTERVAL` instead of by whoever happens to scrape.
pub fn init_metrics() -> PrometheusHandle {
    static HANDLE: std::sync::OnceLock<PrometheusHandle> = std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = match builder() {
                Ok(builder) => builder,
                Err(error) => {
                    tracing::warn!(%error, "metrics: histogram buckets refused; exporting summaries");
                    PrometheusBuilder::new()
                }
            }
            .build_recorder();
            let handle = recorder.handle();
            if ::metrics::set_global_recorder(recorder).is_ok() {
                self::metrics::describe();
                // At 0 from the start, so an alert on its rate has a series.
                ::metrics::counter!(self::metrics::LOG_DROPPED).absolute(0);
                ::metrics::counter!(self::metrics::SERIES_REFUSED).absolute(0);
                ::metrics::counter!(self::metrics::TRACE_SPANS_DROPPED).absolute(0);
                spawn_upkeep(handle.clone());
            }
            handle
        })
        .clone()
}

fn builder() -> Result<PrometheusBuilder, BuildError> {
    use self::metrics as m;
    PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(m::ACTIVATION_DURATION.to_owned()),
            m::ACTIVATION_DURATION_BUCKETS,
        )?
        .set_buckets_for_metric(
            Matcher::Full(m::TCP_CONNECTION_DURATION.to_owned()),
            m::TCP_CONNECTION_DURATION_BUCKETS,
        )?
        .set_buckets_for_metric(
            Matcher::Full(m::UDP_SESSION_DURATION.to_owned()),
            m::TCP_CONNECTION_DURATION_BUCKETS,
        )
}

/// Folds histogram samples on a thread of its own, off the runtime that
/// serves requests.
fn spawn_upkeep(handle: PrometheusHandle) {
    let spawned = std::thread::Builder::new()
        .name("cutover-metrics".into())
        .spawn(move || loop {
            std::thread::sleep(UPKEEP_INTERVAL);
            handle.run_upkeep();
        });
    if let Err(error) = spawned {
        tracing::warn!(%error, "metrics: no upkeep thread; histogram samples are folded in on scrape only");
    }
}

/// Work pinned to one live generation, as `refresh_gauges` reads it.
#[derive(Debug, Clone, Copy)]
pub struct PinnedLoad {
    pub inflight_requests: u64,
    pub open_connections: u64,
    /// Seconds since a newer generation replaced it; `None` while active.
    pub superseded_secs: Option<f64>,
}

/// Publishes the gauges that are read off state rather than counted on
/// the request path: phase (as its gauge value), live generations, pinned
/// work, oldest pin age. The owners of that state push it here.
pub fn refresh_gauges(phase: f64, loads: &[PinnedLoad]) {
    use self::metrics as m;
    ::metrics::gauge!(m::PHASE).set(phase);
    ::metrics::gauge!(m::LIVE_GENERATIONS).set(loads.len() as f64);
    let (mut active, mut superseded) = ((0u64, 0u64), (0u64, 0u64));
    let mut oldest: f64 = 0.0;
    for load in loads {
        let slot = if load.superseded_secs.is_some() {
            &mut superseded
        } else {
            &mut active
        };
        slot.0 += load.inflight_requests;
        slot.1 += load.open_connections;
        oldest = oldest.max(load.superseded_secs.unwrap_or(0.0));
    }
    for (label, (requests, connections)) in [("active", active), ("superseded", superseded)] {
        ::metrics::gauge!(m::GENERATION_INFLIGHT, m::LABEL_GENERATION => label)
            .set(requests as f64);
        ::metrics::gauge!(m::GENERATION_CONNECTIONS, m::LABEL_GENERATION => label)
            .set(connections as f64);
    }
    ::metrics::gauge!(m::OLDEST_PIN_AGE).set(oldest);
}

#[cfg(test)]
mod tests {
    use super::filter_directives;

    #[test]
    fn dependency_levels_are_added_unless_the_operator_names_them() {
        assert_eq!(
            filter_directives("info"),
            "info,rustls=error,tokio_rustls=error"
        );
        assert_eq!(
            filter_directives("debug,rustls=warn"),
            "debug,rustls=warn,tokio_rustls=error"
        );
        assert_eq!(
            filter_directives("rustls::msgs=trace"),
            "rustls::msgs=trace,tokio_rustls=error"
        );
        // Every result is a filter tracing accepts.
        for level in ["info", "warn,cutover::access=off", "debug,rustls=warn"] {
            assert!(tracing_subscriber::EnvFilter::builder()
                .parse(filter_directives(level))
                .is_ok());
        }
    }
}
