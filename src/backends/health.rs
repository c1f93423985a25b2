//! Active health checks: one checker task per backend identity, however
//! many generations name it. The task holds the backend weakly and ends
//! once no live generation does. The first check runs as soon as the
//! backend is created (when the first generation naming it is built);
//! later ones every `interval`, jittered by ±10 % so that checkers started
//! together drift apart.
//!
//! A backend with a check starts `unknown` and takes traffic once a check
//! passes; `unhealthy_after` failures in a row make it `unhealthy`,
//! `healthy_after` passes in a row healthy again (and start its slow
//! start). A backend without a check is always `unchecked`, which counts
//! as healthy.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use http::header::{HeaderValue, CONTENT_TYPE, HOST, TE, USER_AGENT};
use http::{Request, Uri};
use http_body_util::BodyExt;

use super::{Backend, SignalledBody};
use crate::clock::now_ms;
use crate::plan::{HealthProbe, HealthSpec};

/// Most of a check response's body that is read (so that its connection
/// can be reused); the rest is dropped with the connection.
const MAX_CHECK_BODY: usize = 64 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthState {
    /// No active check configured: trusted.
    Unchecked,
    /// Checked, no verdict yet: no traffic unless every backend is out.
    Unknown,
    Healthy,
    Unhealthy,
}

impl HealthState {
    fn from_u8(v: u8) -> Self {
        match v {
            1 => HealthState::Unknown,
            2 => HealthState::Healthy,
            3 => HealthState::Unhealthy,
            _ => HealthState::Unchecked,
        }
    }

    /// As the admin API spells it.
    pub fn name(self) -> &'static str {
        match self {
            HealthState::Unchecked => "unchecked",
            HealthState::Unknown => "unknown",
            HealthState::Healthy => "healthy",
            HealthState::Unhealthy => "unhealthy",
        }
    }

    fn as_u8(self) -> u8 {
        match self {
            HealthState::Unchecked => 0,
            HealthState::Unknown => 1,
            HealthState::Healthy => 2,
            HealthState::Unhealthy => 3,
        }
    }
}

#[derive(Debug)]
pub struct Health {
    state: AtomicU8,
    /// When it last became healthy after being unhealthy (`now_ms`); 0:
    /// not ramping. Read by slow start.
    recovered_at: AtomicU64,
    last: Mutex<Option<LastCheck>>,
}

/// The most recent check, for the admin view.
#[derive(Debug, Clone)]
pub struct LastCheck {
    pub at_ms: u64,
    pub passed: bool,
    pub detail: String,
}

impl Health {
    pub fn new(checked: bool) -> Self {
        let state = if checked {
            HealthState::Unknown
        } else {
            HealthState::Unchecked
        };
        Self {
            state: AtomicU8::new(state.as_u8()),
            recovered_at: AtomicU64::new(0),
            last: Mutex::new(None),
        }
    }

    pub fn state(&self) -> HealthState {
        HealthState::from_u8(self.state.load(Ordering::Acquire))
    }

    /// Whether active checks let traffic through.
    #[inline]
    pub fn passing(&self) -> bool {
        matches!(self.state(), HealthState::Unchecked | HealthState::Healthy)
    }

    /// When the backend came back from unhealthy, if that was recent.
    pub fn recovered_at(&self) -> Option<u64> {
        match self.recovered_at.load(Ordering::Relaxed) {
            0 => None,
            at => Some(at),
        }
    }

    pub fn last(&self) -> Option<LastCheck> {
        self.last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set(&self, state: HealthState) {
        if self.state.swap(state.as_u8(), Ordering::AcqRel) != state.as_u8() {
            super::note_state_change();
        }
    }
}

/// Starts the checker of a new backend, if it has a check and there is a
/// runtime to run it on (building a generation outside one, as benches
/// and unit tests do, checks nothing).
pub(super) fn start(backend: &Arc<Backend>) {
    let Some(spec) = backend.key.health.clone() else {
        return;
    };
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(run(Arc::downgrade(backend), spec));
}

async fn run(backend: Weak<Backend>, spec: HealthSpec) {
    let mut passes = 0u32;
    let mut failures = 0u32;
    loop {
        let Some(live) = backend.upgrade() else {
            return;
        };
        let verdict = match tokio::time::timeout(spec.timeout, check(&live, &spec)).await {
            Ok(verdict) => verdict,
            Err(_) => Err(format!("no answer within {:?}", spec.timeout)),
        };
        let passed = verdict.is_ok();
        if passed {
            passes += 1;
            failures = 0;
        } else {
            failures += 1;
            passes = 0;
        }
        let health = &live.health;
        let before = health.state();
        let after = match before {
            HealthState::Unknown if passed => HealthState::Healthy,
            HealthState::Unknown if failures >= spec.unhealthy_after => HealthState::Unhealthy,
            HealthState::Healthy if failures >= spec.unhealthy_after => HealthState::Unhealthy,
            HealthState::Unhealthy if passes >= spec.healthy_after => HealthState::Healthy,
            other => other,
        };
        if after != before {
            if before == HealthState::Unhealthy {
                health.recovered_at.store(now_ms(), Ordering::Relaxed);
            }
            health.set(after);
            let detail = verdict.as_ref().err().map_or("", String::as_str);
            tracing::info!(backend = %live.key.addr, from = ?before, to = ?after, detail, "backend health changed");
        } else if let Some(at) = health.recovered_at() {
            // Slow start needs the recovery time only for its ramp (at most 1 h).
            if now_ms().saturating_sub(at) > 3_600_000 {
                health.recovered_at.store(0, Ordering::Relaxed);
            }
        }
        if let Some(count) = live.checks.get(usize::from(!passed)) {
            count.add(1);
        }
        *health.last.lock().unwrap_or_else(PoisonError::into_inner) = Some(LastCheck {
            at_ms: now_ms(),
            passed,
            detail: verdict.err().unwrap_or_default(),
        });
        drop(live);
        tokio::time::sleep(jittered(spec.interval)).await;
    }
}

fn jittered(interval: Duration) -> Duration {
    interval.mul_f64(0.9 + 0.2 * fastrand::f64())
}

/// One check: `Ok` if it passed, else why not.
async fn check(backend: &Backend, spec: &HealthSpec) -> Result<(), String> {
    match &spec.probe {
        HealthProbe::Tcp => tokio::net::TcpStream::connect(backend.key.addr.as_str())
            .await
            .map(drop)
            .map_err(|e| format!("connect: {e}")),
        HealthProbe::Grpc { service } => grpc_check(backend, service).await,
        HealthProbe::Http {
            path,
            host,
            expect_status,
        } => {
            let uri = Uri::builder()
                .scheme(backend.scheme.clone())
                .authority(backend.authority.clone())
                .path_and_query(path.as_str())
                .build()
                .map_err(|e| format!("check request: {e}"))?;
            let host = match host {
                Some(host) => HeaderValue::from_str(host),
                None => HeaderValue::from_str(backend.authority.as_str()),
            }
            .map_err(|e| format!("check Host: {e}"))?;
            let mut request = Request::new(SignalledBody::empty());
            *request.uri_mut() = uri;
            *request.version_mut() = backend.version;
            // HTTP/2 carries the authority in the URI (HTTP/3 moves
            // `Host` there).
            if backend.version != http::Version::HTTP_2 {
                request.headers_mut().insert(HOST, host);
            }
            request
                .headers_mut()
                .insert(USER_AGENT, HeaderValue::from_static("cutover-health-check"));
            let response = backend.own_request(request).await?;
            let status = response.status();
            // Read (a bounded part of) the body so the connection is reused.
            let _ = http_body_util::Limited::new(response.into_body(), MAX_CHECK_BODY)
                .collect()
                .await;
            let passed = if expect_status.is_empty() {
                status.is_success()
            } else {
                expect_status.contains(&status.as_u16())
            };
            if passed {
                Ok(())
            } else {
                Err(format!("status {}", status.as_u16()))
            }
        }
    }
}

/// `grpc.health.v1.Health/Check` for `service` over the backend's own
/// HTTP/2 connection: passes when the call ends OK with SERVING.
async fn grpc_check(backend: &Backend, service: &str) -> Result<(), String> {
    let uri = Uri::builder()
        .scheme(backend.scheme.clone())
        .authority(backend.authority.clone())
        .path_and_query("/grpc.health.v1.Health/Check")
        .build()
        .map_err(|e| format!("check request: {e}"))?;
    let body = super::RequestBody::Buffered(Some(crate::grpc::health_request(service)));
    let (body, _) = SignalledBody::new(body);
    let mut request = Request::new(body);
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = uri;
    *request.version_mut() = backend.version;
    let headers = request.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(TE, HeaderValue::from_static("trailers"));
    headers.insert(USER_AGENT, HeaderValue::from_static("cutover-health-check"));
    let response = backend.own_request(request).await?;
    if response.status() != http::StatusCode::OK {
        return Err(format!("status {}", response.status().as_u16()));
    }
    let head_status = crate::grpc::Code::of(response.headers());
    let collected = http_body_util::Limited::new(response.into_body(), MAX_CHECK_BODY)
        .collect()
        .await
        .map_err(|e| format!("response: {e}"))?;
    let code = head_status
        .or_else(|| collected.trailers().and_then(crate::grpc::Code::of))
        .ok_or("the call ended without a grpc-status")?;
    if code != crate::grpc::Code::Ok {
        return Err(format!("grpc-status {} ({})", code as u8, code.name()));
    }
    match crate::grpc::health_status(&collected.to_bytes()) {
        Ok(1) => Ok(()),
        Ok(0) => Err("UNKNOWN".to_owned()),
        Ok(2) => Err("NOT_SERVING".to_owned()),
        Ok(3) => Err("SERVICE_UNKNOWN".to_owned()),
        Ok(other) => Err(format!("serving status {other}")),
        Err(reason) => Err(format!("health response: {reason}")),
    }
}
