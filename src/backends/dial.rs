//! Opening a TCP connection to a backend, with the fewest system calls
//! and wake-ups per connection: an L4 listener opens one per client
//! connection, so this is on its hot path.
//!
//! Against `tokio::time::timeout(t, TcpStream::connect(addr))` it saves
//! two things per connection. The outcome of the handshake is read off
//! the socket's readiness (a failed connect closes the socket, which
//! epoll reports as a hang-up): `SO_ERROR` is asked only then, not after
//! every connect. And the timer is armed only for a connect still
//! pending after the worker's next look at its sockets, which most
//! (loopback, the same rack) never are: a new timer earlier than every
//! other wakes the worker's driver (an eventfd write) to re-arm its own.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use rustix::net::{AddressFamily, SocketFlags, SocketType};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Why a new upstream connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("connect timed out after {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// Connects to `addr` (`ip:port`, or `host:port` looked up by the
/// system's resolver) within `timeout`, with Nagle's algorithm off.
pub async fn dial(addr: &str, timeout: Duration) -> Result<TcpStream, ConnectError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let stream = match addr.parse::<SocketAddr>() {
        Ok(ip) => connect_ip(ip, deadline).await,
        Err(_) => tokio::time::timeout_at(deadline, TcpStream::connect(addr))
            .await
            .map_err(|_| Pending),
    };
    let stream = stream.map_err(|_| ConnectError::Timeout(timeout))??;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// A connect still pending at its deadline.
struct Pending;

/// The connect's outcome, or `Pending` when `deadline` came first.
async fn connect_ip(
    addr: SocketAddr,
    deadline: tokio::time::Instant,
) -> Result<io::Result<TcpStream>, Pending> {
    let family = match addr {
        SocketAddr::V4(_) => AddressFamily::INET,
        SocketAddr::V6(_) => AddressFamily::INET6,
    };
    let socket = match rustix::net::socket_with(
        family,
        SocketType::STREAM,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    ) {
        Ok(socket) => socket,
        Err(errno) => return Ok(Err(errno.into())),
    };
    match rustix::net::connect(&socket, &addr) {
        Ok(()) | Err(rustix::io::Errno::INPROGRESS) => {}
        Err(errno) => return Ok(Err(errno.into())),
    }
    let stream = match TcpStream::from_std(std::net::TcpStream::from(socket)) {
        Ok(stream) => stream,
        Err(error) => return Ok(Err(error)),
    };
    let ready = {
        let ready = stream.ready(Interest::WRITABLE);
        tokio::pin!(ready);
        tokio::select! {
            biased;
            ready = &mut ready => ready,
            () = tokio::task::yield_now() => tokio::time::timeout_at(deadline, ready)
                .await
                .map_err(|_| Pending)?,
        }
    };
    Ok(match ready {
        Ok(ready) if ready.is_write_closed() => match stream.take_error() {
            Ok(Some(error)) | Err(error) => Err(error),
            Ok(None) => Ok(stream),
        },
        Ok(_) => Ok(stream),
        Err(error) => Err(error),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn connects_by_address_and_by_name_and_reports_a_refusal() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let stream = dial(&addr.to_string(), Duration::from_secs(2))
            .await
            .expect("connects");
        assert_eq!(stream.peer_addr().expect("peer"), addr);
        assert!(stream.nodelay().expect("nodelay"));
        // By name, through the system's resolver.
        let by_name = dial(
            &format!("localhost:{}", addr.port()),
            Duration::from_secs(2),
        )
        .await;
        assert!(by_name.is_ok(), "{by_name:?}");
        drop(listener);
        // Nothing listens there any more: refused, at once.
        let refused = dial(&addr.to_string(), Duration::from_secs(2)).await;
        match refused {
            Err(ConnectError::Io(error)) => {
                assert_eq!(error.kind(), io::ErrorKind::ConnectionRefused, "{error}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_connect_still_pending_at_its_deadline_times_out() {
        // A listener whose backlog is full leaves further handshakes
        // unanswered (SYNs dropped), so the connect stays pending.
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind("127.0.0.1:0".parse().expect("addr"))
            .expect("bind");
        let addr = socket.local_addr().expect("addr");
        let _listener = socket.listen(0).expect("listen");
        let mut held = Vec::new();
        let mut timed_out = false;
        // Fill the backlog, then one more must time out (bounded loop).
        for _ in 0..16 {
            match dial(&addr.to_string(), Duration::from_millis(200)).await {
                Ok(stream) => held.push(stream),
                Err(ConnectError::Timeout(after)) => {
                    assert_eq!(after, Duration::from_millis(200));
                    timed_out = true;
                    break;
                }
                Err(other) => panic!("unexpected {other}"),
            }
        }
        assert!(timed_out, "{} connects went through", held.len());
    }
}
