//! Socket hand-over for drain-aware restarts.
//!
//! The running process duplicates each listening socket into a descriptor
//! without close-on-exec, so the new process inherits it, and writes an
//! [`UpgradeState`] file naming each descriptor and everything else the new
//! process needs (history, the configuration to start with, the operation
//! to complete). The new process adopts the descriptors by number: one of
//! the two `unsafe` blocks in the library (the other attaches the QUIC
//! steering program, `proxy/sockets.rs`), since taking ownership of a descriptor
//! known only by its number is a promise no type can check (`rustix` does
//! the duplication and the flags safely).

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::runtime::PersistedState;

/// The environment variable naming the upgrade state file.
pub const STATE_ENV: &str = "CUTOVER_UPGRADE_STATE";

/// What a socket is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SocketRole {
    Listener,
    Admin,
    Metrics,
}

/// One inherited listening socket.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HandedSocket {
    pub role: SocketRole,
    /// Listener name (`admin` / `metrics` for those roles).
    pub name: String,
    /// The configured bind the socket was opened for.
    pub bind: SocketAddr,
    /// The descriptor number in the new process.
    pub fd: RawFd,
}

/// Everything the new process continues from.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UpgradeState {
    pub parent_pid: u32,
    pub operation_id: String,
    pub sockets: Vec<HandedSocket>,
    pub history: PersistedState,
    /// The configuration to start with and where its files resolve.
    pub config: String,
    pub base_dir: PathBuf,
    pub origin: String,
    pub requested_by: Option<String>,
    pub reason: Option<String>,
    /// The authenticated admin caller that asked for the upgrade.
    #[serde(default)]
    pub caller: Option<String>,
    /// The read end of a pipe the old process closes once it has stopped
    /// accepting on the admin and metrics sockets: the new process
    /// accepts on them only then (absent from an older process's file:
    /// at once).
    #[serde(default)]
    pub accept_after: Option<RawFd>,
    /// Each HTTP/3 listener's UDP group, with the new process's ends of
    /// the relays that join its endpoints to the old process's (absent
    /// from an older process's file: the new process binds the port once
    /// the old one has let it go).
    #[serde(default)]
    pub quic: Vec<HandedUdpGroup>,
}

/// One listener's UDP group, handed over.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HandedUdpGroup {
    pub name: String,
    /// The address the group is bound to.
    pub address: SocketAddr,
    /// What the new process's connection IDs carry.
    pub tag: u8,
    /// The group's sockets, in group order.
    pub sockets: Vec<RawFd>,
    /// The new process's end of each member's relay, in the same order.
    pub relays: Vec<RawFd>,
}

/// A duplicate of `fd` that survives `exec` (`dup` leaves `FD_CLOEXEC`
/// clear).
pub fn inheritable(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    Ok(rustix::io::dup(fd)?)
}

/// Takes ownership of an inherited socket by descriptor number, after
/// checking that the descriptor is open and is a socket bound where the
/// state file says (a listening TCP socket, or a listener's UDP socket:
/// the caller knows which it asked for).
pub fn adopt(socket: &HandedSocket) -> io::Result<OwnedFd> {
    let owned = take_inherited(socket.fd)?;
    let local = SocketAddr::try_from(rustix::net::getsockname(&owned)?).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("descriptor {} is not an IP socket", socket.fd),
        )
    })?;
    if local.ip() != socket.bind.ip()
        || (socket.bind.port() != 0 && local.port() != socket.bind.port())
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "descriptor {} is bound to {local}, not {}",
                socket.fd, socket.bind
            ),
        ));
    }
    Ok(owned)
}

/// Takes ownership of the inherited read end of the old process's
/// "stopped accepting" pipe ([`UpgradeState::accept_after`]).
pub fn adopt_pipe(fd: RawFd) -> io::Result<OwnedFd> {
    let owned = take_inherited(fd)?;
    if rustix::fs::FileType::from_raw_mode(rustix::fs::fstat(&owned)?.st_mode)
        != rustix::fs::FileType::Fifo
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("descriptor {fd} is not a pipe"),
        ));
    }
    Ok(owned)
}

/// Takes ownership of an inherited relay socket (one end of a Unix
/// socket pair) by descriptor number.
pub fn adopt_relay(fd: RawFd) -> io::Result<OwnedFd> {
    let owned = take_inherited(fd)?;
    if rustix::fs::FileType::from_raw_mode(rustix::fs::fstat(&owned)?.st_mode)
        != rustix::fs::FileType::Socket
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("descriptor {fd} is not a socket"),
        ));
    }
    Ok(owned)
}

/// Ownership of descriptor `fd`, inherited from the old process, closed
/// on this process's own exec like every other descriptor it owns.
fn take_inherited(fd: RawFd) -> io::Result<OwnedFd> {
    // Open, and not one of ours already (those all carry close-on-exec)?
    // Asked of /proc, which needs no descriptor in hand.
    if fd < 3 || !Path::new(&format!("/proc/self/fd/{fd}")).exists() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("descriptor {fd} was not inherited"),
        ));
    }
    #[allow(unsafe_code)]
    // SAFETY: the descriptor is open (checked above), was handed to this
    // process for this purpose by its parent, and is named once in the
    // state file; nothing else in this process refers to it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    rustix::io::fcntl_setfd(&owned, rustix::io::FdFlags::CLOEXEC)?;
    Ok(owned)
}

/// Writes the state file readable by this user only.
pub fn write_state(dir: &Path, state: &UpgradeState) -> io::Result<PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!(
        "cutover-upgrade-{}-{}.json",
        std::process::id(),
        state.operation_id
    ));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)?;
    file.write_all(&serde_json::to_vec(state).map_err(io::Error::other)?)?;
    file.sync_all()?;
    Ok(path)
}

/// Reads and removes the state file named by [`STATE_ENV`], if any.
pub fn take_state() -> io::Result<Option<UpgradeState>> {
    let Some(path) = std::env::var_os(STATE_ENV) else {
        return Ok(None);
    };
    let bytes = std::fs::read(&path)?;
    let _ = std::fs::remove_file(&path);
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(io::Error::other)
}

/// The raw descriptor of anything that has one (for the state file).
pub fn raw(fd: &impl AsFd) -> RawFd {
    fd.as_fd().as_raw_fd()
}
