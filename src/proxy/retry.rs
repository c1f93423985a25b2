//! Requests that may take more than one attempt: `retry` and `hedge`.
//!
//! Such a request's body is read first (at most `max_replay_body`, with
//! its length declared or the body already complete); one whose body
//! cannot be kept takes the single-attempt path. A gRPC call's body has
//! no declared length (and a streaming call's may not end before its
//! answer begins): it is read only as the attempts ask for it, each
//! attempt replaying what was kept before reading on (`Tee`); the call
//! can be made again as long as no more than `max_replay_body` has
//! passed. Each attempt goes to a
//! backend the request has not tried yet when the upstream has one, gets
//! the rest of the route's `timeout` (or `per_try_timeout`, if shorter),
//! and its own guards; the answer that is kept gets the route slot.
//!
//! A failed attempt is made again when its failure is one `retry.on`
//! names, attempts are left, the method may be retried, and the
//! upstream's retry budget allows it, after a jittered exponential
//! backoff. With `hedge`, an attempt that has not answered within `delay`
//! is joined by another on a different backend (budget permitting); the
//! first usable response head wins and the others are dropped, which
//! closes their connections.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use crate::backends::ClientBody;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body as _;
use http_body_util::BodyExt;
use tokio::time::Instant;

use super::body::{ResponseBody, StreamGuards};
use super::conn::ConnContext;
use super::error::ProxyError;
use super::exchange::{exchange, request_hash, requested_upgrade, Hop, Target};
use crate::backends::{Backend, RequestBody, RetryBudget};
use crate::generation::{InflightGuard, Ledger, Route, RouteSlot, Upstream};
use crate::plan::{BudgetSpec, HedgeSpec, RetrySpec};

/// Whether a request takes this path: its route retries or hedges, its
/// method may be sent again, its body can be kept, and it asks for no
/// protocol upgrade.
pub(super) fn applies(route: &Route, req: &Request<ClientBody>) -> bool {
    let spec = &route.spec;
    if spec.retry.is_none() && spec.hedge.is_none() {
        return false;
    }
    let method_ok = match &spec.retry {
        Some(retry) => retry.methods.contains(req.method()),
        None => req.method().is_idempotent(),
    };
    // A protocol upgrade (WebSocket) is a tunnel, not an answer to repeat.
    method_ok
        && (replayable(req.body(), max_replay(spec.retry.as_ref()))
            || crate::grpc::is_grpc(req.headers()))
        && requested_upgrade(req).is_none()
}

fn max_replay(retry: Option<&RetrySpec>) -> u64 {
    retry.map_or(crate::plan::DEFAULT_MAX_REPLAY_BODY, |r| r.max_replay_body)
}

/// A body that is complete already, or says how long it is and is short
/// enough to keep.
fn replayable(body: &ClientBody, max: u64) -> bool {
    body.is_end_stream() || body.size_hint().exact().is_some_and(|n| n <= max)
}

/// How an attempt ended.
type Outcome = Result<Response<ResponseBody>, ProxyError>;

/// Whether an attempt's outcome is worth another attempt.
fn worth_retrying(outcome: &Outcome, retry: Option<&RetrySpec>) -> bool {
    let Some(on) = retry.map(|r| &r.on) else {
        // Hedging alone: any failure to answer, not an answer.
        return matches!(outcome, Err(e) if e.is_upstream());
    };
    match outcome {
        Ok(response) => {
            let status = response.status();
            // A trailers-only gRPC answer carries its status in the head.
            let grpc = on.grpc != 0
                && crate::grpc::Code::of(response.headers())
                    .is_some_and(|c| on.grpc & c.bit() != 0);
            grpc || (on.gateway_error
                && matches!(
                    status,
                    StatusCode::BAD_GATEWAY
                        | StatusCode::SERVICE_UNAVAILABLE
                        | StatusCode::GATEWAY_TIMEOUT
                ))
                || (on.server_error && status.is_server_error())
                || on.statuses.contains(&status.as_u16())
        }
        Err(ProxyError::UpstreamRefused(_)) => on.refused || on.connect_failure,
        Err(ProxyError::UpstreamConnect(_)) => on.connect_failure,
        Err(ProxyError::Upstream(_)) => on.reset || on.server_error,
        Err(ProxyError::UpstreamTimeout(_)) => on.timeout || on.server_error,
        Err(_) => false,
    }
}

/// Forwards a request that may take several attempts (see the module
/// notes).
/// Forwards a request: several attempts (`forward_with_retries`) or one
/// (`exchange.rs`).
pub(super) async fn forward(
    req: Request<ClientBody>,
    target: Target<'_>,
    conn: &ConnContext,
    route: &Route,
    upstream: &Arc<Upstream>,
    guard: InflightGuard,
    slot: Option<RouteSlot>,
) -> Result<Response<ResponseBody>, ProxyError> {
    if applies(route, &req) {
        Box::pin(forward_with_retries(
            req, target, conn, route, upstream, guard, slot,
        ))
        .await
    } else {
        super::exchange::forward(req, target, conn, route, upstream, guard, slot).await
    }
}

pub(super) async fn forward_with_retries(
    req: Request<ClientBody>,
    target: Target<'_>,
    conn: &ConnContext,
    route: &Route,
    upstream: &Arc<Upstream>,
    guard: InflightGuard,
    slot: Option<RouteSlot>,
) -> Result<Response<ResponseBody>, ProxyError> {
    let spec = &route.spec;
    let hash = request_hash(upstream, &req, conn, &target);
    let retry = spec.retry.as_ref();
    let (parts, body) = req.into_parts();
    let body = Replay::of(body, max_replay(retry), target.trail.as_ref()).await?;
    let started = Instant::now();
    let deadline = started + route.timeout();
    let budget = upstream.budget();
    budget.request();
    let budget_spec = retry.map_or_else(BudgetSpec::default, |r| r.budget);
    let attempts = retry.map_or(1, |r| r.attempts);
    let mut tried: Vec<usize> = Vec::with_capacity(attempts as usize);
    let template = Template {
        hash,
        ledger: Arc::clone(guard.ledger()),
        parts,
        body,
        target,
        conn,
        route,
        upstream,
        members: upstream.members(),
    };
    let mut last = None;
    for attempt in 1..=attempts {
        if attempt > 1 {
            if !template.body.again() {
                break;
            }
            if !budget.try_spend(&budget_spec) {
                budget.exhausted.add(1);
                break;
            }
            budget.retried.add(1);
            if let Some(retry) = retry {
                let pause = backoff(retry, attempt - 1);
                // Retries left, no time for them: the route timed out
                // (504, as when an attempt runs into the deadline), at
                // the deadline.
                if Instant::now() + pause >= deadline {
                    tokio::time::sleep_until(deadline).await;
                    last = Some(Err(ProxyError::UpstreamTimeout(route.timeout())));
                    break;
                }
                tokio::time::sleep(pause).await;
            }
        }
        let outcome = match spec.hedge {
            Some(hedge) => {
                hedged(&template, hedge, deadline, &mut tried, budget, &budget_spec).await
            }
            None => template.attempt(deadline, &mut tried).await,
        };
        let again = attempt < attempts && worth_retrying(&outcome, retry);
        last = Some(outcome);
        if !again {
            break;
        }
    }
    let mut response = last.unwrap_or(Err(ProxyError::NoBackend))?;
    // The kept answer holds the route slot; the request's own guard gives
    // way to the attempt's.
    if let Some(guards) = response.body_mut().guards_mut() {
        guards.route = slot;
    }
    drop(guard);
    Ok(response)
}

impl Replay {
    /// The request body as every attempt sends it: read whole (up to
    /// `max`), or, for a gRPC body of unknown length, shared by the
    /// attempts as it arrives (see `Tee`).
    async fn of(
        body: ClientBody,
        max: u64,
        trail: Option<&Arc<crate::telemetry::access::Trail>>,
    ) -> Result<Self, ProxyError> {
        if !replayable(&body, max) {
            return Ok(Replay::Teed(Tee::new(body, max, trail.cloned())));
        }
        let body = read_body(body, max).await?;
        if let (Some(trail), Some(body)) = (trail, &body) {
            trail.add_bytes_in(body.len());
        }
        Ok(Replay::Kept(body))
    }
}

/// What every attempt of one request is made from.
struct Template<'a> {
    /// For `policy = "hash"`: the first attempt goes where the key does.
    hash: Option<u64>,
    /// Of the generation the request is pinned to: each attempt holds
    /// its own entry.
    ledger: Arc<Ledger>,
    parts: http::request::Parts,
    body: Replay,
    target: Target<'a>,
    conn: &'a ConnContext,
    route: &'a Route,
    upstream: &'a Arc<Upstream>,
    /// The members every attempt picks among.
    members: crate::generation::MembersRef<'a>,
}

impl Template<'_> {
    /// A copy of the request for one more attempt, if its body can be
    /// sent (again).
    fn request(&self) -> Option<Request<RequestBody>> {
        let body = match &self.body {
            Replay::Kept(body) => RequestBody::Buffered(body.clone()),
            Replay::Teed(tee) => tee.cursor()?,
        };
        let mut req = Request::new(body);
        *req.method_mut() = self.parts.method.clone();
        *req.uri_mut() = self.parts.uri.clone();
        *req.version_mut() = self.parts.version;
        *req.headers_mut() = self.parts.headers.clone();
        Some(req)
    }

    /// The next backend: one not tried yet, if the upstream has any.
    fn pick(&self, tried: &mut Vec<usize>) -> Option<&Arc<Backend>> {
        self.upstream.pick_untried(&self.members, self.hash, tried)
    }

    /// One attempt at the next backend, within the route's deadline.
    fn attempt<'s>(
        &'s self,
        deadline: Instant,
        tried: &mut Vec<usize>,
    ) -> Pin<Box<dyn Future<Output = Outcome> + Send + 's>> {
        let backend = self.pick(tried);
        Box::pin(async move {
            let Some(backend) = backend else {
                return Err(ProxyError::NoBackend);
            };
            let Some(request) = self.request() else {
                return Err(ProxyError::Upstream(
                    "the request body could not be sent again".into(),
                ));
            };
            let left = deadline.saturating_duration_since(Instant::now());
            let timeout = self
                .route
                .spec
                .retry
                .as_ref()
                .and_then(|r| r.per_try_timeout)
                .map_or(left, |per_try| per_try.min(left));
            if timeout.is_zero() {
                return Err(ProxyError::UpstreamTimeout(self.route.timeout()));
            }
            let hop = Hop {
                conn: self.conn,
                upstream: self.upstream,
                backend,
                timeout,
                trail: self.target.trail.clone(),
                resend_unanswered: !self.route.spec.retry.as_ref().is_some_and(|r| r.on.reset),
            };
            let guards = StreamGuards::new(
                self.ledger.request(),
                None,
                backend.start_request(),
                Arc::clone(self.conn.admission.store()),
            );
            exchange(request, self.target.clone(), &hop, guards).await
        })
    }
}

/// Attempts started `delay` apart (at most `1 + max_extra`), the first
/// usable answer kept.
async fn hedged(
    template: &Template<'_>,
    hedge: HedgeSpec,
    deadline: Instant,
    tried: &mut Vec<usize>,
    budget: &RetryBudget,
    budget_spec: &BudgetSpec,
) -> Outcome {
    let retry = template.route.spec.retry.as_ref();
    let mut running = vec![(0usize, template.attempt(deadline, tried))];
    let mut started = 1u32;
    let mut next = Instant::now() + hedge.delay;
    let mut last = None;
    loop {
        let can_hedge = started <= hedge.max_extra && next < deadline && template.body.again();
        if running.is_empty() && !can_hedge {
            // Nothing in flight and nothing more to start (out of extra
            // attempts, or of time): the last answer is the answer.
            return last.unwrap_or(Err(ProxyError::NoBackend));
        }
        let finished = {
            let hedge_due = tokio::time::sleep_until(next);
            tokio::pin!(hedge_due);
            std::future::poll_fn(|cx| {
                for (i, (_, attempt)) in running.iter_mut().enumerate() {
                    if let Poll::Ready(outcome) = attempt.as_mut().poll(cx) {
                        return Poll::Ready(Some((i, outcome)));
                    }
                }
                if can_hedge && hedge_due.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(None);
                }
                Poll::Pending
            })
            .await
        };
        match finished {
            Some((i, outcome)) => {
                let (index, _) = running.swap_remove(i);
                let usable = !worth_retrying(&outcome, retry)
                    && !matches!(outcome, Err(ref e) if e.is_upstream());
                if usable || (running.is_empty() && !can_hedge) {
                    if started > 1 {
                        let budget = template.upstream.budget();
                        let outcome = if index > 0 {
                            &budget.hedges_won
                        } else {
                            &budget.hedges_lost
                        };
                        outcome.add(1);
                    }
                    // The others are dropped here: their connections close.
                    return outcome;
                }
                last = Some(outcome);
                if running.is_empty() {
                    // Nothing left in flight: the next attempt need not wait.
                    next = Instant::now();
                }
            }
            None => {
                if budget.try_spend(budget_spec) {
                    running.push((started as usize, template.attempt(deadline, tried)));
                    started += 1;
                    next = Instant::now() + hedge.delay;
                } else {
                    budget.exhausted.add(1);
                    started = hedge.max_extra + 1;
                    if running.is_empty() {
                        return last.unwrap_or(Err(ProxyError::NoBackend));
                    }
                }
            }
        }
    }
}

/// Tells backends apart (an `Arc`'s address, kept as a number so that
/// the request's future stays `Send`).
/// The pause before retry number `retry` (1 for the first): full jitter
/// over `base × 2^(retry-1)`, capped at `max`.
fn backoff(spec: &RetrySpec, retry: u32) -> Duration {
    let ceiling = spec
        .backoff_base
        .saturating_mul(1u32 << (retry - 1).min(16))
        .min(spec.backoff_max);
    ceiling.mul_f64(fastrand::f64())
}

/// A request body as the attempts need it.
enum Replay {
    /// Read whole before the first attempt (or empty).
    Kept(Option<Bytes>),
    /// Sent as it arrives by the first attempt, a copy kept on the side.
    Teed(Tee),
}

impl Replay {
    /// Whether another attempt could send the body now.
    fn again(&self) -> bool {
        match self {
            Replay::Kept(_) => true,
            Replay::Teed(tee) => tee.replayable(),
        }
    }
}

/// The body of a request whose length is unknown (a gRPC call's), read
/// from the client only as the attempts ask for it, and kept as it
/// passes, up to `max_replay_body`. Each attempt gets a `Cursor` that
/// replays what was kept and then reads on from the client: an attempt
/// that never read the body (its connection was refused) costs nothing,
/// and a later one still gets all of it. Once more than `max` has passed
/// (or the body failed, or carried trailers) no new attempt can be made.
struct Tee {
    shared: Arc<Mutex<Shared>>,
}

struct Shared {
    /// The client's body, until it ends or fails.
    inner: Option<ClientBody>,
    /// The frames read so far (emptied once `lost`).
    frames: Vec<Bytes>,
    /// Frames read so far, kept or not.
    read: usize,
    len: u64,
    max: u64,
    ended: bool,
    /// Past `max`, failed, or carried trailers: cannot be replayed.
    lost: bool,
    /// Cursors waiting for the client's next frame.
    waiting: Vec<std::task::Waker>,
    trail: Option<Arc<crate::telemetry::access::Trail>>,
}

impl Tee {
    fn new(
        body: ClientBody,
        max: u64,
        trail: Option<Arc<crate::telemetry::access::Trail>>,
    ) -> Self {
        let ended = body.is_end_stream();
        Tee {
            shared: Arc::new(Mutex::new(Shared {
                inner: Some(body),
                frames: Vec::new(),
                read: 0,
                len: 0,
                max,
                ended,
                lost: false,
                waiting: Vec::new(),
                trail,
            })),
        }
    }

    /// Whether another attempt can be sent the whole body.
    fn replayable(&self) -> bool {
        !lock(&self.shared).lost
    }

    /// The body of one more attempt, if it can have all of it.
    fn cursor(&self) -> Option<RequestBody> {
        let cursor = Cursor {
            shared: Arc::clone(&self.shared),
            at: 0,
        };
        self.replayable()
            .then(|| RequestBody::Streaming(ClientBody::Other(Box::pin(cursor)), None))
    }
}

fn lock(shared: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What the client sent, read again from the start for one attempt.
struct Cursor {
    shared: Arc<Mutex<Shared>>,
    /// The next frame this attempt is due.
    at: usize,
}

/// A body that cannot be sent (again) whole.
#[derive(Debug, thiserror::Error)]
#[error("the request body cannot be replayed")]
struct NotReplayable;

impl http_body::Body for Cursor {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let mut shared = lock(&this.shared);
        if this.at < shared.read {
            let Some(frame) = shared.frames.get(this.at).filter(|_| !shared.lost) else {
                return Poll::Ready(Some(Err(Box::new(NotReplayable))));
            };
            let frame = http_body::Frame::data(frame.clone());
            this.at += 1;
            return Poll::Ready(Some(Ok(frame)));
        }
        if shared.ended {
            return Poll::Ready(None);
        }
        let Some(inner) = shared.inner.as_mut() else {
            return Poll::Ready(Some(Err(Box::new(NotReplayable))));
        };
        let polled = Pin::new(inner).poll_frame(cx);
        let ended_now = shared.inner.as_ref().is_some_and(|b| b.is_end_stream());
        match &polled {
            Poll::Pending => {
                if !shared.waiting.iter().any(|w| w.will_wake(cx.waker())) {
                    shared.waiting.push(cx.waker().clone());
                }
                return Poll::Pending;
            }
            Poll::Ready(Some(Ok(frame))) => {
                shared.read += 1;
                this.at = shared.read;
                match frame.data_ref() {
                    Some(data) => {
                        if let Some(trail) = &shared.trail {
                            trail.add_bytes_in(data.len());
                        }
                        shared.len += data.len() as u64;
                        if !shared.lost && shared.len <= shared.max {
                            shared.frames.push(data.clone());
                        } else {
                            shared.lost = true;
                            shared.frames = Vec::new();
                        }
                    }
                    None => shared.lost = true,
                }
                // The last frame: the attempt's sender will not poll again.
                shared.ended |= ended_now;
            }
            Poll::Ready(None) => shared.ended = true,
            Poll::Ready(Some(Err(_))) => {
                shared.lost = true;
                shared.inner = None;
            }
        }
        for waker in std::mem::take(&mut shared.waiting) {
            waker.wake();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        let shared = lock(&self.shared);
        self.at >= shared.read && shared.ended
    }
}

/// Reads a body the caller has checked is short or complete.
async fn read_body(body: ClientBody, max: u64) -> Result<Option<Bytes>, ProxyError> {
    if body.is_end_stream() {
        return Ok(None);
    }
    let limited = http_body_util::Limited::new(body, usize::try_from(max).unwrap_or(usize::MAX));
    match limited.collect().await {
        Ok(collected) => Ok(Some(collected.to_bytes()).filter(|b| !b.is_empty())),
        Err(error) => Err(ProxyError::client_body(&*error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    type BoxError = Box<dyn std::error::Error + Send + Sync>;

    fn channel() -> (http_body_util::channel::Sender<Bytes, BoxError>, ClientBody) {
        let (sender, body) = http_body_util::channel::Channel::<Bytes, BoxError>::new(8);
        (sender, ClientBody::Other(Box::pin(body)))
    }

    async fn read(body: RequestBody) -> Result<Bytes, BoxError> {
        Ok(body.collect().await?.to_bytes())
    }

    #[tokio::test]
    async fn an_attempt_that_never_read_the_body_leaves_all_of_it_to_the_next() {
        let (mut sender, body) = channel();
        let tee = Tee::new(body, 1024, None);
        // The first attempt's connection was refused: its body is dropped
        // unread.
        drop(tee.cursor().unwrap());
        sender
            .send_data(Bytes::from_static(b"hello "))
            .await
            .unwrap();
        sender
            .send_data(Bytes::from_static(b"world"))
            .await
            .unwrap();
        drop(sender);
        assert_eq!(read(tee.cursor().unwrap()).await.unwrap(), "hello world");
        // And the one after that replays what was kept.
        assert_eq!(read(tee.cursor().unwrap()).await.unwrap(), "hello world");
    }

    #[tokio::test]
    async fn a_second_attempt_replays_the_start_and_reads_on_with_the_first() {
        let (mut sender, body) = channel();
        let tee = Tee::new(body, 1024, None);
        let mut first = tee.cursor().unwrap();
        sender.send_data(Bytes::from_static(b"one,")).await.unwrap();
        let frame = first.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "one,");
        // The first attempt failed with the body still streaming.
        drop(first);
        let second = tokio::spawn(read(tee.cursor().unwrap()));
        sender.send_data(Bytes::from_static(b"two")).await.unwrap();
        drop(sender);
        assert_eq!(second.await.unwrap().unwrap(), "one,two");
    }

    #[tokio::test]
    async fn a_body_past_the_limit_is_sent_once_and_never_again() {
        let (mut sender, body) = channel();
        let tee = Tee::new(body, 4, None);
        let first = tee.cursor().unwrap();
        sender
            .send_data(Bytes::from_static(b"too long"))
            .await
            .unwrap();
        drop(sender);
        assert_eq!(read(first).await.unwrap(), "too long");
        assert!(!tee.replayable());
        assert!(tee.cursor().is_none());
    }
}
