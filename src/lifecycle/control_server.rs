//! Serving the admin and metrics routers on their (hand-over-able) sockets.
//!
//! Like the proxy listeners, and unlike `axum::serve`'s graceful shutdown,
//! stopping here never closes a connection whose request is on its way: on
//! a hand-over the accept loop stops at once (the new process accepts from
//! the same socket), and each open connection gets a short grace to send
//! its request before idle ones are closed.

use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::upgrade::Stop;

/// How long a client may take to send its request head.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connections may go on once the sockets are handed over.
const HANDOVER_GRACE: Duration = Duration::from_secs(1);

/// Serves `router` on `socket` until this process hands its sockets over.
pub async fn serve(
    socket: TcpListener,
    router: axum::Router,
    stop: watch::Receiver<Option<Stop>>,
    what: &'static str,
) {
    let mut handed_over = stop.clone();
    loop {
        let accepted = tokio::select! {
            accepted = socket.accept() => accepted,
            _ = async { let _ = handed_over.wait_for(|s| *s == Some(Stop::HandedOver)).await; } => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(error) => {
                tracing::warn!(server = what, %error, "accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => return,
                _ = async { let _ = stop.wait_for(|s| *s == Some(Stop::HandedOver)).await; } => {}
            }
            tokio::select! {
                _ = conn.as_mut() => return,
                _ = tokio::time::sleep(HANDOVER_GRACE) => {}
            }
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        });
    }
    tracing::info!(
        server = what,
        "stopped accepting: the new process serves this socket"
    );
}
