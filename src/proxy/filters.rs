//! Route filters on the request path (DESIGN §17), in the fixed order of
//! the contract: `check` (allow/deny, the declared body length) before
//! the route's quota, `prepare` (request id, streamed body limit,
//! rewrite, request headers) after it, redirects as an action, and the
//! response header changes on whatever answer the route gives. Called by
//! `request.rs` for a route with filters or on a listener with `defaults`;
//! any other route never reaches this file.

use std::net::IpAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::Scheme;
use http::{Method, Response};

use super::body::ResponseBody;
use super::compress::CompressMark;
use super::conn::ConnContext;
use super::edge;
use super::error::{BodyTooLarge, ProxyError};
use crate::backends::ClientBody;
use crate::generation::Route;
use crate::plan::{
    AllowHeaders, Compress, Cors, Defaults, Encoding, Filters, HeaderOps, ListenerEdge, Origins,
    Part, Redirect, RedirectPath, RouteAuth, Template, Var,
};
use crate::telemetry::access::Trail;

/// What the filters know of a request besides the request itself.
pub(super) struct Seen<'r, 'g> {
    pub conn: &'r ConnContext,
    pub route: &'g Route,
    pub edge: &'r ListenerEdge,
    /// As routed (normalized, before any rewrite).
    pub path: &'r str,
    pub authority: Option<&'r HeaderValue>,
    pub generation: u64,
}

impl<'r> Seen<'r, '_> {
    /// The template variables of `req` (as the client sent it).
    fn vars<'a>(
        &'a self,
        req: &'a http::Request<ClientBody>,
        client: IpAddr,
        request_id: Option<&'a HeaderValue>,
    ) -> Vars<'a> {
        Vars {
            conn: self.conn,
            client,
            host: self.authority,
            path: self.path,
            query: req.uri().query(),
            method: req.method(),
            request_id,
            route: &self.route.shared,
            generation: self.generation,
            headers: req.headers(),
        }
    }
}

/// What the first filters found: the request may go on to the route's
/// quota and action. Refusals get the response header changes too.
pub(super) struct Checked<'g> {
    client: IpAddr,
    pub request_id: Option<HeaderValue>,
    /// For whatever answer the route gives.
    pub shaped: Option<Box<Shaped<'g>>>,
    /// The body must be counted as it streams (no declared length).
    count_body: Option<u64>,
    /// A CORS preflight the route answers itself (before its quota);
    /// boxed, as rare, so that this stays small enough to move cheaply.
    pub preflight: Option<Box<Response<ResponseBody>>>,
}

/// A route's own filters over its listener's defaults: what applies.
pub(super) struct Effective<'g> {
    own: Option<&'g Filters>,
    defaults: Option<&'g Defaults>,
}

impl<'g> Effective<'g> {
    /// `None` when neither the route nor its listener has a filter.
    pub(super) fn of(own: Option<&'g Filters>, defaults: Option<&'g Defaults>) -> Option<Self> {
        // A route whose only filter is `auth = "none"` changes nothing
        // where its listener has no default auth: it costs what a route
        // without filters costs.
        let own = own
            .filter(|f| !(f.only_opts_out_of_auth() && defaults.is_none_or(|d| d.auth.is_none())));
        (own.is_some() || defaults.is_some()).then_some(Effective { own, defaults })
    }

    fn request_headers(&self) -> Option<&'g HeaderOps> {
        let own = self.own.and_then(|f| f.request_headers.as_ref());
        own.or_else(|| self.defaults.and_then(|d| d.request_headers.as_ref()))
    }

    fn response_headers(&self) -> Option<&'g HeaderOps> {
        let own = self.own.and_then(|f| f.response_headers.as_ref());
        own.or_else(|| self.defaults.and_then(|d| d.response_headers.as_ref()))
    }

    fn max_request_body(&self) -> Option<u64> {
        let own = self.own.and_then(|f| f.max_request_body);
        own.or_else(|| self.defaults.and_then(|d| d.max_request_body))
    }

    fn request_id(&self) -> bool {
        let own = self.own.and_then(|f| f.request_id);
        own.or_else(|| self.defaults.and_then(|d| d.request_id))
            .unwrap_or(false)
    }

    fn compress(&self) -> Option<&'g Compress> {
        let own = self.own.and_then(|f| f.compress.as_deref());
        own.or_else(|| self.defaults.and_then(|d| d.compress.as_deref()))
    }

    fn cors(&self) -> Option<&'g Cors> {
        let own = self.own.and_then(|f| f.cors.as_deref());
        own.or_else(|| self.defaults.and_then(|d| d.cors.as_deref()))
    }

    /// The listener's defaults.
    pub(super) fn defaults(&self) -> Option<&'g Defaults> {
        self.defaults
    }

    /// The route's `auth`, else its listener's (unless the route wrote
    /// `auth = "none"`).
    pub(super) fn auth(&self) -> Option<&'g crate::auth::Auth> {
        match self.own.and_then(|f| f.auth.as_ref()) {
            Some(RouteAuth::Off) => None,
            Some(RouteAuth::On(auth)) => Some(auth),
            None => self.defaults.and_then(|d| d.auth.as_deref()),
        }
    }

    /// The listener's default cache (the route's own is compiled with
    /// the route).
    pub(super) fn cache(&self) -> Option<&'g crate::plan::RouteCacheSpec> {
        self.defaults.and_then(|d| d.cache.as_deref())
    }

    /// The route's own `mirror` (not a listener default).
    pub(super) fn mirrors(&self) -> &'g [std::sync::Arc<crate::plan::Mirror>] {
        self.own.map_or(&[], |f| f.mirrors.as_slice())
    }

    pub(super) fn host_rewrite(&self) -> Option<&'g crate::plan::HostRewrite> {
        self.own.and_then(|f| f.host_rewrite.as_ref())
    }
}

/// The filters before the route's quota (DESIGN §17, cheapest refusal
/// first): allow/deny, then the declared body length. The response
/// header changes are rendered here from the request as the client sent
/// it; a refusal carries them.
pub(super) fn check<'g>(
    req: &http::Request<ClientBody>,
    seen: &Seen<'_, 'g>,
    filters: &Effective<'g>,
) -> Result<Checked<'g>, (ProxyError, Option<Box<Shaped<'g>>>)> {
    let client = client_ip(seen.conn, req.headers(), seen.edge);
    let request_id = filters.request_id().then(|| request_id(req.headers()));
    let response = filters.response_headers();
    let cors = filters.cors();
    // A preflight is answered here, after the cheaper refusals (below)
    // and before the quota and authentication (a browser sends no
    // credentials with one).
    let preflight = cors.and_then(|cors| preflight(cors, req));
    let compress = filters.compress();
    let shaped = (response.is_some()
        || request_id.is_some()
        || cors.is_some()
        || compress.is_some())
    .then(|| {
        let vars = seen.vars(req, client, request_id.as_ref());
        let mut shaped = Shaped::new(response, &vars, request_id.clone());
        shaped.cors = cors
            .map(|cors| CorsMark::answering(cors, req.headers(), preflight.as_ref().map(|p| p.1)));
        shaped.compress = compress.map(|c| CompressMark::of(c, req));
        Box::new(shaped)
    });
    if let Some(access) = filters.own.and_then(|f| f.access.as_ref()) {
        if !access.admits(client) {
            // Counted by `handle`, as every refusal the error names.
            return Err((ProxyError::Forbidden, shaped));
        }
    }
    let mut count_body = None;
    if let Some(limit) = filters.max_request_body() {
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        match declared {
            Some(length) if length > limit => {
                return Err((ProxyError::PayloadTooLarge, shaped));
            }
            // The framing holds a declared length to its word.
            Some(_) => {}
            None if http_body::Body::is_end_stream(req.body()) => {}
            None => count_body = Some(limit),
        }
    }
    let preflight = preflight.map(|(response, _)| Box::new(response));
    Ok(Checked {
        client,
        request_id,
        shaped,
        count_body,
        preflight,
    })
}

/// A request no route took, on a listener whose `defaults` set `cors`
/// (DESIGN §17): a preflight is answered by them (what browsers may ask
/// of this listener; the routes say which methods exist), and any other
/// request's 404 is marked for an allowed origin, so that a page can read
/// it instead of a CORS failure. `None` without a default `cors`.
pub(super) fn unrouted<'g>(
    req: &http::Request<ClientBody>,
    defaults: Option<&'g Defaults>,
) -> Option<(Option<Response<ResponseBody>>, Box<Shaped<'g>>)> {
    let cors = defaults?.cors.as_deref()?;
    let preflight = preflight(cors, req);
    let mark = CorsMark::answering(cors, req.headers(), preflight.as_ref().map(|p| p.1));
    let shaped = Box::new(Shaped {
        values: None,
        request_id: None,
        cors: Some(mark),
        compress: None,
    });
    Some((preflight.map(|(answer, _)| answer), shaped))
}

/// The answer to a preflight: 204, with what the route allows when the
/// origin, the method and every requested header are allowed (the
/// `Access-Control-Allow-Origin` and `-Credentials` come with the other
/// CORS marks, in `Shaped`), and without them otherwise, which the
/// browser takes as a refusal.
fn preflight(
    cors: &Cors,
    req: &http::Request<ClientBody>,
) -> Option<(Response<ResponseBody>, bool)> {
    let method = edge::preflight_method(req)?;
    let headers = req.headers();
    let mut response = Response::new(ResponseBody::full(Bytes::new()));
    *response.status_mut() = http::StatusCode::NO_CONTENT;
    let out = response.headers_mut();
    out.append(
        header::VARY,
        HeaderValue::from_static("access-control-request-method, access-control-request-headers"),
    );
    let origin = headers.get(header::ORIGIN).and_then(|o| o.to_str().ok());
    let requested = headers
        .get_all(header::ACCESS_CONTROL_REQUEST_HEADERS)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>()
        .join(",");
    let allowed = origin.is_some_and(|o| cors.origins.admits(o))
        && (cors.any_method || cors.methods.contains(&method))
        && cors.allow_headers.admits(&requested);
    if !allowed {
        return Some((response, false));
    }
    // Every method: `*`, which a credentialed request reads as a method
    // name (Fetch), so it gets the one it asked for.
    let methods = match (
        cors.any_method && cors.credentials,
        HeaderValue::from_str(method.as_str()),
    ) {
        (true, Ok(asked)) => asked,
        _ => cors.methods_value.clone(),
    };
    out.insert(header::ACCESS_CONTROL_ALLOW_METHODS, methods);
    let allow_headers = match &cors.allow_headers {
        AllowHeaders::Any => HeaderValue::from_str(&requested).ok(),
        AllowHeaders::List(_, value) => value.clone(),
    };
    if let Some(value) = allow_headers.filter(|v| !v.is_empty()) {
        out.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, value);
    }
    if let Some(age) = &cors.max_age {
        out.insert(header::ACCESS_CONTROL_MAX_AGE, age.clone());
    }
    Some((response, true))
}

/// What a route's `cors` adds to an answer for this request's `Origin`.
pub(super) struct CorsMark<'g> {
    cors: &'g Cors,
    /// The request's origin, when allowed.
    allowed: Option<HeaderValue>,
}

impl<'g> CorsMark<'g> {
    fn of(cors: &'g Cors, headers: &HeaderMap) -> Self {
        let allowed = headers
            .get(header::ORIGIN)
            .filter(|o| o.to_str().is_ok_and(|o| cors.origins.admits(o)))
            .cloned();
        CorsMark { cors, allowed }
    }

    /// The marks of an answer to a request; `preflight`: the request is
    /// a preflight, allowed (`true`) or refused (`false`). A refused
    /// preflight gets no CORS headers at all.
    fn answering(cors: &'g Cors, headers: &HeaderMap, preflight: Option<bool>) -> Self {
        let mark = CorsMark::of(cors, headers);
        match preflight {
            Some(false) => CorsMark {
                allowed: None,
                ..mark
            },
            _ => mark,
        }
    }

    fn apply(self, headers: &mut HeaderMap) {
        // The gateway answers for the route's CORS: whatever the backend
        // said of it goes.
        for name in [
            header::ACCESS_CONTROL_ALLOW_ORIGIN,
            header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
        ] {
            headers.remove(name);
        }
        let wildcard = matches!(self.cors.origins, Origins::Any) && !self.cors.credentials;
        if !wildcard {
            headers.append(header::VARY, HeaderValue::from_static("origin"));
        }
        let Some(origin) = self.allowed else {
            return;
        };
        if wildcard {
            headers.insert(
                header::ACCESS_CONTROL_ALLOW_ORIGIN,
                HeaderValue::from_static("*"),
            );
        } else {
            headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        }
        if self.cors.credentials {
            headers.insert(
                header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                HeaderValue::from_static("true"),
            );
        }
        // On preflights too: browsers read it on the actual answer only,
        // but clients that check a preflight see the whole policy.
        if let Some(expose) = self.cors.expose.as_ref() {
            headers.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, expose.clone());
        }
    }
}

/// The filters after the route's quota admitted the request, on what it
/// carries forward: the request id, the streamed body limit, `rewrite`
/// (the path to forward, when it changed) and `request_headers`. (So a
/// quota keyed on a header sees the client's, not one a filter set.)
pub(super) fn prepare<'g>(
    mut req: http::Request<ClientBody>,
    checked: &Checked<'g>,
    seen: &Seen<'_, 'g>,
    filters: &Effective<'g>,
) -> Result<(http::Request<ClientBody>, Option<String>), ProxyError> {
    let route = seen.route;
    // Only what is forwarded has request headers to shape; templates read
    // the request as the client sent it.
    let forwards = matches!(route.action, crate::generation::Action::Proxy(_));
    let request_values = filters.request_headers().filter(|_| forwards).map(|ops| {
        let vars = seen.vars(&req, checked.client, checked.request_id.as_ref());
        Rendered::new(ops, &vars)
    });
    if let Some(id) = &checked.request_id {
        req.headers_mut().insert(X_REQUEST_ID.clone(), id.clone());
    }
    if let Some(limit) = checked.count_body {
        req = req.map(|body| limited(body, limit));
    }
    let mut forwarded = None;
    if let Some(rewrite) = filters.own.and_then(|f| f.rewrite.as_ref()) {
        if let Some(rewritten) = rewrite.apply(seen.path) {
            let normalized = edge::normalize_path(&rewritten, seen.edge).map(|n| match n {
                std::borrow::Cow::Owned(changed) => Some(changed),
                std::borrow::Cow::Borrowed(_) => None,
            });
            match normalized {
                Ok(normalized) if normalized.as_deref().unwrap_or(&rewritten).starts_with('/') => {
                    forwarded = Some(normalized.unwrap_or(rewritten))
                }
                _ => {
                    route.shared.refused(crate::generation::Refusal::Rewrite);
                    return Err(ProxyError::BadRequest(
                        "the rewritten path is not one the listener forwards",
                    ));
                }
            }
        }
    }
    if let Some(values) = request_values {
        values.apply(req.headers_mut());
    }
    Ok((req, forwarded))
}

/// The answer of a `redirect` route.
pub(super) fn redirect_for(
    target: &Redirect,
    req: &http::Request<ClientBody>,
    seen: &Seen<'_, '_>,
    request_id: Option<&HeaderValue>,
) -> Response<ResponseBody> {
    let client = client_ip(seen.conn, req.headers(), seen.edge);
    redirect(target, &seen.vars(req, client, request_id))
}

pub(super) static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The client the edge rules produced: the peer (the PROXY header's
/// address, when there was one), or, for a trusted peer, the nearest
/// address its `X-Forwarded-For` names that is not itself trusted.
pub(super) fn client_ip(conn: &ConnContext, headers: &HeaderMap, edge: &ListenerEdge) -> IpAddr {
    let peer = conn.remote.ip();
    if !edge.trusts(peer) {
        return peer;
    }
    let mut client = peer;
    let lines: Vec<&HeaderValue> = headers.get_all("x-forwarded-for").iter().collect();
    for entry in lines
        .iter()
        .rev()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.rsplit(','))
    {
        let Ok(ip) = entry.trim().parse::<IpAddr>() else {
            // Unreadable: nothing further left is believed.
            break;
        };
        client = ip;
        if !edge.trusts(ip) {
            break;
        }
    }
    client
}

/// The request's id: the client's `x-request-id` when it is 1 to 128
/// characters of `[A-Za-z0-9._:-]`, else a new random one (UUID form).
pub(super) fn request_id(headers: &HeaderMap) -> HeaderValue {
    if let Some(given) = headers.get(&X_REQUEST_ID) {
        let bytes = given.as_bytes();
        let valid = (1..=128).contains(&bytes.len())
            && bytes
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
        if valid {
            return given.clone();
        }
    }
    let n = fastrand::u128(..);
    // Version 4, variant 1 (RFC 9562), as every log tool reads them.
    let n = (n & !(0xf << 76) | (0x4 << 76)) & !(0x3 << 62) | (0x2 << 62);
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut id = [b'-'; 36];
    let mut nibble = 0;
    for (i, slot) in id.iter_mut().enumerate() {
        if matches!(i, 8 | 13 | 18 | 23) {
            continue;
        }
        let shift = 124 - 4 * nibble;
        *slot = HEX[((n >> shift) & 0xf) as usize];
        nibble += 1;
    }
    HeaderValue::from_bytes(&id).unwrap_or_else(|_| HeaderValue::from_static("-"))
}

/// What one request's templates read.
pub(super) struct Vars<'r> {
    pub conn: &'r ConnContext,
    pub client: IpAddr,
    pub host: Option<&'r HeaderValue>,
    /// As routed (normalized).
    pub path: &'r str,
    pub query: Option<&'r str>,
    pub method: &'r Method,
    pub request_id: Option<&'r HeaderValue>,
    pub route: &'r crate::generation::RouteShared,
    pub generation: u64,
    pub headers: &'r HeaderMap,
}

impl Vars<'_> {
    /// The template's value for this request; `None` when it would not be
    /// a valid header value (a client's bytes made it so): dropped, and
    /// counted.
    pub(super) fn render(&self, template: &Template) -> Option<HeaderValue> {
        if let Some(literal) = template.literal() {
            return Some(literal.clone());
        }
        let value = HeaderValue::from_bytes(&render_bytes(template, self)).ok();
        if value.is_none() {
            self.route.value_dropped();
        }
        value
    }

    fn push(&self, var: &Var, out: &mut Vec<u8>) {
        use std::io::Write;
        let tls = self.conn.tls.get();
        let bytes: &[u8] = match var {
            // The peer's address is formatted once per connection.
            Var::ClientIp if self.client == self.conn.remote.ip() => self.conn.client_ip.as_bytes(),
            Var::ClientIp => {
                let _ = write!(out, "{}", self.client);
                return;
            }
            Var::ClientPort => {
                let _ = write!(out, "{}", self.conn.remote.port());
                return;
            }
            Var::Generation => {
                let _ = write!(out, "{}", self.generation);
                return;
            }
            Var::Host => self.host.map_or(&[][..], HeaderValue::as_bytes),
            Var::Path => self.path.as_bytes(),
            Var::Query => self.query.unwrap_or_default().as_bytes(),
            Var::Method => self.method.as_str().as_bytes(),
            Var::Scheme => {
                if self.conn.scheme == Scheme::HTTPS {
                    b"https"
                } else {
                    b"http"
                }
            }
            Var::RequestId => self.request_id.map_or(&[][..], HeaderValue::as_bytes),
            Var::Route => self.route.name().as_bytes(),
            Var::TlsSni => tls
                .and_then(|t| t.sni.as_deref())
                .unwrap_or_default()
                .as_bytes(),
            Var::TlsClientSubject => tls
                .and_then(|t| t.client_subject.as_deref())
                .unwrap_or_default()
                .as_bytes(),
            Var::TlsClientFingerprint => tls
                .and_then(|t| t.client_fingerprint.as_deref())
                .unwrap_or_default()
                .as_bytes(),
            Var::Header(name) => self
                .headers
                .get(name)
                .map_or(&[][..], HeaderValue::as_bytes),
        };
        out.extend_from_slice(bytes);
    }
}

/// Header changes with their templates rendered from the request as the
/// client sent it, applied later: `remove`, then `set`, then `add`.
/// Literal values are used as they are; only templated ones are rendered
/// (and so allocated for).
struct Rendered<'g> {
    ops: &'g HeaderOps,
    /// One per templated value of `set`, then of `add`, in order; `None`
    /// when a client's bytes made it invalid (dropped).
    values: Vec<Option<HeaderValue>>,
}

impl<'g> Rendered<'g> {
    fn new(ops: &'g HeaderOps, vars: &Vars<'_>) -> Self {
        let values = ops
            .set
            .iter()
            .chain(&ops.add)
            .filter(|(_, t)| t.literal().is_none())
            .map(|(_, t)| vars.render(t))
            .collect();
        Rendered { ops, values }
    }

    fn apply(self, headers: &mut HeaderMap) {
        let mut rendered = self.values.into_iter();
        let mut value = |template: &Template| match template.literal() {
            Some(literal) => Some(literal.clone()),
            None => rendered.next().flatten(),
        };
        for name in &self.ops.remove {
            headers.remove(name);
        }
        for (name, template) in &self.ops.set {
            // `insert` replaces every line of the name.
            match value(template) {
                Some(v) => {
                    headers.insert(name.clone(), v);
                }
                None => {
                    headers.remove(name);
                }
            }
        }
        for (name, template) in &self.ops.add {
            if let Some(v) = value(template) {
                headers.append(name.clone(), v);
            }
        }
    }
}

/// Response header changes, rendered while the request is at hand (a
/// template reads the request, never the response), and the request id.
pub(super) struct Shaped<'g> {
    values: Option<Rendered<'g>>,
    request_id: Option<HeaderValue>,
    /// After the response headers (DESIGN §17's order).
    cors: Option<CorsMark<'g>>,
    /// Last of all.
    compress: Option<CompressMark<'g>>,
}

impl<'g> Shaped<'g> {
    fn new(ops: Option<&'g HeaderOps>, vars: &Vars<'_>, request_id: Option<HeaderValue>) -> Self {
        Shaped {
            values: ops.map(|ops| Rendered::new(ops, vars)),
            request_id,
            cors: None,
            compress: None,
        }
    }

    /// Onto any answer of the route: the backend's, a direct one, a
    /// redirect, a preflight, or one the gateway made for a failure.
    /// Returns the encoding `compress` used, if it did (the body's bytes
    /// before it go to `trail`).
    pub(super) fn apply(
        self,
        response: &mut Response<ResponseBody>,
        trail: Option<&std::sync::Arc<Trail>>,
    ) -> Option<Encoding> {
        let headers = response.headers_mut();
        if let Some(id) = self.request_id {
            headers.insert(X_REQUEST_ID.clone(), id);
        }
        if let Some(values) = self.values {
            values.apply(headers);
        }
        if let Some(cors) = self.cors {
            cors.apply(headers);
        }
        self.compress.and_then(|c| c.apply(response, trail))
    }
}

/// The redirect `redirect` makes of this request.
fn redirect(redirect: &Redirect, vars: &Vars<'_>) -> Response<ResponseBody> {
    let scheme: Vec<u8> = match &redirect.scheme {
        Some(t) => render_bytes(t, vars),
        None => {
            let mut scheme = Vec::new();
            vars.push(&Var::Scheme, &mut scheme);
            scheme
        }
    };
    let host: Vec<u8> = match &redirect.host {
        Some(t) => render_bytes(t, vars),
        // The request's host without its port (a port of its own, or the
        // scheme's default, follows).
        None => {
            let host = vars.host.map_or(&[][..], HeaderValue::as_bytes);
            strip_port(host).to_vec()
        }
    };
    let mut location = Vec::with_capacity(64);
    location.extend_from_slice(&scheme);
    location.extend_from_slice(b"://");
    location.extend_from_slice(&host);
    match redirect.port {
        Some(port) => {
            location.push(b':');
            location.extend_from_slice(port.to_string().as_bytes());
        }
        // Unchanged scheme, unchanged host: keep the request's port.
        None if redirect.scheme.is_none() && redirect.host.is_none() => {
            let host = vars.host.map_or(&[][..], HeaderValue::as_bytes);
            location.extend_from_slice(host.get(strip_port(host).len()..).unwrap_or_default());
        }
        None => {}
    }
    match &redirect.path {
        RedirectPath::Same => location.extend_from_slice(vars.path.as_bytes()),
        RedirectPath::Template(t) => location.extend_from_slice(&render_bytes(t, vars)),
        RedirectPath::ReplacePrefix(prefix, with) => {
            let path = crate::plan::replace_prefix(vars.path, prefix, with);
            location.extend_from_slice(path.as_deref().unwrap_or(vars.path).as_bytes());
        }
    }
    if redirect.keep_query {
        if let Some(query) = vars.query.filter(|q| !q.is_empty()) {
            location.push(b'?');
            location.extend_from_slice(query.as_bytes());
        }
    }
    let mut response = Response::new(ResponseBody::full(Bytes::new()));
    match HeaderValue::from_bytes(&location) {
        Ok(value) => {
            *response.status_mut() = redirect.status;
            response.headers_mut().insert(header::LOCATION, value);
        }
        // A client's bytes (a template over its headers) made it invalid.
        Err(_) => {
            vars.route.value_dropped();
            *response.status_mut() = http::StatusCode::BAD_REQUEST;
        }
    }
    response
}

fn render_bytes(template: &Template, vars: &Vars<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(32);
    for part in template.parts() {
        match part {
            Part::Text(text) => out.extend_from_slice(text.as_bytes()),
            Part::Var(var) => vars.push(var, &mut out),
        }
    }
    out
}

/// `host` without a `:port` (an IPv6 literal keeps its brackets).
fn strip_port(host: &[u8]) -> &[u8] {
    let end = match host.iter().rposition(|b| *b == b':') {
        Some(colon) if !host.get(colon..).is_some_and(|rest| rest.contains(&b']')) => colon,
        _ => host.len(),
    };
    host.get(..end).unwrap_or(host)
}

/// The client's body, failing with `BodyTooLarge` once it passes `limit`.
pub(super) fn limited(body: ClientBody, limit: u64) -> ClientBody {
    ClientBody::Other(Box::pin(Limited {
        inner: body,
        left: limit,
        limit,
    }))
}

struct Limited {
    inner: ClientBody,
    left: u64,
    limit: u64,
}

impl http_body::Body for Limited {
    type Data = Bytes;
    type Error = crate::backends::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let len = data.len() as u64;
                    if len > this.left {
                        return Poll::Ready(Some(Err(Box::new(BodyTooLarge(this.limit)))));
                    }
                    this.left -= len;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A route's `respond`: its status, headers and body (`text/plain` when
/// it names no type).
pub(super) fn direct_response(
    direct: &crate::plan::DirectResponse,
) -> http::Response<super::body::ResponseBody> {
    let mut response = http::Response::new(super::body::ResponseBody::full(direct.body.clone()));
    *response.status_mut() = direct.status;
    let headers = response.headers_mut();
    for (name, value) in &direct.headers {
        headers.append(name.clone(), value.clone());
    }
    if !headers.contains_key(http::header::CONTENT_TYPE) && !direct.body.is_empty() {
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_kept_when_valid_and_made_otherwise() {
        let mut headers = HeaderMap::new();
        headers.insert(&X_REQUEST_ID, HeaderValue::from_static("abc-123.x:y_z"));
        assert_eq!(request_id(&headers), "abc-123.x:y_z");
        headers.insert(&X_REQUEST_ID, HeaderValue::from_static("has space"));
        let made = request_id(&headers);
        let text = made.to_str().unwrap();
        assert_eq!(text.len(), 36, "{text}");
        assert_eq!(text.as_bytes()[14], b'4', "version 4: {text}");
        assert_ne!(request_id(&HeaderMap::new()), made);
    }

    #[test]
    fn ports_come_off_hosts_but_not_off_ipv6_literals() {
        assert_eq!(strip_port(b"example.com:8080"), b"example.com");
        assert_eq!(strip_port(b"example.com"), b"example.com");
        assert_eq!(strip_port(b"[::1]:8443"), b"[::1]");
        assert_eq!(strip_port(b"[::1]"), b"[::1]");
    }
}
