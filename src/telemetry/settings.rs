//! What telemetry is set up with: the log's and the tracer's settings,
//! as plain data. Validation (`plan`) produces them; telemetry imports
//! nothing of the floors above it.

use std::path::PathBuf;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// `[tracing]`: where spans go, and which new traces are sampled.
#[derive(Debug, Clone)]
pub struct TracingSpec {
    /// The OTLP/HTTP collector (`…/v1/traces` is appended), if any.
    pub otlp_endpoint: Option<http::Uri>,
    pub service_name: String,
    /// The share of new traces (no `traceparent`) that are sampled and
    /// exported; continued traces follow their caller's decision.
    pub sample_ratio: f64,
}

#[derive(Debug, Clone)]
pub struct LogSpec {
    /// A `tracing_subscriber::EnvFilter` directive (`info`, `cutover=debug`).
    pub level: String,
    pub format: LogFormat,
    pub file: Option<PathBuf>,
    /// Whether access lines are written (live).
    pub access: bool,
    /// The access log's own file; `None`: the log sink.
    pub access_file: Option<PathBuf>,
}
