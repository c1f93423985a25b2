//! Listener isolation: a request for a hostname one listener of a port
//! names belongs to that listener alone (`GatewayHTTPListenerIsolation`),
//! even when a route of a listener with a wider hostname (or none) on the
//! same port matches it.

use super::model::{Listener, ListenerKind, Port};

/// Listener isolation: a request for a hostname one Gateway listener of
/// a port names belongs to that listener alone, even when a route of a
/// listener with a wider hostname (or none) on the same port matches it
/// (`GatewayHTTPListenerIsolation`). cutover picks the most specific host
/// group with a matching route, so a last route answering 404 for each
/// such hostname keeps its requests in its group.
pub(super) fn isolation(port: &Port, routes: &[super::routes::Route]) -> String {
    if !matches!(port.kind, ListenerKind::Http | ListenerKind::Https) {
        return String::new();
    }
    let mut out = String::new();
    for (i, host) in port.hostnames.iter().enumerate() {
        let Some(host) = host else { continue };
        let wider = port
            .hostnames
            .iter()
            .any(|other| other.as_ref() != Some(host) && covers(other.as_deref(), host));
        // A route of the listener that takes every request for the name
        // already keeps them there.
        let caught = routes.iter().any(|r| {
            r.listener == port.name
                && r.host.as_deref() == Some(host.as_str())
                && r.path == super::routes::Path::Any
                && r.methods.is_empty()
                && r.headers.is_empty()
                && r.query.is_empty()
        });
        if !wider || caught {
            continue;
        }
        out.push_str(&format!(
            "[[routes]]\nname = {}\nlisteners = [{}]\nhosts = [{}]\nrespond = {{ status = 404 }}\n\n",
            super::toml_str(&format!("gateway-api-isolation-{}-{i}", port.name)),
            super::toml_str(&port.name),
            super::toml_str(host)
        ));
    }
    out
}

/// Whether a listener with hostname `wider` (`None`: any) also matches
/// every name `host` matches.
pub(super) fn covers(wider: Option<&str>, host: &str) -> bool {
    match wider {
        None => true,
        Some(w) => match w.strip_prefix('*') {
            // `*.example.com` covers `a.example.com` and `*.a.example.com`.
            Some(suffix) => {
                host.trim_start_matches('*').ends_with(suffix) && host.len() > w.len() - 1
            }
            None => false,
        },
    }
}

/// Whether every name `host` matches belongs to another listener of the
/// same port whose hostname is narrower than listener `i`'s.
pub(super) fn owned_elsewhere(listeners: &[Listener], i: usize, host: &str) -> bool {
    let Some(me) = listeners.get(i) else {
        return false;
    };
    listeners.iter().enumerate().any(|(j, other)| {
        let Some(theirs) = other.hostname.as_deref() else {
            return false;
        };
        j != i
            && other.cutover == me.cutover
            && other.hostname != me.hostname
            && covers(me.hostname.as_deref(), theirs)
            && (theirs == host || covers(Some(theirs), host))
    })
}
