//! Route authentication on the request path (DESIGN §19): the checks of
//! `auth/`, and forward auth's exchange with its auth service through
//! the pinned generation's upstream (pool, health, outlier detection and
//! TLS as for any upstream).

use std::sync::Arc;
use std::time::Instant;

use http_body_util::BodyExt as _;

use crate::auth::forward::{Forward, Said, MAX_ANSWER_BODY};
use crate::auth::{Asked, Auth, Verdict};
use crate::backends::{Attempt, SignalledBody};
use crate::generation::{CacheLookup, RouteShared, Upstream};

/// Checks `asked` by `auth` for `route`; `service` is the upstream a
/// forward auth names, in the request's generation.
pub(super) async fn check(
    auth: &Auth,
    asked: &Asked<'_>,
    service: Option<&Arc<Upstream>>,
    route: &RouteShared,
) -> Verdict {
    match auth {
        Auth::Basic(basic) => basic.check(asked.headers).await,
        Auth::Jwt(jwt) => jwt.check(asked.headers, asked.uri.query()).await,
        Auth::Forward(forward) => {
            let Some(cache) = &forward.cache else {
                return forward.judge(ask(forward, asked, service).await);
            };
            let key = cache.key(asked);
            if let Some(verdict) = cache.get(&key) {
                route.auth_cache(CacheLookup::Hit);
                return verdict;
            }
            let said = ask(forward, asked, service).await;
            let lifetime = match &said {
                Said::Answered(answer) => cache.lifetime(answer.headers()),
                Said::Failed(_) => None,
            };
            let verdict = forward.judge(said);
            let kept = cache.keep(key, lifetime, &verdict);
            route.auth_cache(if kept {
                CacheLookup::Stored
            } else {
                CacheLookup::Miss
            });
            verdict
        }
    }
}

async fn ask(forward: &Forward, asked: &Asked<'_>, service: Option<&Arc<Upstream>>) -> Said {
    let Some(service) = service else {
        return Said::Failed(format!(
            "upstream '{}' is not in the generation",
            forward.upstream
        ));
    };
    let Some(backend) = service.pick(&service.members()).map(Arc::clone) else {
        return Said::Failed(format!(
            "upstream '{}' has no usable backend",
            forward.upstream
        ));
    };
    let backend = &backend;
    let request = forward.request(
        asked,
        backend.scheme.clone(),
        backend.authority.clone(),
        SignalledBody::empty(),
    );
    let Some(mut request) = request else {
        return Said::Failed("the auth service's address makes no URI".into());
    };
    *request.version_mut() = backend.version;
    let _inflight = backend.start_request();
    let sent = Instant::now();
    let exchange = async {
        let response = backend.client().request(request).await.map_err(|e| {
            let attempt = if e.is_connect() {
                Attempt::ConnectError
            } else {
                Attempt::Error
            };
            (attempt, super::error::error_chain(&e))
        })?;
        let (parts, body) = response.into_parts();
        // A refusal's body goes to the client (bounded; a longer one is
        // sent empty); a success's is not needed.
        let body = if parts.status.is_success() {
            bytes::Bytes::new()
        } else {
            http_body_util::Limited::new(body, MAX_ANSWER_BODY)
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default()
        };
        Ok(http::Response::from_parts(parts, body))
    };
    let (attempt, said) = match tokio::time::timeout(forward.timeout, exchange).await {
        Err(_) => (
            Attempt::Timeout,
            Said::Failed(format!("no answer within {:?}", forward.timeout)),
        ),
        Ok(Err((attempt, why))) => (
            attempt,
            Said::Failed(format!("{}: {why}", backend.key.addr)),
        ),
        Ok(Ok(answer)) => (Attempt::Answered(answer.status()), Said::Answered(answer)),
    };
    service.report(backend, attempt, Some(sent.elapsed()));
    said
}
