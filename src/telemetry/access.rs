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
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use http::{HeaderValue, Method};

use crate::plan::{LogFormat, LogSpec};

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

    /// Names in output order.
    const NAMES: [(Flags, &'static str); 12] = [
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
    attempts: AtomicU32,
    flags: AtomicU32,
    /// Microseconds from the last answered attempt's start to its head.
    upstream_us: AtomicU64,
    /// The last backend an attempt went to.
    backend: Mutex<Option<Arc<str>>>,
}

impl Trail {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn add_bytes_in(&self, n: usize) {
        self.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
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

    pub fn flag(&self, flags: Flags) {
        self.flags.fetch_or(flags.0, Ordering::Relaxed);
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
    pub authority: Option<HeaderValue>,
    /// The path as routed (normalized), without the query.
    pub path: Option<String>,
    pub route: Option<Arc<str>>,
    /// 0 for a TCP connection.
    pub status: u16,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub upstream_time: Option<Duration>,
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
    /// Takes what the request's trail collected.
    pub fn absorb(&mut self, trail: &Trail) {
        self.bytes_in += trail.bytes_in.load(Ordering::Relaxed);
        self.attempts = trail.attempts.load(Ordering::Relaxed);
        self.flags |= Flags(trail.flags.load(Ordering::Relaxed));
        if self.attempts > 1 {
            self.flags |= Flags::RETRIED;
        }
        let us = trail.upstream_us.load(Ordering::Relaxed);
        self.upstream_time = (us > 0).then(|| Duration::from_micros(us));
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

/// Lines the writer may be behind by before new ones are dropped.
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

/// Starts the writer for the process (once; later calls change nothing).
/// The file is `log.access_file`, else `log.file`, else stderr.
pub fn init(spec: &LogSpec) -> io::Result<()> {
    if SINK.get().is_some() {
        return Ok(());
    }
    let path = spec.access_file.clone().or_else(|| spec.file.clone());
    let output = Output::open(path)?;
    let (queue, lines) = mpsc::sync_channel(QUEUE);
    let format = spec.format;
    std::thread::Builder::new()
        .name("cutover-access".into())
        .spawn(move || write_lines(lines, output, format))?;
    let _ = SINK.set(Sink { queue });
    set_enabled(spec.access);
    Ok(())
}

/// Turns access lines on or off (`log.access` is live).
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether requests should build lines at all.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Queues a line; drops and counts it when the writer is behind.
pub fn emit(line: Line) {
    let Some(sink) = SINK.get() else { return };
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

/// The writer thread: formats lines in batches, writes each batch once.
fn write_lines(lines: Receiver<Message>, mut output: Output, format: LogFormat) {
    let mut batch = Vec::with_capacity(BATCH);
    let mut waiting: Vec<mpsc::Sender<()>> = Vec::new();
    let mut failed_at: Option<std::time::Instant> = None;
    while let Ok(first) = lines.recv() {
        let mut next = Some(first);
        while let Some(message) = next.take() {
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
            next = lines.try_recv().ok();
        }
        flush_batch(&mut output, &mut batch, &mut failed_at);
        for done in waiting.drain(..) {
            let _ = done.send(());
        }
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
/// or JSON, and a newline.
pub fn format_line(out: &mut Vec<u8>, line: &Line, format: LogFormat) {
    let start = line.ended.checked_sub(line.duration).unwrap_or(line.ended);
    let time = humantime::format_rfc3339_millis(start).to_string();
    let method = line.method.as_ref().map(Method::as_str);
    let authority = line
        .authority
        .as_ref()
        .map(|a| String::from_utf8_lossy(a.as_bytes()));
    let trace_id = line.trace_id.map(|id| {
        let mut text = String::with_capacity(32);
        super::trace::push_hex(&mut text, &id);
        text
    });
    let millis = |d: Duration| (d.as_micros() as f64) / 1000.0;
    match format {
        LogFormat::Json => {
            let record = serde_json::json!({
                "time": time,
                "target": "cutover::access",
                "listener": &*line.listener,
                "generation": line.generation,
                "protocol": line.protocol,
                "client": line.client.to_string(),
                "method": method,
                "authority": authority,
                "path": line.path,
                "route": line.route.as_deref(),
                "status": line.status,
                "bytes_in": line.bytes_in,
                "bytes_out": line.bytes_out,
                "duration_ms": millis(line.duration),
                "upstream_ms": line.upstream_time.map(millis),
                "backend": line.backend.as_deref(),
                "attempts": line.attempts,
                "trace_id": trace_id,
                "flags": line.flags.names().collect::<Vec<_>>(),
            });
            let _ = serde_json::to_writer(&mut *out, &record);
        }
        LogFormat::Text => {
            let dash = "-";
            let flags = if line.flags.is_empty() {
                dash.to_owned()
            } else {
                line.flags.names().collect::<Vec<_>>().join(",")
            };
            let fields: [(&str, &str); 8] = [
                ("time", &time),
                ("listener", &line.listener),
                ("protocol", line.protocol),
                ("client", &line.client.to_string()),
                ("method", method.unwrap_or(dash)),
                ("authority", authority.as_deref().unwrap_or(dash)),
                ("path", line.path.as_deref().unwrap_or(dash)),
                ("route", line.route.as_deref().unwrap_or(dash)),
            ];
            for (i, (key, value)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push(b' ');
                }
                push_field(out, key, value);
            }
            let _ = write!(
                out,
                " generation={} status={} bytes_in={} bytes_out={} duration_ms={:.3}",
                line.generation,
                line.status,
                line.bytes_in,
                line.bytes_out,
                millis(line.duration)
            );
            match line.upstream_time {
                Some(t) => {
                    let _ = write!(out, " upstream_ms={:.3}", millis(t));
                }
                None => out.extend_from_slice(b" upstream_ms=-"),
            }
            out.push(b' ');
            push_field(out, "backend", line.backend.as_deref().unwrap_or(dash));
            let _ = write!(out, " attempts={} ", line.attempts);
            push_field(out, "trace_id", trace_id.as_deref().unwrap_or(dash));
            out.push(b' ');
            push_field(out, "flags", &flags);
        }
    }
    out.push(b'\n');
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

    fn line() -> Line {
        Line {
            ended: SystemTime::UNIX_EPOCH + Duration::from_millis(1_764_513_084_123),
            duration: Duration::from_micros(1_500),
            protocol: "HTTP/1.1",
            listener: "web".into(),
            generation: 7,
            client: "127.0.0.1:5555".parse().unwrap(),
            method: Some(Method::GET),
            authority: Some(HeaderValue::from_static("api.example.com")),
            path: Some("/v1/a b".into()),
            route: Some("api".into()),
            status: 502,
            bytes_in: 3,
            bytes_out: 12,
            upstream_time: None,
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
             method=GET authority=api.example.com path=\"/v1/a b\" route=api generation=7 \
             status=502 bytes_in=3 bytes_out=12 duration_ms=1.500 upstream_ms=- \
             backend=127.0.0.1:9001 attempts=2 trace_id=abababababababababababababababab \
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
        l.flags = Flags::NONE;
        format_line(&mut out, &l, LogFormat::Json);
        assert_eq!(out.last(), Some(&b'\n'));
        let value: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(value["time"], "2025-11-30T14:31:24.121Z");
        assert_eq!(value["target"], "cutover::access");
        assert_eq!(value["path"], "/v1/a b");
        assert_eq!(value["status"], 502);
        assert_eq!(value["upstream_ms"], 0.25);
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
        ] {
            assert!(!value[key].is_null(), "{key}");
        }
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
