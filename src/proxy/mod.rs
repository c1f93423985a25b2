//! The data plane: listeners, the HTTP request path, forwarding, and the
//! one function that turns errors into responses. It reads generations
//! through `admission` and never imports `config`, `control` or `admin`.

mod body;
mod client_hello;
mod downstream;
mod edge;
mod error;
mod framing;
mod http;
mod interim;
mod listener;
mod observed;
mod proxy_header;
mod relay;
mod retry;
mod tcp;
mod udp;
mod workers;

pub use body::ResponseBody;
pub use error::{error_response, ProxyError};
pub use listener::{
    BindError, BoundListener, ListenerInfo, ListenerSet, ListenerSocket, ListeningSocket,
};
pub use tcp::pinned_age_expired;
pub use workers::Workers;
