//! The response body type the gateway serves: a streamed upstream body
//! (which carries the request's guards until its last byte) or a small
//! in-memory one.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use crate::generation::{BackendGuard, H1Conn, InflightGuard, RouteSlot};
use crate::runtime::GenerationStore;

/// Holds what a streaming response keeps alive: the slim part of its
/// generation (the ledger entry), its route slot and its backend count.
pub struct StreamGuards {
    pub inflight: InflightGuard,
    pub route: Option<RouteSlot>,
    pub backend: BackendGuard,
    /// To follow supersession for `runtime.max_pinned_age`.
    pub store: Arc<GenerationStore>,
    /// Completes when the response has been pinned too long; created the
    /// first time the body has to wait, so short responses never pay.
    expiry: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    /// Frames passed on; a stream that never waits is checked every 64.
    frames: u32,
}

impl StreamGuards {
    pub fn new(
        inflight: InflightGuard,
        route: Option<RouteSlot>,
        backend: BackendGuard,
        store: Arc<GenerationStore>,
    ) -> Self {
        Self {
            inflight,
            route,
            backend,
            store,
            expiry: None,
            frames: 0,
        }
    }

    /// Whether the stream's generation was superseded longer ago than
    /// `max_pinned_age`; registers the waker otherwise.
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        let expiry = self.expiry.get_or_insert_with(|| {
            let store = Arc::clone(&self.store);
            let generation = self.inflight.ledger().generation();
            Box::pin(async move { super::tcp::pinned_age_expired(&store, generation).await })
        });
        expiry.as_mut().poll(cx).is_ready()
    }
}

impl std::fmt::Debug for StreamGuards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamGuards")
            .field("inflight", &self.inflight)
            .finish()
    }
}

/// A streaming response cut because its generation was superseded longer
/// ago than `runtime.max_pinned_age`.
#[derive(Debug, thiserror::Error)]
#[error("response stream closed: pinned to a generation superseded longer ago than runtime.max_pinned_age")]
pub struct PinnedTooLong;

#[derive(Debug)]
pub enum ResponseBody {
    Upstream {
        body: Incoming,
        guards: Option<StreamGuards>,
        /// The upstream connection, when this task drives it: polled
        /// before the body so bytes flow, and pooled again at the end.
        driven: Option<H1Conn>,
    },
    Full(Option<Bytes>),
}

impl ResponseBody {
    pub fn full(bytes: Bytes) -> Self {
        ResponseBody::Full(Some(bytes).filter(|b| !b.is_empty()))
    }
}

/// The exchange is complete: the connection goes back to its backend's
/// pool and the pin is released now rather than when hyper drops the body.
fn finish(driven: &mut Option<H1Conn>, guards: &mut Option<StreamGuards>) {
    if let (Some(conn), Some(g)) = (driven.take(), guards.as_ref()) {
        if let Some(pool) = &g.backend.backend().h1 {
            pool.put(conn);
        }
    }
    guards.take();
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            ResponseBody::Upstream {
                body,
                guards,
                driven,
            } => {
                if driven.as_mut().is_some_and(|c| !c.drive(cx)) {
                    *driven = None;
                }
                let polled = Pin::new(&mut *body).poll_frame(cx);
                match &polled {
                    // The stream is over: release the pin now rather than
                    // when hyper gets round to dropping the body, and give
                    // the connection back for the next request.
                    Poll::Ready(None) => {
                        finish(driven, guards);
                    }
                    Poll::Ready(Some(Err(_))) => {
                        driven.take();
                        guards.take();
                    }
                    Poll::Pending => {
                        if guards.as_mut().is_some_and(|g| g.expired(cx)) {
                            guards.take();
                            return Poll::Ready(Some(Err(Box::new(PinnedTooLong))));
                        }
                    }
                    // hyper stops polling once a known length is written:
                    // hand the connection back as soon as its last byte is in.
                    Poll::Ready(Some(Ok(_))) if driven.is_some() && body.is_end_stream() => {
                        finish(driven, guards);
                    }
                    Poll::Ready(Some(Ok(_))) => {
                        if let Some(g) = guards.as_mut() {
                            g.frames = g.frames.wrapping_add(1);
                            if g.frames % 64 == 0 && g.expired(cx) {
                                guards.take();
                                return Poll::Ready(Some(Err(Box::new(PinnedTooLong))));
                            }
                        }
                    }
                }
                polled.map_err(Into::into)
            }
            ResponseBody::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            // A driven connection goes back to the pool only from
            // `poll_frame`: make sure hyper polls it even for empty bodies.
            ResponseBody::Upstream { body, driven, .. } => driven.is_none() && body.is_end_stream(),
            ResponseBody::Full(bytes) => bytes.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ResponseBody::Upstream { body, .. } => body.size_hint(),
            ResponseBody::Full(bytes) => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
        }
    }
}
