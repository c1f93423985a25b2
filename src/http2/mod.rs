//! cutover's HTTP/2 (RFC 9113, HPACK RFC 7541): the server of every
//! HTTP/2 connection a listener serves, and the client of every
//! connection to an h2c or h2 backend.
//!
//! Written for the gateway's request path rather than taken from the
//! `h2` crate: a measured prototype answered an h2c request in 5.2k
//! instructions against 17.7k for the `h2` crate alone and 21.3k for
//! hyper over it (docs/performance.md, "An HTTP/2 server of our own");
//! the client took a proxied gRPC call from 85k instructions to 52k
//! ("An HTTP/2 client of our own"). It imports only `clock` of the
//! crate. One task per connection, on either side, reads the frames,
//! runs or answers the streams and writes what the turn produced in one
//! write; what both sides keep alike is `link.rs`.

mod client;
mod client_conn;
#[cfg(test)]
mod client_tests;
mod conn;
mod frame;
mod hpack;
mod link;
mod request;
mod send;
mod spare;
mod stream;
#[cfg(test)]
mod tests;

use std::time::Duration;

pub use client::{ClientError, ClientSettings, Failed, Resend, ResponseFuture, SendRequest};
pub use client_conn::{handshake, ClientConnection};
pub use conn::{Connection, Error};
pub use frame::{Reason, PREFACE};
pub use stream::{BodyError, RecvBody};

/// What a listener sets on its HTTP/2 connections.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// SETTINGS_MAX_CONCURRENT_STREAMS; streams past it are refused.
    pub max_concurrent_streams: u32,
    /// SETTINGS_MAX_HEADER_LIST_SIZE (§6.5.2's measure); a request past
    /// it is answered 431.
    pub max_header_list_size: u32,
    /// A PING this often; `None` sends none.
    pub keepalive_interval: Option<Duration>,
    /// How long a PING may go unacknowledged before the connection ends.
    pub keepalive_timeout: Duration,
}
