//! Why the process stops: what the servers, the hand-over and start-up
//! agree on.

/// Why the process is stopping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// SIGTERM or `POST /admin/lifecycle/drain`.
    Drain,
    /// A new process took over the sockets.
    HandedOver,
}
