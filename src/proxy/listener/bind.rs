//! Binding: a listener's sockets, bound anew (one listening socket per
//! worker for TCP, `SO_REUSEPORT`; one UDP socket) or adopted from the
//! previous process in a drain-aware restart. Nothing here accepts or
//! serves.

use std::net::SocketAddr;
use std::sync::Arc;

use super::super::sockets;
use crate::plan::{ListenerProtocol, ListenerSpec};

/// A listener's socket: one listening TCP socket of its per-worker
/// group (see `sockets`), or the UDP socket a `udp` listener receives
/// every client's datagrams on.
#[derive(Clone)]
pub enum ListenerSocket {
    Tcp(Arc<std::net::TcpListener>),
    Udp(Arc<tokio::net::UdpSocket>),
}

impl std::os::fd::AsFd for ListenerSocket {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            ListenerSocket::Tcp(socket) => socket.as_fd(),
            ListenerSocket::Udp(socket) => socket.as_fd(),
        }
    }
}

/// A listener bound but not yet accepting (between bind and commit).
pub struct BoundListener {
    pub(super) spec: ListenerSpec,
    pub(super) sockets: Vec<ListenerSocket>,
    pub(super) local_addr: SocketAddr,
}

impl BoundListener {
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

#[derive(Debug, thiserror::Error)]
#[error("cannot bind listener '{name}' to {bind}: {source}")]
pub struct BindError {
    pub name: String,
    pub bind: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

pub(super) fn protocol_name(p: ListenerProtocol) -> &'static str {
    match p {
        ListenerProtocol::Http => "http",
        ListenerProtocol::Https => "https",
        ListenerProtocol::Tcp => "tcp",
        ListenerProtocol::Udp => "udp",
    }
}

/// Binds a listener: a `udp` listener's one socket, or one listening
/// socket per worker (`count`) for the others.
pub(super) fn bind_socket(spec: &ListenerSpec, count: usize) -> Result<BoundListener, BindError> {
    let fail = |source| BindError {
        name: spec.name.clone(),
        bind: spec.bind,
        source,
    };
    if spec.protocol == ListenerProtocol::Udp {
        let socket = std::net::UdpSocket::bind(spec.bind)
            .and_then(|s| s.set_nonblocking(true).map(|()| s))
            .and_then(tokio::net::UdpSocket::from_std)
            .map_err(fail)?;
        let local_addr = socket.local_addr().map_err(fail)?;
        return Ok(BoundListener {
            spec: spec.clone(),
            sockets: vec![ListenerSocket::Udp(Arc::new(socket))],
            local_addr,
        });
    }
    let (group, local_addr) = sockets::tcp_group(spec.bind, count).map_err(fail)?;
    Ok(BoundListener {
        spec: spec.clone(),
        sockets: group
            .into_iter()
            .map(|s| ListenerSocket::Tcp(Arc::new(s)))
            .collect(),
        local_addr,
    })
}

/// Takes over the sockets the previous process was listening on (or, for
/// a `udp` listener, receiving on). A TCP group smaller than `count` (a
/// predecessor with fewer workers) grows to one socket per worker when it
/// is a group; a single socket without `SO_REUSEPORT` (from a build
/// before groups) stays alone and every worker accepts on it.
pub(super) fn adopt_socket(
    spec: &ListenerSpec,
    inherited: Vec<std::os::fd::OwnedFd>,
    count: usize,
) -> Result<BoundListener, BindError> {
    let fail = |source| BindError {
        name: spec.name.clone(),
        bind: spec.bind,
        source,
    };
    let mut sockets = Vec::with_capacity(inherited.len().max(count));
    let mut local_addr = spec.bind;
    for socket in inherited {
        local_addr = sockets::local_address(&socket).map_err(fail)?;
        if spec.protocol == ListenerProtocol::Udp {
            let socket = std::net::UdpSocket::from(socket);
            socket.set_nonblocking(true).map_err(fail)?;
            let socket = tokio::net::UdpSocket::from_std(socket).map_err(fail)?;
            sockets.push(ListenerSocket::Udp(Arc::new(socket)));
        } else {
            let socket = std::net::TcpListener::from(socket);
            socket.set_nonblocking(true).map_err(fail)?;
            sockets.push(ListenerSocket::Tcp(Arc::new(socket)));
        }
    }
    let grows = match sockets.first() {
        Some(ListenerSocket::Tcp(first)) => sockets::in_group(first.as_ref()),
        _ => false,
    };
    while grows && sockets.len() < count {
        match sockets::tcp_member(local_addr) {
            Ok(socket) => sockets.push(ListenerSocket::Tcp(Arc::new(socket))),
            Err(error) => {
                tracing::warn!(listener = %spec.name, %error, "could not add a listening socket for a worker; workers share the handed-over ones");
                break;
            }
        }
    }
    tracing::info!(listener = %spec.name, address = %local_addr, sockets = sockets.len(), "adopted listening sockets from the previous process");
    Ok(BoundListener {
        spec: spec.clone(),
        sockets,
        local_addr,
    })
}
