//! The data plane: listeners, the HTTP request path, forwarding, and the
//! one function that turns errors into responses. It reads generations
//! through `admission` and never imports `config`, `control` or `admin`.

mod accept_proxy;
mod activity;
mod auth;
mod body;
mod cache;
mod client_hello;
mod compress;
mod conn;
mod copy;
mod downstream;
mod edge;
mod encode;
mod error;
mod exchange;
mod filters;
mod grpc;
mod grpc_web;
mod h3;
mod h3_connection;
mod headers;
mod interim;
mod listener;
mod mirror;
mod observed;
mod quota;
mod relay;
mod request;
mod request_framing;
mod retry;
mod shadow;
mod sockets;
mod steering;
mod tcp;
mod tunnel;
mod udp;
mod waf;
mod waf_answer;
mod waf_shadow;
mod workers;

pub use body::ResponseBody;
pub use conn::pinned_age_expired;
pub use error::{error_response, ProxyError};
pub use listener::{
    BindError, BoundListener, HandedQuic, ListenerInfo, ListenerSet, ListenerSocket,
    ListeningSocket,
};
pub use steering::{InheritedGroup, Tag as QuicTag};
pub use tunnel::CLOSE_GRACE as TUNNEL_CLOSE_GRACE;
pub use workers::Workers;

#[cfg(test)]
mod test_io {
    use std::time::Duration;

    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;

    /// The server end of a loopback connection whose client writes
    /// `chunks`, pausing between them so that they arrive as separate
    /// segments, then half-closes (`close`) or stays open and silent for
    /// a second and a half; and the client's task.
    pub async fn sent_in_pieces(
        chunks: Vec<Vec<u8>>,
        close: bool,
    ) -> (TcpStream, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let at = listener.local_addr().expect("addr");
        let writer = tokio::spawn(async move {
            let mut client = TcpStream::connect(at).await.expect("connect");
            client.set_nodelay(true).expect("nodelay");
            for chunk in chunks {
                // The reader may have closed already (it refused them).
                let _ = client.write_all(&chunk).await;
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
            if close {
                let _ = client.shutdown().await;
            } else {
                tokio::time::sleep(Duration::from_millis(1500)).await;
            }
        });
        let (server, _) = listener.accept().await.expect("accept");
        (server, writer)
    }
}
