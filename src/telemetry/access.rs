//! The access log (DESIGN §16): one line per HTTP request and per TCP
//! connection, written off the serving threads.
//!
//! A request builds its [`Line`] as it is served (the parts only the
//! request path knows go through a shared [`Trail`]: attempts, backend,
//! upstream time, bytes in) and hands it over when its response body is
//! finished or dropped. Lines go through a bounded queue to a thread of
//! their own, which formats them (text `key=value` or JSON, as
//! `log.format`) and writes them in batches. When the queue is full the
//! line is dropped and counted (`cutover_log_dropped_total`): a slow disk
//! never holds a request up. SIGUSR1 makes the thread reopen its file,
//! for logrotate.

use std::fs::File;
use std::io::{self, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, SystemTime};

use http::Method;

use super::{LogFormat, LogSpec};

/// How a request or connection ended, besides its status: a set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flags(u32);

impl Flags {
    pub const NONE: Flags = Flags(0);
    pub const NO_ROUTE: Flags = Flags(1);
    pub const NO_HEALTHY_BACKEND: Flags = Flags(1 << 1);
    pub const CONNECT_FAILURE: Flags = Flags(1 << 2);
    pub const UPSTREAM_TIMEOUT: Flags = Flags(1 << 3);
    pub const UPSTREAM_RESET: Flags = Flags(1 << 4);
    pub const RETRIED: Flags = Flags(1 << 5);
    pub const ADMISSION_REJECTED: Flags = Flags(1 << 6);
    pub const RATE_LIMITED: Flags = Flags(1 << 7);
    pub const CLIENT_CLOSED: Flags = Flags(1 << 8);
    pub const PROTOCOL_ERROR: Flags = Flags(1 << 9);
    pub const UPGRADED: Flags = Flags(1 << 10);
    pub const HEADER_TIMEOUT: Flags = Flags(1 << 11);
    /// A TCP connection closed by its listener's `idle_timeout`.
    pub const IDLE_TIMEOUT: Flags = Flags(1 << 12);
    /// Refused by `allow_from` / `deny_from`.
    pub const DENIED: Flags = Flags(1 << 13);
    /// Refused by `max_request_body`.
    pub const BODY_TOO_LARGE: Flags = Flags(1 << 14);
    /// The upstream cannot carry the request's protocol (gRPC for an
    /// HTTP/1.1 upstream).
    pub const UPSTREAM_PROTOCOL: Flags = Flags(1 << 15);

    /// Names in output order.
    const NAMES: [(Flags, &'static str); 16] = [
        (Flags::NO_ROUTE, "no_route"),
        (Flags::NO_HEALTHY_BACKEND, "no_healthy_backend"),
        (Flags::CONNECT_FAILURE, "connect_failure"),
        (Flags::UPSTREAM_TIMEOUT, "upstream_timeout"),
        (Flags::UPSTREAM_RESET, "upstream_reset"),
        (Flags::RETRIED, "retried"),
        (Flags::ADMISSION_REJECTED, "admission_rejected"),
        (Flags::RATE_LIMITED, "rate_limited"),
        (Flags::CLIENT_CLOSED, "client_closed"),
        (Flags::PROTOCOL_ERROR, "protocol_error"),
        (Flags::UPGRADED, "upgraded"),
        (Flags::HEADER_TIMEOUT, "header_timeout"),
        (Flags::IDLE_TIMEOUT, "idle_timeout"),
        (Flags::DENIED, "denied"),
        (Flags::BODY_TOO_LARGE, "body_too_large"),
        (Flags::UPSTREAM_PROTOCOL, "upstream_protocol"),
    ];

    pub fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn names(self) -> impl Iterator<Item = &'static str> {
        Self::NAMES
            .into_iter()
            .filter(move |(flag, _)| self.contains(*flag))
            .map(|(_, name)| name)
    }
}

impl std::ops::BitOr for Flags {
    type Output = Flags;
    fn bitor(self, other: Flags) -> Flags {
        Flags(self.0 | other.0)
    }
}

impl std::ops::BitOrAssign for Flags {
    fn bitor_assign(&mut self, other: Flags) {
        self.0 |= other.0;
    }
}

/// What the attempts of one request leave for its line; shared with the
/// request body (bytes in) and every attempt, hedged ones included.
#[derive(Debug, Default)]
pub struct Trail {
    bytes_in: AtomicU64,
    /// The answer's body before `compress` (when it was compressed).
    uncompressed: AtomicU64,
    attempts: AtomicU32,
    flags: AtomicU32,
    /// Microseconds from the last answered attempt's start to its head.
    upstream_us: AtomicU64,
    /// The last backend an attempt went to.
    backend: Mutex<Option<Arc<str>>>,
    /// A gRPC call's status plus one (0: none yet).
    grpc_status: AtomicU32,
    /// The HTTP version of the last answer from a backend (0: none;
    /// `UPSTREAM_PROTOCOLS`' index plus one).
    upstream_protocol: std::sync::atomic::AtomicU8,
    /// The line of a request that switched protocols, until its tunnel
    /// closes.
    deferred: Mutex<Option<Box<Pending>>>,
}

impl Trail {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn add_bytes_in(&self, n: usize) {
        self.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// `n` bytes of the answer's body went into its compressor.
    pub fn add_uncompressed(&self, n: usize) {
        self.uncompressed.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// An attempt at `backend` begins.
    pub fn attempt(&self, backend: &Arc<str>) {
        self.attempts.fetch_add(1, Ordering::Relaxed);
        let mut slot = self
            .backend
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *slot = Some(Arc::clone(backend));
    }

    /// An attempt got its answer's head after `upstream`.
    pub fn answered(&self, upstream: Duration) {
        let us = u64::try_from(upstream.as_micros()).unwrap_or(u64::MAX);
        // 0 means "no answer": an answer is at least a microsecond.
        self.upstream_us.store(us.max(1), Ordering::Relaxed);
    }

    /// The last answer came from its backend over `version`.
    pub fn upstream_protocol(&self, version: http::Version) {
        let index = match version {
            http::Version::HTTP_10 => 1,
            http::Version::HTTP_11 => 2,
            http::Version::HTTP_2 => 3,
            http::Version::HTTP_3 => 4,
            _ => 0,
        };
        self.upstream_protocol.store(index, Ordering::Relaxed);
    }

    /// A gRPC call ended with status `code`.
    pub fn grpc_status(&self, code: u8) {
        self.grpc_status
            .store(u32::from(code) + 1, Ordering::Relaxed);
    }

    pub fn flag(&self, flags: Flags) {
        self.flags.fetch_or(flags.0, Ordering::Relaxed);
    }

    /// Keeps a line until the tunnel that follows it closes (or, should
    /// it never open, until the trail is dropped).
    pub fn defer(&self, line: Box<Pending>) {
        *self
            .deferred
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(line);
    }

    pub fn take_deferred(&self) -> Option<Box<Pending>> {
        self.deferred
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }
}

/// One access-log line.
#[derive(Debug)]
pub struct Line {
    /// When the request (or connection) ended.
    pub ended: SystemTime,
    pub duration: Duration,
    pub protocol: &'static str,
    pub listener: Arc<str>,
    pub generation: u64,
    pub client: SocketAddr,
    pub method: Option<Method>,
    /// A copy: a `HeaderValue` would share (and so pin) the
    /// connection's read buffer until the writer is done with the line.
    pub authority: Option<String>,
    /// The path as routed (normalized), without the query.
    pub path: Option<String>,
    /// The path forwarded, when a `rewrite` changed it.
    pub upstream_path: Option<String>,
    /// The route's `request_id`, when it has one.
    pub request_id: Option<String>,
    /// The route's `auth` outcome (`cutover_auth_total`'s), and the subject it found (a user, a token's `sub`).
    pub auth: Option<&'static str>,
    pub subject: Option<String>,
    /// What the route's cache did (`cutover_cache_requests_total`'s
    /// status), when it has one.
    pub cache: Option<&'static str>,
    /// What refused the request, when a quota did (`local`, `fleet`,
    /// `fallback`, `store_error`).
    pub limited: Option<&'static str>,
    pub route: Option<Arc<str>>,
    /// 0 for a TCP connection.
    pub status: u16,
    /// A gRPC call's status (from the backend or the gateway).
    pub grpc_status: Option<u8>,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// The route's `compress` coding of the answer, and its body's bytes
    /// before it (`bytes_out` counts them after).
    pub encoding: Option<&'static str>,
    pub bytes_uncompressed: u64,
    pub upstream_time: Option<Duration>,
    /// What the answer came over from its backend: `http/1.0`,
    /// `http/1.1`, `h2`, `h3`.
    pub upstream_protocol: Option<&'static str>,
    pub backend: Option<Arc<str>>,
    pub attempts: u32,
    pub trace_id: Option<[u8; 16]>,
    /// The gateway's span, and the caller's, when the request had one.
    pub span_id: Option<[u8; 8]>,
    pub parent_span_id: Option<[u8; 8]>,
    /// Exported as a span (see `otlp`).
    pub sampled: bool,
    /// Written to the access log.
    pub logged: bool,
    pub flags: Flags,
}

impl Line {
    /// A line that knows only where the request or connection came in;
    /// the rest is filled in as it is served.
    pub fn new(
        protocol: &'static str,
        listener: Arc<str>,
        generation: u64,
        client: SocketAddr,
    ) -> Self {
        Self {
            ended: SystemTime::UNIX_EPOCH,
            duration: Duration::ZERO,
            protocol,
            listener,
            generation,
            client,
            method: None,
            authority: None,
            path: None,
            upstream_path: None,
            request_id: None,
            auth: None,
            subject: None,
            cache: None,
            limited: None,
            route: None,
            status: 0,
            grpc_status: None,
            bytes_in: 0,
            bytes_out: 0,
            encoding: None,
            bytes_uncompressed: 0,
            upstream_time: None,
            upstream_protocol: None,
            backend: None,
            attempts: 0,
            trace_id: None,
            span_id: None,
            parent_span_id: None,
            sampled: false,
            logged: true,
            flags: Flags::NONE,
        }
    }

    /// Takes what the request's trail collected.
    pub fn absorb(&mut self, trail: &Trail) {
        self.bytes_in += trail.bytes_in.load(Ordering::Relaxed);
        self.bytes_uncompressed += trail.uncompressed.load(Ordering::Relaxed);
        self.attempts = trail.attempts.load(Ordering::Relaxed);
        self.flags |= Flags(trail.flags.load(Ordering::Relaxed));
        if self.attempts > 1 {
            self.flags |= Flags::RETRIED;
        }
        let grpc = trail.grpc_status.load(Ordering::Relaxed);
        self.grpc_status = grpc.checked_sub(1).and_then(|c| u8::try_from(c).ok());
        let us = trail.upstream_us.load(Ordering::Relaxed);
        self.upstream_time = (us > 0).then(|| Duration::from_micros(us));
        let protocol = trail.upstream_protocol.load(Ordering::Relaxed);
        self.upstream_protocol = ["http/1.0", "http/1.1", "h2", "h3"]
            .get(usize::from(protocol).wrapping_sub(1))
            .copied();
        self.backend = trail
            .backend
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
    }
}

/// A request's line until its response body is finished or dropped.
#[derive(Debug)]
pub struct Pending {
    line: Option<Line>,
    trail: Option<Arc<Trail>>,
    started: std::time::Instant,
    complete: bool,
}

impl Pending {
    /// `complete`: the response has no body to wait for.
    pub fn new(
        line: Line,
        trail: Option<Arc<Trail>>,
        started: std::time::Instant,
        complete: bool,
    ) -> Box<Self> {
        Box::new(Self {
            line: Some(line),
            trail,
            started,
            complete,
        })
    }

    /// `n` bytes of the response body went out.
    pub fn sent(&mut self, n: usize) {
        if let Some(line) = self.line.as_mut() {
            line.bytes_out += n as u64;
        }
    }

    /// A tunnel (after a protocol switch) moved `sent` bytes from the
    /// client and `received` to it before it closed.
    pub fn tunnelled(&mut self, sent: u64, received: u64) {
        if let Some(line) = self.line.as_mut() {
            line.bytes_in += sent;
            line.bytes_out += received;
        }
        self.complete = true;
    }

    /// The body ended: by its last frame, or (`broken`) by an error of
    /// the upstream's.
    pub fn ended(&mut self, broken: bool) {
        if let (true, Some(line)) = (broken, self.line.as_mut()) {
            line.flags |= Flags::UPSTREAM_RESET;
        }
        self.complete = true;
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let Some(mut line) = self.line.take() else {
            return;
        };
        if !self.complete {
            line.flags |= Flags::CLIENT_CLOSED;
        }
        line.duration = self.started.elapsed();
        line.ended = SystemTime::now();
        if let Some(trail) = &self.trail {
            line.absorb(trail);
        }
        emit(line);
    }
}

/// Lines the writer may be behind by before new ones are dropped. The
/// queue's slots are allocated and written when it starts (7 MiB), so it
/// starts only once lines are wanted: see [`start`].
const QUEUE: usize = 16 * 1024;
/// A batch is written once it is this long, or the queue is empty.
const BATCH: usize = 64 * 1024;

// Lines travel by value: the queue's slots are allocated once, a box
// would be one allocation per request.
#[allow(clippy::large_enum_variant)]
enum Message {
    Line(Line),
    Reopen,
    Flush(mpsc::Sender<()>),
}

struct Sink {
    queue: SyncSender<Message>,
}

/// Counts lost lines (looked up each time: the sink starts before the
/// metrics recorder is installed, and this is the rare path).
fn dropped(lines: u64) {
    metrics::counter!(super::metrics::LOG_DROPPED).increment(lines);
}

static SINK: OnceLock<Sink> = OnceLock::new();
static ENABLED: AtomicBool = AtomicBool::new(false);
/// The output opened at start, until the queue and its writer start.
static OUTPUT: Mutex<Option<(Output, LogFormat)>> = Mutex::new(None);

/// Opens the access log's output for the process (once; later calls
/// change nothing), so that a path that cannot be opened fails the
/// start. The file is `log.access_file`, else `log.file`, else stderr.
/// The queue and the writer thread start with it when `log.access` is
/// on, else when lines are first wanted.
pub fn init(spec: &LogSpec) -> io::Result<()> {
    let mut pending = OUTPUT.lock().unwrap_or_else(PoisonError::into_inner);
    if SINK.get().is_some() || pending.is_some() {
        return Ok(());
    }
    let path = spec.access_file.clone().or_else(|| spec.file.clone());
    *pending = Some((Output::open(path)?, spec.format));
    drop(pending);
    set_enabled(spec.access);
    Ok(())
}

/// Starts the queue and its writer thread (once): when the access log is
/// turned on, or spans are exported (they travel as lines). A gateway
/// that never wants a line never holds the queue's memory.
pub fn start() {
    let mut pending = OUTPUT.lock().unwrap_or_else(PoisonError::into_inner);
    let Some((output, format)) = pending.take() else {
        return;
    };
    let (queue, lines) = mpsc::sync_channel(QUEUE);
    let spawned = std::thread::Builder::new()
        .name("cutover-access".into())
        .spawn(move || write_lines(lines, output, format));
    match spawned {
        Ok(_) => {
            let _ = SINK.set(Sink { queue });
        }
        Err(error) => {
            tracing::error!(%error, "cannot start the access log's writer thread; lines are dropped and counted")
        }
    }
}

/// Turns access lines on or off (`log.access` is live).
pub fn set_enabled(on: bool) {
    if on {
        start();
    }
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether requests should build lines at all.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Queues a line; drops and counts it when the writer is behind.
pub fn emit(line: Line) {
    let Some(sink) = SINK.get() else {
        // Only when the writer thread could not be started.
        dropped(1);
        return;
    };
    match sink.queue.try_send(Message::Line(line)) {
        Ok(()) => {}
        Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => dropped(1),
    }
}

/// Reopens the access log's file (SIGUSR1, after logrotate moved it).
pub fn reopen() {
    if let Some(sink) = SINK.get() {
        // Blocking is fine here: the signal loop, not a request, waits.
        let _ = sink.queue.send(Message::Reopen);
    } else if let Some((output, _)) = OUTPUT
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_mut()
    {
        output.reopen();
    }
}

/// Waits until every line queued so far is written, at most `timeout`
/// (before the process exits).
pub fn flush(timeout: Duration) {
    let Some(sink) = SINK.get() else { return };
    let (done, wait) = mpsc::channel();
    if sink.queue.send(Message::Flush(done)).is_ok() {
        let _ = wait.recv_timeout(timeout);
    }
}

/// Where lines go.
enum Output {
    Stderr,
    File { path: PathBuf, file: File },
}

impl Output {
    fn open(path: Option<PathBuf>) -> io::Result<Self> {
        Ok(match path {
            None => Output::Stderr,
            Some(path) => {
                let file = open_append(&path)?;
                Output::File { path, file }
            }
        })
    }

    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Output::Stderr => io::stderr().lock().write_all(bytes),
            Output::File { file, .. } => file.write_all(bytes),
        }
    }

    fn reopen(&mut self) {
        if let Output::File { path, file } = self {
            match open_append(path) {
                Ok(fresh) => *file = fresh,
                Err(error) => {
                    tracing::error!(path = %path.display(), %error, "cannot reopen the access log; still writing to the old file")
                }
            }
        }
    }
}

fn open_append(path: &std::path::Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

/// How often the writer looks at the queue while lines arrive, and at
/// most while none do. It never blocks in `recv`: a blocked receiver
/// would make every request's send a wake-up (a futex call and a context
/// switch, about a fifth of the log's cost at 50 000 lines a second).
const POLL: Duration = Duration::from_millis(10);
const IDLE_POLL: Duration = Duration::from_millis(100);

/// The writer thread: every `POLL`, formats what is queued and writes it
/// in one go (per `BATCH` bytes).
fn write_lines(lines: Receiver<Message>, mut output: Output, format: LogFormat) {
    let mut batch = Vec::with_capacity(BATCH);
    let mut waiting: Vec<mpsc::Sender<()>> = Vec::new();
    let mut failed_at: Option<std::time::Instant> = None;
    let mut pause = POLL;
    loop {
        std::thread::sleep(pause);
        let mut seen = false;
        loop {
            let message = match lines.try_recv() {
                Ok(message) => message,
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    flush_batch(&mut output, &mut batch, &mut failed_at);
                    return;
                }
            };
            seen = true;
            match message {
                Message::Line(line) => {
                    if line.logged {
                        format_line(&mut batch, &line, format);
                    }
                    if line.sampled {
                        super::otlp::submit(&line);
                    }
                }
                Message::Reopen => {
                    flush_batch(&mut output, &mut batch, &mut failed_at);
                    output.reopen();
                }
                Message::Flush(done) => waiting.push(done),
            }
            if batch.len() >= BATCH {
                flush_batch(&mut output, &mut batch, &mut failed_at);
            }
        }
        flush_batch(&mut output, &mut batch, &mut failed_at);
        for done in waiting.drain(..) {
            let _ = done.send(());
        }
        // Quiet: look less often, up to IDLE_POLL; busy: every POLL.
        pause = if seen {
            POLL
        } else {
            (pause * 2).min(IDLE_POLL)
        };
    }
}

fn flush_batch(
    output: &mut Output,
    batch: &mut Vec<u8>,
    failed_at: &mut Option<std::time::Instant>,
) {
    if batch.is_empty() {
        return;
    }
    if let Err(error) = output.write_all(batch) {
        // Once a minute at most: a full disk must not flood the log too.
        if failed_at.is_none_or(|at| at.elapsed() > Duration::from_secs(60)) {
            tracing::error!(%error, "cannot write the access log; lines are lost");
            *failed_at = Some(std::time::Instant::now());
        }
        dropped(batch.iter().filter(|b| **b == b'\n').count() as u64);
    }
    batch.clear();
}

/// Appends one line, text (`key=value`, values quoted when they need it)
/// or JSON, and a newline. Numbers, addresses and the time are written
/// without `fmt`, which costs several times as much
/// (`docs/performance.md`, "Figures behind choices in the code").
pub fn format_line(out: &mut Vec<u8>, line: &Line, format: LogFormat) {
    let start = line.ended.checked_sub(line.duration).unwrap_or(line.ended);
    let method = line.method.as_ref().map(Method::as_str);
    let authority = line.authority.as_deref();
    let trace_id = line.trace_id.map(|id| {
        let mut text = String::with_capacity(32);
        super::trace::push_hex(&mut text, &id);
        text
    });
    match format {
        LogFormat::Json => {
            // Written field by field: serde_json's escaping looks at every
            // byte of every string through a table; most values here need
            // none (see `push_json_str`).
            out.extend_from_slice(b"{\"time\":\"");
            push_time(out, start);
            out.extend_from_slice(b"\",\"target\":\"cutover::access\",\"listener\":");
            push_json_str(out, &line.listener);
            out.extend_from_slice(b",\"generation\":");
            push_u64(out, line.generation);
            out.extend_from_slice(b",\"protocol\":\"");
            out.extend_from_slice(line.protocol.as_bytes());
            out.extend_from_slice(b"\",\"client\":\"");
            push_addr(out, line.client);
            out.extend_from_slice(b"\",\"method\":");
            push_json_opt(out, method);
            out.extend_from_slice(b",\"authority\":");
            push_json_opt(out, authority);
            out.extend_from_slice(b",\"path\":");
            push_json_opt(out, line.path.as_deref());
            out.extend_from_slice(b",\"upstream_path\":");
            push_json_opt(out, line.upstream_path.as_deref());
            out.extend_from_slice(b",\"route\":");
            push_json_opt(out, line.route.as_deref());
            out.extend_from_slice(b",\"request_id\":");
            push_json_opt(out, line.request_id.as_deref());
            out.extend_from_slice(b",\"auth\":");
            push_json_opt(out, line.auth);
            out.extend_from_slice(b",\"subject\":");
            push_json_opt(out, line.subject.as_deref());
            out.extend_from_slice(b",\"cache\":");
            push_json_opt(out, line.cache);
            out.extend_from_slice(b",\"limited\":");
            push_json_opt(out, line.limited);
            out.extend_from_slice(b",\"status\":");
            push_u64(out, u64::from(line.status));
            out.extend_from_slice(b",\"grpc_status\":");
            match line.grpc_status {
                Some(code) => push_u64(out, u64::from(code)),
                None => out.extend_from_slice(b"null"),
            }
            out.extend_from_slice(b",\"bytes_in\":");
            push_u64(out, line.bytes_in);
            out.extend_from_slice(b",\"bytes_out\":");
            push_u64(out, line.bytes_out);
            out.extend_from_slice(b",\"encoding\":");
            push_json_opt(out, line.encoding);
            out.extend_from_slice(b",\"bytes_uncompressed\":");
            match line.encoding {
                Some(_) => push_u64(out, line.bytes_uncompressed),
                None => out.extend_from_slice(b"null"),
            }
            out.extend_from_slice(b",\"duration_ms\":");
            push_millis(out, line.duration);
            out.extend_from_slice(b",\"upstream_ms\":");
            match line.upstream_time {
                Some(t) => push_millis(out, t),
                None => out.extend_from_slice(b"null"),
            }
            out.extend_from_slice(b",\"upstream_protocol\":");
            push_json_opt(out, line.upstream_protocol);
            out.extend_from_slice(b",\"backend\":");
            push_json_opt(out, line.backend.as_deref());
            out.extend_from_slice(b",\"attempts\":");
            push_u64(out, u64::from(line.attempts));
            out.extend_from_slice(b",\"trace_id\":");
            push_json_opt(out, trace_id.as_deref());
            out.extend_from_slice(b",\"flags\":[");
            for (i, name) in line.flags.names().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.push(b'"');
                out.extend_from_slice(name.as_bytes());
                out.push(b'"');
            }
            out.extend_from_slice(b"]}");
        }
        LogFormat::Text => {
            let dash = "-";
            out.extend_from_slice(b"time=");
            push_time(out, start);
            out.push(b' ');
            push_field(out, "listener", &line.listener);
            out.extend_from_slice(b" protocol=");
            out.extend_from_slice(line.protocol.as_bytes());
            out.extend_from_slice(b" client=");
            push_addr(out, line.client);
            for (key, value) in [
                ("method", method.unwrap_or(dash)),
                ("authority", authority.unwrap_or(dash)),
                ("path", line.path.as_deref().unwrap_or(dash)),
                (
                    "upstream_path",
                    line.upstream_path.as_deref().unwrap_or(dash),
                ),
                ("route", line.route.as_deref().unwrap_or(dash)),
                ("request_id", line.request_id.as_deref().unwrap_or(dash)),
                ("auth", line.auth.unwrap_or(dash)),
                ("subject", line.subject.as_deref().unwrap_or(dash)),
                ("cache", line.cache.unwrap_or(dash)),
                ("limited", line.limited.unwrap_or(dash)),
            ] {
                out.push(b' ');
                push_field(out, key, value);
            }
            out.extend_from_slice(b" generation=");
            push_u64(out, line.generation);
            out.extend_from_slice(b" status=");
            push_u64(out, u64::from(line.status));
            out.extend_from_slice(b" grpc_status=");
            match line.grpc_status {
                Some(code) => push_u64(out, u64::from(code)),
                None => out.push(b'-'),
            }
            out.extend_from_slice(b" bytes_in=");
            push_u64(out, line.bytes_in);
            out.extend_from_slice(b" bytes_out=");
            push_u64(out, line.bytes_out);
            out.extend_from_slice(b" encoding=");
            out.extend_from_slice(line.encoding.unwrap_or(dash).as_bytes());
            out.extend_from_slice(b" bytes_uncompressed=");
            match line.encoding {
                Some(_) => push_u64(out, line.bytes_uncompressed),
                None => out.push(b'-'),
            }
            out.extend_from_slice(b" duration_ms=");
            push_millis(out, line.duration);
            out.extend_from_slice(b" upstream_ms=");
            match line.upstream_time {
                Some(t) => push_millis(out, t),
                None => out.push(b'-'),
            }
            out.extend_from_slice(b" upstream_protocol=");
            out.extend_from_slice(line.upstream_protocol.unwrap_or(dash).as_bytes());
            out.push(b' ');
            push_field(out, "backend", line.backend.as_deref().unwrap_or(dash));
            out.extend_from_slice(b" attempts=");
            push_u64(out, u64::from(line.attempts));
            out.push(b' ');
            push_field(out, "trace_id", trace_id.as_deref().unwrap_or(dash));
            out.extend_from_slice(b" flags=");
            if line.flags.is_empty() {
                out.push(b'-');
            }
            for (i, name) in line.flags.names().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(name.as_bytes());
            }
        }
    }
    out.push(b'\n');
}

fn push_u64(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// Milliseconds with three decimals (microsecond precision).
fn push_millis(out: &mut Vec<u8>, duration: Duration) {
    let micros = u64::try_from(duration.as_micros()).unwrap_or(u64::MAX);
    push_u64(out, micros / 1000);
    let fraction = micros % 1000;
    out.push(b'.');
    out.extend_from_slice(&[
        b'0' + (fraction / 100) as u8,
        b'0' + (fraction / 10 % 10) as u8,
        b'0' + (fraction % 10) as u8,
    ]);
}

fn push_addr(out: &mut Vec<u8>, addr: SocketAddr) {
    match addr {
        SocketAddr::V4(v4) => {
            push_ip(out, IpAddr::V4(*v4.ip()));
            out.push(b':');
            push_u64(out, u64::from(v4.port()));
        }
        SocketAddr::V6(_) => {
            let _ = write!(out, "{addr}");
        }
    }
}

/// An address as `Display` writes it; IPv4 without `fmt` (a tenth of
/// the instructions; it is written for every connection's
/// `X-Forwarded-For` and every access-log line).
pub fn push_ip(out: &mut Vec<u8>, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                push_u64(out, u64::from(octet));
            }
        }
        IpAddr::V6(v6) => {
            let _ = write!(out, "{v6}");
        }
    }
}

/// RFC 3339 UTC with milliseconds; the part up to the second is formatted
/// once per second (lines come in order of their requests' ends, so
/// nearly every line shares its second with the one before).
fn push_time(out: &mut Vec<u8>, at: SystemTime) {
    thread_local! {
        static SECOND: std::cell::RefCell<(u64, String)> =
            const { std::cell::RefCell::new((u64::MAX, String::new())) };
    }
    let since = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let second = since.as_secs();
    SECOND.with(|cached| {
        let mut cached = cached.borrow_mut();
        if cached.0 != second {
            let whole = SystemTime::UNIX_EPOCH + Duration::from_secs(second);
            // "2026-11-30T14:31:24Z" without its "Z".
            let mut text = humantime::format_rfc3339_seconds(whole).to_string();
            text.pop();
            *cached = (second, text);
        }
        out.extend_from_slice(cached.1.as_bytes());
    });
    let millis = since.subsec_millis();
    out.extend_from_slice(&[
        b'.',
        b'0' + (millis / 100) as u8,
        b'0' + (millis / 10 % 10) as u8,
        b'0' + (millis % 10) as u8,
        b'Z',
    ]);
}

/// A JSON string: copied as is when nothing in it needs escaping (the
/// common case), else escaped by serde_json.
fn push_json_str(out: &mut Vec<u8>, value: &str) {
    if value
        .bytes()
        .all(|b| b >= b' ' && b != b'"' && b != b'\\' && b != 0x7f)
    {
        out.push(b'"');
        out.extend_from_slice(value.as_bytes());
        out.push(b'"');
    } else {
        let _ = serde_json::to_writer(&mut *out, value);
    }
}

fn push_json_opt(out: &mut Vec<u8>, value: Option<&str>) {
    match value {
        Some(value) => push_json_str(out, value),
        None => out.extend_from_slice(b"null"),
    }
}

/// `key=value`, the value quoted (with `"` and `\` escaped, control bytes
/// as `\xNN`) when it is empty or holds a space, a quote, `=` or a
/// control byte, so every line splits the same way.
fn push_field(out: &mut Vec<u8>, key: &str, value: &str) {
    out.extend_from_slice(key.as_bytes());
    out.push(b'=');
    let plain = !value.is_empty()
        && value
            .bytes()
            .all(|b| b > b' ' && b != b'"' && b != b'=' && b != b'\\' && b != 0x7f);
    if plain {
        out.extend_from_slice(value.as_bytes());
        return;
    }
    out.push(b'"');
    for b in value.bytes() {
        match b {
            b'"' | b'\\' => {
                out.push(b'\\');
                out.push(b);
            }
            b if b < b' ' || b == 0x7f => {
                let _ = write!(out, "\\x{b:02x}");
            }
            b => out.push(b),
        }
    }
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        for text in [
            "0.0.0.0",
            "127.0.0.1",
            "10.20.255.9",
            "255.255.255.255",
            "::1",
            "2001:db8::17",
            "::ffff:192.0.2.1",
        ] {
            let ip: IpAddr = text.parse().expect("address");
            let mut out = Vec::new();
            push_ip(&mut out, ip);
            assert_eq!(out, ip.to_string().as_bytes(), "{text}");
        }
    }

    fn line() -> Line {
        Line {
            ended: SystemTime::UNIX_EPOCH + Duration::from_millis(1_764_513_084_123),
            duration: Duration::from_micros(1_500),
            protocol: "HTTP/1.1",
            listener: "web".into(),
            generation: 7,
            client: "127.0.0.1:5555".parse().unwrap(),
            method: Some(Method::GET),
            authority: Some("api.example.com".into()),
            path: Some("/v1/a b".into()),
            upstream_path: None,
            request_id: None,
            auth: None,
            subject: None,
            cache: None,
            limited: None,
            route: Some("api".into()),
            status: 502,
            grpc_status: None,
            bytes_in: 3,
            bytes_out: 12,
            encoding: None,
            bytes_uncompressed: 0,
            upstream_time: None,
            upstream_protocol: None,
            backend: Some("127.0.0.1:9001".into()),
            attempts: 2,
            trace_id: Some([0xab; 16]),
            span_id: Some([0x01; 8]),
            parent_span_id: None,
            sampled: false,
            logged: true,
            flags: Flags::CONNECT_FAILURE | Flags::RETRIED,
        }
    }

    #[test]
    fn text_lines_carry_every_field_and_quote_what_needs_it() {
        let mut out = Vec::new();
        format_line(&mut out, &line(), LogFormat::Text);
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "time=2025-11-30T14:31:24.121Z listener=web protocol=HTTP/1.1 client=127.0.0.1:5555 \
             method=GET authority=api.example.com path=\"/v1/a b\" upstream_path=- route=api \
             request_id=- auth=- subject=- cache=- limited=- generation=7 \
             status=502 grpc_status=- bytes_in=3 bytes_out=12 encoding=- bytes_uncompressed=- duration_ms=1.500 upstream_ms=- \
             upstream_protocol=- backend=127.0.0.1:9001 attempts=2 trace_id=abababababababababababababababab \
             flags=connect_failure,retried\n"
        );
        let mut out = Vec::new();
        push_field(&mut out, "k", "a\"b\\c\x01");
        assert_eq!(out, b"k=\"a\\\"b\\\\c\\x01\"");
        let mut out = Vec::new();
        push_field(&mut out, "k", "");
        assert_eq!(out, b"k=\"\"");
    }

    #[test]
    fn json_lines_carry_every_field() {
        let mut out = Vec::new();
        let mut l = line();
        l.upstream_time = Some(Duration::from_micros(250));
        l.upstream_protocol = Some("h3");
        l.flags = Flags::NONE;
        l.auth = Some("allowed");
        l.subject = Some("alice \"a\"".into());
        format_line(&mut out, &l, LogFormat::Json);
        assert_eq!(out.last(), Some(&b'\n'));
        let value: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(value["time"], "2025-11-30T14:31:24.121Z");
        assert_eq!(value["target"], "cutover::access");
        assert_eq!(value["path"], "/v1/a b");
        assert_eq!(value["status"], 502);
        assert_eq!(value["upstream_ms"], 0.25);
        assert_eq!(value["upstream_protocol"], "h3");
        assert_eq!(value["attempts"], 2);
        assert_eq!(value["flags"], serde_json::json!([]));
        for key in [
            "listener",
            "generation",
            "protocol",
            "client",
            "method",
            "authority",
            "route",
            "bytes_in",
            "bytes_out",
            "duration_ms",
            "backend",
            "trace_id",
            "auth",
            "subject",
        ] {
            assert!(!value[key].is_null(), "{key}");
        }
        assert_eq!(value["subject"], "alice \"a\"");
    }

    #[test]
    fn json_strings_that_need_escaping_are_escaped() {
        let mut l = line();
        l.path = Some("/a\"b\\c\u{1}d".into());
        l.authority = Some("host\twith-tab".into());
        let mut out = Vec::new();
        format_line(&mut out, &l, LogFormat::Json);
        let value: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(value["path"], "/a\"b\\c\u{1}d");
        assert_eq!(value["authority"], "host\twith-tab");
        assert_eq!(
            value["flags"],
            serde_json::json!(["connect_failure", "retried"])
        );
    }

    #[test]
    fn a_trail_sums_attempts_into_flags_and_the_last_backend() {
        let trail = Trail::new();
        trail.attempt(&Arc::from("a:1"));
        trail.flag(Flags::CONNECT_FAILURE);
        trail.attempt(&Arc::from("b:2"));
        trail.answered(Duration::from_micros(40));
        trail.add_bytes_in(10);
        let mut l = line();
        l.bytes_in = 0;
        l.flags = Flags::NONE;
        l.absorb(&trail);
        assert_eq!(l.attempts, 2);
        assert_eq!(l.backend.as_deref(), Some("b:2"));
        assert_eq!(l.bytes_in, 10);
        assert_eq!(l.upstream_time, Some(Duration::from_micros(40)));
        assert_eq!(
            l.flags.names().collect::<Vec<_>>(),
            ["connect_failure", "retried"]
        );
    }
}
