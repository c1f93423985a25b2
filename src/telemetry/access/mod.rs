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
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, SystemTime};

use http::Method;

use super::{LogFormat, LogSpec};

mod format;

pub use format::{format_line, push_ip};

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
    /// Still open when the drain deadline (`drain_timeout`) passed, and
    /// ended then (a WebSocket with a close 1001 both ways).
    pub const DRAIN_TIMEOUT: Flags = Flags(1 << 16);

    /// Names in output order.
    const NAMES: [(Flags, &'static str); 17] = [
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
        (Flags::DRAIN_TIMEOUT, "drain_timeout"),
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
    /// What the route's web application firewall did:
    /// `MODE:OUTCOME:score=N:rules=ID,…`.
    pub waf: Option<String>,
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
            waf: None,
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
    pub fn tunnelled(&mut self, sent: u64, received: u64, flags: Flags) {
        if let Some(line) = self.line.as_mut() {
            line.bytes_in += sent;
            line.bytes_out += received;
            line.flags |= flags;
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
/// queue holds memory only for the lines in it (a list of small blocks),
/// and it starts only once lines are wanted: see [`start`].
const QUEUE: usize = 16 * 1024;
/// A batch is written once it is this long, or the queue is empty.
const BATCH: usize = 64 * 1024;

// Lines travel boxed in an unbounded list channel, bounded by `queued`: a
// bounded channel writes every slot when it is made (7 MiB resident for
// lines by value, 0.5 MiB boxed), and list blocks of lines by value were
// zeroed per request (docs/performance.md, "Idle memory").
enum Message {
    Line(Box<Line>),
    Reopen,
    Flush(mpsc::Sender<()>),
}

struct Sink {
    queue: Sender<Message>,
    /// Lines sent and not yet taken by the writer.
    queued: Arc<AtomicUsize>,
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
    let (queue, lines) = mpsc::channel();
    let queued = Arc::new(AtomicUsize::new(0));
    let taken = Arc::clone(&queued);
    let spawned = std::thread::Builder::new()
        .name("cutover-access".into())
        .spawn(move || write_lines(lines, &taken, output, format));
    match spawned {
        Ok(_) => {
            let _ = SINK.set(Sink { queue, queued });
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
    if sink.queued.fetch_add(1, Ordering::Relaxed) >= QUEUE {
        sink.queued.fetch_sub(1, Ordering::Relaxed);
        dropped(1);
        return;
    }
    if sink.queue.send(Message::Line(Box::new(line))).is_err() {
        sink.queued.fetch_sub(1, Ordering::Relaxed);
        dropped(1);
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
fn write_lines(
    lines: Receiver<Message>,
    queued: &AtomicUsize,
    mut output: Output,
    format: LogFormat,
) {
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
                    queued.fetch_sub(1, Ordering::Relaxed);
                    if line.logged {
                        format_line(&mut batch, &line, format);
                    }
                    if line.sampled {
                        if let Some(export) = SAMPLED.get() {
                            export(&line);
                        }
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

/// Where the lines of sampled requests go as spans (the OTLP exporter,
/// which registers itself: this file knows nothing of it).
static SAMPLED: std::sync::OnceLock<fn(&Line)> = std::sync::OnceLock::new();

/// Sends every sampled request's line to `export` as well (once per
/// process).
pub fn export_sampled(export: fn(&Line)) {
    let _ = SAMPLED.set(export);
}

#[cfg(test)]
mod tests {
    use super::format::tests::line;
    use super::*;

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
