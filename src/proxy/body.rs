//! The response body type the gateway serves: a streamed upstream body
//! (which carries the request's guards until its last byte) or a small
//! in-memory one.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use crate::generation::{BackendGuard, InflightGuard, RouteSlot};

/// Holds what a streaming response keeps alive: the slim part of its
/// generation (the ledger entry), its route slot and its backend count.
#[derive(Debug)]
pub struct StreamGuards {
    pub inflight: InflightGuard,
    pub route: Option<RouteSlot>,
    pub backend: BackendGuard,
}

#[derive(Debug)]
pub enum ResponseBody {
    Upstream {
        body: Incoming,
        guards: Option<StreamGuards>,
    },
    Full(Option<Bytes>),
}

impl ResponseBody {
    pub fn full(bytes: Bytes) -> Self {
        ResponseBody::Full(Some(bytes).filter(|b| !b.is_empty()))
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            ResponseBody::Upstream { body, guards } => {
                let polled = Pin::new(body).poll_frame(cx);
                if let Poll::Ready(None | Some(Err(_))) = &polled {
                    // The stream is over: release the pin now rather than
                    // when hyper gets round to dropping the body.
                    guards.take();
                }
                polled
            }
            ResponseBody::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ResponseBody::Upstream { body, .. } => body.is_end_stream(),
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
