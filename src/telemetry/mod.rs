//! Telemetry: tracing initialisation, metric names, the Prometheus handle.

pub mod metrics;
