//! cutover: an HTTP gateway whose configuration changes in generations.
//!
//! ```text
//! config file / admin body
//!    │  config::parse          (TOML → File* types, every error with line:col)
//!    ▼
//! FileConfig
//!    │  plan::validate         (all diagnostics at once; pure)
//!    ▼
//! Plan ──plan::diff(active, candidate)──▶ typed Diff + text diff
//!    │                                    └▶ restart-required changes → rejected
//!    │  generation::build      (routers, upstreams on shared backends; spawns nothing)
//!    ▼
//! Generation (immutable, Arc)
//!    │  runtime::GenerationStore::commit   (the only writer; CAS on the expected id)
//!    ▼
//! admission: load_full() → Arc<Generation> + in-flight guard ──▶ proxy ──▶ upstream
//! ```
//!
//! Arrows point one way: `config ← plan ← generation ← runtime ←
//! admission ← proxy`; `generation` holds handles into `backends`, which
//! knows nothing of generations; `control` (the local writer) drives
//! `plan`, `generation` and `runtime`; `fleet` sits above `control`;
//! `writer` chooses between them; `admin` talks to the writer and reads
//! `control`'s views; `lifecycle` starts the process. `telemetry` is the
//! floor everyone stands on and imports none of them. No import cycles
//! (`tests/it/layers.rs`).
#![deny(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod acme;
pub mod admin;
pub mod admission;
pub mod auth;
pub mod backends;
pub mod boxed;
pub mod cache;
pub mod clock;
pub mod config;
pub mod control;
pub mod ctl;
pub mod discovery;
pub mod errors;
pub mod files;
#[cfg(feature = "fleet")]
pub mod fleet;
pub mod gatewayapi;
pub mod generation;
pub mod grpc;
pub mod http2;
pub mod ids;
pub mod impact;
pub mod keeper;
pub mod lifecycle;
pub mod limits;
pub mod plan;
pub mod proxy;
pub mod runtime;
pub mod telemetry;
#[cfg(test)]
pub(crate) mod test_config;
pub mod tls;
pub mod waf;
pub mod weak_map;
pub mod writer;

pub use lifecycle::{run, Options};
