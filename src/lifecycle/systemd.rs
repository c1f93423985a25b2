//! `sd_notify` for `Type=notify` units: one datagram to `$NOTIFY_SOCKET`.

use std::os::unix::net::UnixDatagram;

/// Sends `state` to systemd when running under a notify unit; a no-op
/// otherwise. Failures are logged, never fatal.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let result = UnixDatagram::unbound().and_then(|socket| {
        let bytes = path.as_encoded_bytes();
        match bytes.strip_prefix(b"@") {
            Some(name) => {
                use std::os::linux::net::SocketAddrExt;
                let address = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
                socket.send_to_addr(state.as_bytes(), &address)
            }
            None => socket.send_to(state.as_bytes(), &path),
        }
    });
    if let Err(error) = result {
        tracing::warn!(%error, "cannot notify systemd");
    }
}
