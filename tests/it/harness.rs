//! Test harness: the real `cutover` binary on ephemeral ports, and small
//! in-test backends. Nothing sleeps to synchronise: the gateway announces
//! readiness on stdout, and changes are awaited by polling the admin API
//! with a bounded deadline.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_cutover");

/// A running gateway process; killed when dropped.
pub struct Gateway {
    child: Child,
    pub dir: tempfile::TempDir,
    pub config_path: PathBuf,
    pub admin: SocketAddr,
    /// The metrics endpoint, when the configuration has one.
    pub metrics: Option<SocketAddr>,
    pub listeners: Vec<(String, SocketAddr)>,
    pub stderr: Arc<Mutex<String>>,
    /// Processes started by upgrades (not our children): killed on drop.
    pub adopted: Vec<u32>,
}

impl Gateway {
    /// Writes `config` into a fresh folder and starts the gateway on it.
    pub fn start(config: &str) -> Gateway {
        let dir = tempfile::tempdir().expect("temp dir");
        Self::start_in(dir, config)
    }

    pub fn start_in(dir: tempfile::TempDir, config: &str) -> Gateway {
        Self::start_binary(Path::new(BIN), dir, config)
    }

    /// As `start_in`, running the executable at `binary`.
    pub fn start_binary(binary: &Path, dir: tempfile::TempDir, config: &str) -> Gateway {
        Self::start_with(binary, dir, config, &[])
    }

    /// As `start`, with `extra` arguments after `run -c FILE`.
    pub fn start_args(config: &str, extra: &[&str]) -> Gateway {
        let dir = tempfile::tempdir().expect("temp dir");
        Self::start_args_in(dir, config, extra)
    }

    /// As `start_in`, with `extra` arguments after `run -c FILE`.
    pub fn start_args_in(dir: tempfile::TempDir, config: &str, extra: &[&str]) -> Gateway {
        Self::start_with(Path::new(BIN), dir, config, extra)
    }

    fn start_with(binary: &Path, dir: tempfile::TempDir, config: &str, extra: &[&str]) -> Gateway {
        Self::try_start_with(binary, dir, config, extra).unwrap_or_else(|e| panic!("{e}"))
    }

    /// As `start_in`, saying why the gateway did not become ready
    /// instead of panicking.
    pub fn try_start_in(dir: tempfile::TempDir, config: &str) -> Result<Gateway, String> {
        Self::try_start_with(Path::new(BIN), dir, config, &[])
    }

    fn try_start_with(
        binary: &Path,
        dir: tempfile::TempDir,
        config: &str,
        extra: &[&str],
    ) -> Result<Gateway, String> {
        let config_path = dir.path().join("gateway.toml");
        std::fs::write(&config_path, config).expect("write config");
        let mut command = Command::new(binary);
        command
            .args(["run", "-c"])
            .arg(&config_path)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // A binary a test has just written (an upgrade's new file) can be
        // "busy" for a moment: another test's child, forked while the
        // file was open for writing, holds that descriptor until it execs.
        let mut tries = 0;
        let mut child = loop {
            match command.spawn() {
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 100 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                spawned => break spawned.expect("spawn cutover"),
            }
        };
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&stderr);
        let err = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let mut s = sink.lock().unwrap();
                if s.len() < 4 << 20 {
                    s.push_str(&line);
                    s.push('\n');
                }
            }
        });
        let out = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(out).lines();
            while let Some(Ok(line)) = lines.next() {
                if line.contains("\"event\":\"ready\"") {
                    let _ = tx.send(line);
                }
            }
        });
        let line = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "gateway did not become ready:\n{}",
                    stderr.lock().unwrap()
                ));
            }
        };
        let ready: Value = serde_json::from_str(&line).expect("ready line is JSON");
        let admin = ready["admin"].as_str().unwrap().parse().unwrap();
        let metrics = ready["metrics"].as_str().map(|m| m.parse().unwrap());
        let listeners = ready["listeners"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                (
                    l["name"].as_str().unwrap().to_owned(),
                    l["address"].as_str().unwrap().parse().unwrap(),
                )
            })
            .collect();
        Ok(Gateway {
            child,
            dir,
            config_path,
            admin,
            metrics,
            listeners,
            stderr,
            adopted: Vec::new(),
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Pids of running processes whose command line names our config file.
    pub fn gateway_pids(&self) -> Vec<u32> {
        let needle = self.config_path.to_string_lossy().into_owned();
        let mut pids = Vec::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            let zombie = std::fs::read_to_string(entry.path().join("stat"))
                .map(|s| {
                    s.rsplit(')')
                        .next()
                        .is_some_and(|rest| rest.trim_start().starts_with('Z'))
                })
                .unwrap_or(true);
            if cmdline.contains(&needle) && cmdline.contains(" run ") && !zombie {
                pids.push(pid);
            }
        }
        pids.sort();
        pids
    }

    pub fn listener(&self, name: &str) -> SocketAddr {
        self.listeners
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| *a)
            .unwrap_or_else(|| panic!("no listener {name}"))
    }

    pub fn admin_url(&self) -> String {
        format!("http://{}", self.admin)
    }

    /// The names of the gateway's threads (`/proc/PID/task/*/comm`).
    pub fn threads(&self) -> Vec<String> {
        let tasks = format!("/proc/{}/task", self.child.id());
        std::fs::read_dir(tasks)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|task| std::fs::read_to_string(task.path().join("comm")).ok())
            .map(|name| name.trim().to_owned())
            .collect()
    }

    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Rewrites the configuration file (as an operator would before SIGHUP).
    pub fn write_config(&self, config: &str) {
        let tmp = self.dir.path().join("gateway.toml.new");
        std::fs::File::create(&tmp)
            .and_then(|mut f| f.write_all(config.as_bytes()))
            .expect("write");
        std::fs::rename(&tmp, &self.config_path).expect("rename");
    }

    pub async fn status(&self) -> Value {
        let req = Request::builder()
            .uri("/admin/runtime/status")
            .header("host", self.admin.to_string())
            .body(Full::new(Bytes::new()))
            .unwrap();
        if let Err(error) = send(self.admin, req).await {
            let exit = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))
                .unwrap_or_default();
            panic!(
                "admin unreachable ({error}); process stat: {exit}\ngateway log:\n{}",
                self.logs()
            );
        }
        let (status, body) =
            admin_request(self.admin, "GET", "/admin/runtime/status", None, None).await;
        assert_eq!(status, 200, "{body}");
        body
    }

    pub async fn active_generation(&self) -> u64 {
        self.status().await["active_generation"].as_u64().unwrap()
    }

    /// Waits (bounded) until generation `id` is active.
    pub async fn wait_generation(&self, id: u64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.active_generation().await < id {
            assert!(
                Instant::now() < deadline,
                "generation {id} never became active:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Resident memory in KiB (VmRSS) and its peak (VmHWM).
    pub fn memory_kib(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let field = |name: &str| {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        (field("VmRSS:"), field("VmHWM:"))
    }

    /// Resets the VmHWM peak so that it measures from now on.
    pub fn reset_peak(&self) {
        let _ = std::fs::write(format!("/proc/{}/clear_refs", self.child.id()), "5");
    }

    pub fn logs(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits for the process to exit, bounded; returns its exit code.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status.code();
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Pids are reused quickly here (pid_max is small): kill only a
        // process that is still one of ours, never whatever got its pid.
        let ours = self.gateway_pids();
        for pid in self.adopted.iter().filter(|p| ours.contains(p)) {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
    }
}

/// One HTTP/1.1 request on a fresh connection.
/// Activates `config` (TOML) through the admin API; the status code.
pub async fn activate_status(gw: &Gateway, config: &str) -> u16 {
    activate_with(gw, config, "").await.0
}

/// Activates `config` (TOML) with `query` (`""` or `?key=value&…`); the
/// status code and the answer.
pub async fn activate_with(gw: &Gateway, config: &str, query: &str) -> (u16, Value) {
    admin_request(
        gw.admin,
        "POST",
        &format!("/admin/runtime/activate{query}"),
        Some("application/toml"),
        Some(config.to_owned()),
    )
    .await
}

/// POSTs `body` as JSON to the admin API at `addr`.
pub async fn post_json(addr: SocketAddr, path: &str, body: Value) -> (u16, Value) {
    admin_request(
        addr,
        "POST",
        path,
        Some("application/json"),
        Some(body.to_string()),
    )
    .await
}

pub async fn admin_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: Option<String>,
) -> (u16, Value) {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    if let Some(ct) = content_type {
        req = req.header("content-type", ct);
    }
    let req = req
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .unwrap();
    let (status, _, bytes) = send(addr, req).await.expect("admin reachable");
    let value = serde_json::from_slice(&bytes)
        .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, value)
}

/// An HTTP/1.1 client connection over `stream` (TCP, TLS), its
/// connection driven on a task of its own: the handshake every test that
/// keeps a connection alive would otherwise write out.
pub async fn h1_over<S, B>(
    stream: S,
) -> Result<hyper::client::conn::http1::SendRequest<B>, hyper::Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

/// Sends one request on a new HTTP/1.1 connection; the response body is
/// left to read (or stream).
pub async fn try_open<B>(
    addr: SocketAddr,
    req: Request<B>,
) -> Result<hyper::Response<Incoming>, String>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    // Close with RST rather than leave TIME_WAIT behind: the suite makes
    // thousands of short connections to a handful of loopback ports.
    let _ = stream.set_zero_linger();
    let mut sender = h1_over(stream).await.map_err(|e| e.to_string())?;
    sender
        .send_request(req)
        .await
        .map_err(|e| format!("{e}: {:?}", std::error::Error::source(&e)))
}

/// `try_open`, for tests where failing to get a response is the failure.
pub async fn open<B>(addr: SocketAddr, req: Request<B>) -> hyper::Response<Incoming>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    try_open(addr, req).await.unwrap_or_else(|e| panic!("{e}"))
}

/// Sends one request on a new HTTP/1.1 connection and reads the whole answer.
pub async fn send(
    addr: SocketAddr,
    req: Request<Full<Bytes>>,
) -> Result<(u16, hyper::HeaderMap, Bytes), String> {
    let response = try_open(addr, req).await?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, headers, body))
}

/// Writes `bytes` on a new connection to `addr` and reads until the
/// gateway closes it (within 5 s); returns what it answered.
pub async fn raw_exchange(addr: SocketAddr, bytes: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer))
        .await
        .expect("the gateway answers and closes within 5 s")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// `cutover ctl --admin ADMIN ARGS…`, as a pipeline runs it: the exit
/// code, stdout and stderr.
pub fn ctl(admin: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(BIN)
        .args(["ctl", "--admin", admin])
        .args(args)
        .output()
        .expect("run cutover ctl");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `method path` with `Host: api.test` and `headers`, on a new
/// connection; the status, headers and body as text.
pub async fn request_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, hyper::HeaderMap, String) {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "api.test");
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let (status, headers, body) = send(addr, req.body(Full::new(Bytes::new())).unwrap())
        .await
        .expect("gateway answers");
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

/// The gateway's `/metrics` text.
pub async fn scrape(gw: &Gateway) -> String {
    let (status, _, text) = get(gw.metrics.expect("metrics endpoint"), "x", "/metrics").await;
    assert_eq!(status, 200);
    text
}

/// The sum of the series of `name` whose labels include each of `labels`.
pub fn sample(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|label| l.contains(label)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `POST /admin/runtime/reload-certs` with every listener.
pub async fn reload_certs(gw: &Gateway) -> (u16, Value) {
    admin_request(
        gw.admin,
        "POST",
        "/admin/runtime/reload-certs",
        Some("application/json"),
        Some("{}".into()),
    )
    .await
}

/// Loads `url` in headless Chromium (a fresh profile, 5 s of virtual
/// time for the page's fetches) and returns what it printed: the DOM.
/// Virtual time stands still while a request is open, so a page that
/// follows a stream must be loaded without it (the console's `?poll`).
pub async fn headless_dom(chromium: PathBuf, url: String) -> std::process::Output {
    let profile = tempfile::tempdir().unwrap();
    tokio::task::spawn_blocking(move || {
        Command::new(chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("--virtual-time-budget=5000")
            .arg("--dump-dom")
            .arg(&url)
            .output()
            .expect("run chromium")
    })
    .await
    .unwrap()
}

/// A gateway whose one route (on listener `web`) answers `body`.
pub fn answering(body: &str) -> String {
    config(&format!(
        "[[routes]]\nname = \"all\"\nlisteners = [\"web\"]\nrespond = {{ body = \"{body}\" }}\n"
    ))
}

/// GET `path` with `headers` on a new connection.
pub async fn get_with(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, hyper::HeaderMap, String) {
    request_with(addr, "GET", path, headers).await
}

/// GET `path` with `Host: host` on a new connection.
pub async fn get(addr: SocketAddr, host: &str, path: &str) -> (u16, hyper::HeaderMap, String) {
    let req = Request::builder()
        .uri(path)
        .header("host", host)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (status, headers, body) = send(addr, req).await.expect("gateway reachable");
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

/// What an in-test backend does with a request.
pub type Handler = Arc<dyn Fn(Request<Incoming>) -> futures_boxed::BoxResponse + Send + Sync>;

pub mod futures_boxed {
    use std::future::Future;
    use std::pin::Pin;

    use bytes::Bytes;
    use http_body_util::combinators::BoxBody;

    pub type Body = BoxBody<Bytes, std::io::Error>;
    pub type BoxResponse = Pin<Box<dyn Future<Output = hyper::Response<Body>> + Send>>;
}

pub use futures_boxed::Body as BackendBody;

pub fn full(body: impl Into<Bytes>) -> BackendBody {
    Full::new(body.into())
        .map_err(|never| match never {})
        .boxed()
}

/// An HTTP/1.1 backend on an ephemeral loopback port.
pub struct Backend {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Backend {
    pub async fn start(handler: Handler) -> Backend {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::serve(listener, handler)
    }

    /// On `addr` (another loopback address, a given port), if it is free.
    pub async fn start_at(addr: SocketAddr, handler: Handler) -> Option<Backend> {
        let listener = tokio::net::TcpListener::bind(addr).await.ok()?;
        Some(Self::serve(listener, handler))
    }

    fn serve(listener: tokio::net::TcpListener, handler: Handler) -> Backend {
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let handler = Arc::clone(&handler);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let fut = handler(req);
                        async move { Ok::<_, std::convert::Infallible>(fut.await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .with_upgrades()
                        .await;
                });
            }
        });
        Backend { addr, task }
    }

    /// Answers every request with `name` as the body.
    pub async fn named(name: &'static str) -> Backend {
        Backend::start(Arc::new(move |_req| {
            Box::pin(async move { hyper::Response::new(full(name)) })
        }))
        .await
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Answers every request 500 with `broken` as the body.
pub async fn failing_backend() -> Backend {
    Backend::start(Arc::new(|_req| {
        Box::pin(async move {
            let mut response = hyper::Response::new(full("broken"));
            *response.status_mut() = hyper::StatusCode::INTERNAL_SERVER_ERROR;
            response
        })
    }))
    .await
}

/// Echoes method, path, selected request headers and the body.
pub async fn echo_backend() -> Backend {
    Backend::start(Arc::new(|req: Request<hyper::body::Incoming>| {
        Box::pin(async move {
            let mut head = format!("{} {}\n", req.method(), req.uri());
            let mut names: Vec<_> = req
                .headers()
                .keys()
                .map(|k| k.as_str().to_owned())
                .collect();
            names.sort();
            for name in names {
                let values: Vec<_> = req
                    .headers()
                    .get_all(&name)
                    .iter()
                    .map(|v| v.to_str().unwrap_or("?").to_owned())
                    .collect();
                head.push_str(&format!("{name}: {}\n", values.join(",")));
            }
            let body = req
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            head.push('\n');
            let mut out = head.into_bytes();
            out.extend_from_slice(&body);
            let mut response = hyper::Response::new(full(out));
            response
                .headers_mut()
                .insert("keep-alive", "timeout=5".parse().unwrap());
            response
                .headers_mut()
                .insert("proxy-authenticate", "Basic".parse().unwrap());
            response
                .headers_mut()
                .insert("x-backend", "echo".parse().unwrap());
            response
        })
    }))
    .await
}

/// A TCP echo server on loopback.
pub async fn echo_server() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = stream.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    (addr, task)
}

/// A loopback address nothing listens on now, on TCP or UDP, free to
/// bind later: for a peer or a gateway that must be told its port before
/// it binds (for an upstream that must refuse, `refusing_addr`).
///
/// The port comes from just below the kernel's ephemeral range, never from
/// a bind to port 0. A port-0 bind draws from the same range as every
/// outgoing connection's local port, so between reading such a port and
/// binding it, any test's connection could take it (an ACME test's
/// gateway once failed "Address already in use" so). Below the range only
/// an explicit bind takes a port, and this test binary hands each out once.
pub fn closed_port() -> SocketAddr {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(32768);
    let span = low.saturating_sub(1024).min(10_000);
    // Two test binaries at once start at different places.
    let start = u64::from(std::process::id()) * 7919;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (low - 1 - (start + n) % span) as u16;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let free =
            std::net::TcpListener::bind(addr).is_ok() && std::net::UdpSocket::bind(addr).is_ok();
        if free {
            return addr;
        }
    }
    // An ephemeral range that starts too low to leave room below it.
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free loopback port")
}

/// An address that refuses connections for the test binary's life: a
/// socket bound there and never listening. (A port read from a dropped
/// listener, as `closed_port` gives for binding later, was once taken by
/// another test's server meanwhile: 403 where 502 was expected.)
pub fn refusing_addr() -> SocketAddr {
    static RESERVED: Mutex<Vec<tokio::net::TcpSocket>> = Mutex::new(Vec::new());
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
    let addr = socket.local_addr().unwrap();
    RESERVED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(socket);
    addr
}

/// The one way tests write a configuration: the admin API on port 0 and
/// a quiet log first, then what the test adds, in order. Every listener
/// binds port 0 (read the address back with `Gateway::listener`).
#[derive(Default)]
pub struct Config {
    metrics: bool,
    log: String,
    runtime: String,
    sections: Vec<String>,
}

impl Config {
    pub fn new() -> Self {
        Self::default()
    }

    /// A metrics listener on port 0 (`Gateway::metrics`).
    pub fn metrics(mut self) -> Self {
        self.metrics = true;
        self
    }

    /// Lines for `[log]`, after `level = "warn"`.
    pub fn log(mut self, lines: &str) -> Self {
        self.log.push_str(lines.trim_end());
        self.log.push('\n');
        self
    }

    /// Lines for `[runtime]`.
    pub fn runtime(mut self, lines: &str) -> Self {
        self.runtime.push_str(lines.trim_end());
        self.runtime.push('\n');
        self
    }

    pub fn listener(self, name: &str, lines: &str) -> Self {
        self.text(&format!(
            "[[listeners]]\nname = \"{name}\"\nbind = \"127.0.0.1:0\"\n{lines}"
        ))
    }

    pub fn route(self, name: &str, lines: &str) -> Self {
        self.text(&format!("[[routes]]\nname = \"{name}\"\n{lines}"))
    }

    pub fn upstream(self, name: &str, backends: &[SocketAddr], lines: &str) -> Self {
        let list: Vec<String> = backends
            .iter()
            .map(|b| format!("{{ addr = \"{b}\" }}"))
            .collect();
        self.text(&format!(
            "[upstreams.{name}]\nbackends = [{}]\n{lines}",
            list.join(", ")
        ))
    }

    /// Anything else (a section, routes written out), as given.
    pub fn text(mut self, text: &str) -> Self {
        self.sections.push(text.trim_end().to_owned());
        self
    }

    pub fn build(self) -> String {
        let mut out = String::from("[admin]\nbind = \"127.0.0.1:0\"\n\n");
        if self.metrics {
            out.push_str("[metrics]\nbind = \"127.0.0.1:0\"\n\n");
        }
        out.push_str("[log]\nlevel = \"warn\"\n");
        out.push_str(&self.log);
        if !self.runtime.is_empty() {
            out.push_str("\n[runtime]\n");
            out.push_str(&self.runtime);
        }
        for section in &self.sections {
            out.push('\n');
            out.push_str(section);
            out.push('\n');
        }
        out
    }
}

/// A minimal configuration: one `web` listener, routes as given.
pub fn config(body: &str) -> String {
    Config::new().listener("web", "").text(body).build()
}

/// A configuration routing everything on `web` to one backend.
pub fn proxy_config(backend: SocketAddr, extra: &str) -> String {
    Config::new()
        .listener("web", "")
        .route(
            "all",
            &format!("listeners = [\"web\"]\nupstream = \"app\"\n{extra}"),
        )
        .upstream("app", &[backend], "")
        .build()
}

/// Writes each `(name, text)` into `dir` readable by its owner only, as a
/// token or secret file must be.
pub fn write_secrets(dir: &Path, files: &[(&str, &str)]) {
    use std::os::unix::fs::PermissionsExt;
    for (name, text) in files {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
}

pub fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A body of `left` bytes produced in 64 KiB chunks as it is read, so a
/// test can send or serve 100 MiB without holding it.
pub struct Generated {
    left: u64,
    chunk: Bytes,
}

impl Generated {
    pub fn new(total: u64) -> Self {
        Self {
            left: total,
            chunk: Bytes::from(vec![b'x'; 64 * 1024]),
        }
    }
}

impl hyper::body::Body for Generated {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, std::io::Error>>> {
        if self.left == 0 {
            return std::task::Poll::Ready(None);
        }
        let n = self.left.min(self.chunk.len() as u64) as usize;
        self.left -= n as u64;
        let data = self.chunk.slice(..n);
        std::task::Poll::Ready(Some(Ok(hyper::body::Frame::data(data))))
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.left)
    }
}

/// Keep-alive clients that send `GET /` back to back on one connection
/// each until stopped. Any failed request, non-2xx answer, body outside
/// `expected`, or connection closed by the gateway fails its client.
pub struct KeepAliveLoad {
    stop: Arc<std::sync::atomic::AtomicBool>,
    answered: Arc<std::sync::atomic::AtomicU64>,
    clients: Vec<tokio::task::JoinHandle<Result<std::collections::HashSet<Bytes>, String>>>,
}

impl KeepAliveLoad {
    pub fn start(
        addr: SocketAddr,
        connections: usize,
        expected: &'static [&'static str],
    ) -> KeepAliveLoad {
        use std::sync::atomic::Ordering;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let answered = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let clients = (0..connections)
            .map(|_| {
                let (stop, answered) = (Arc::clone(&stop), Arc::clone(&answered));
                tokio::spawn(async move {
                    let stream = tokio::net::TcpStream::connect(addr)
                        .await
                        .map_err(|e| e.to_string())?;
                    let (mut sender, conn) =
                        hyper::client::conn::http1::handshake(TokioIo::new(stream))
                            .await
                            .map_err(|e| e.to_string())?;
                    let conn = tokio::spawn(conn);
                    let mut seen = std::collections::HashSet::new();
                    while !stop.load(Ordering::Relaxed) {
                        let req = Request::builder()
                            .uri("/")
                            .header("host", "a")
                            .body(Full::new(Bytes::new()))
                            .unwrap();
                        let response = sender
                            .send_request(req)
                            .await
                            .map_err(|e| format!("request failed: {e}"))?;
                        let status = response.status();
                        let body = response
                            .into_body()
                            .collect()
                            .await
                            .map_err(|e| e.to_string())?
                            .to_bytes();
                        if !status.is_success() || !expected.iter().any(|e| body == e.as_bytes()) {
                            return Err(format!("unexpected answer {status} {body:?}"));
                        }
                        seen.insert(body);
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                    drop(sender);
                    let _ = conn.await;
                    Ok(seen)
                })
            })
            .collect();
        KeepAliveLoad {
            stop,
            answered,
            clients,
        }
    }

    pub fn answered(&self) -> u64 {
        self.answered.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stops every client; per client, the distinct bodies it saw, or
    /// what went wrong.
    pub async fn stop(self) -> Vec<Result<std::collections::HashSet<Bytes>, String>> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut out = Vec::new();
        for client in self.clients {
            out.push(client.await.unwrap_or_else(|e| Err(e.to_string())));
        }
        out
    }
}

/// What a [`FaultProxy`] does to the traffic it relays.
#[derive(Debug, Clone, Copy)]
pub enum Fault {
    /// Holds the response this long before its first byte.
    Latency(Duration),
    /// Relays the response at most this many bytes a second.
    Bandwidth(usize),
    /// Relays this many response bytes, then resets both connections.
    ResetAfter(usize),
    /// Relays the request, never a byte of the response.
    Blackhole,
    /// Answers a line that is not HTTP instead of the response.
    GarbageHead,
    /// Answers a response head larger than any proxy accepts (70 KiB).
    OversizedHead,
    /// Accepts the connection and never reads from it.
    NeverReads,
}

/// A TCP proxy in front of a backend that misbehaves as told: the
/// upstream faults of the abuse suite, between the gateway and a real
/// backend.
pub struct FaultProxy {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    pub async fn start(upstream: SocketAddr, fault: Fault) -> FaultProxy {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    continue;
                };
                tokio::spawn(async move {
                    if let Fault::NeverReads = fault {
                        tokio::time::sleep(Duration::from_secs(60)).await;
                        return;
                    }
                    let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (mut client_read, mut client_write) = client.split();
                    let (mut server_read, mut server_write) = server.into_split();
                    let upload = async {
                        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
                    };
                    let download = async {
                        let mut buf = vec![0u8; 16 * 1024];
                        let mut relayed = 0usize;
                        let mut first = true;
                        loop {
                            let n = match server_read.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            let mut chunk = buf.get(..n).unwrap_or(&[]).to_vec();
                            match fault {
                                Fault::Latency(delay) if first => tokio::time::sleep(delay).await,
                                Fault::Blackhole => continue,
                                Fault::GarbageHead => {
                                    let _ = client_write
                                        .write_all(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
                                        .await;
                                    break;
                                }
                                Fault::OversizedHead if first => {
                                    let mut head = b"HTTP/1.1 200 OK\r\nx-big: ".to_vec();
                                    head.extend(std::iter::repeat_n(b'a', 70 * 1024));
                                    head.extend_from_slice(b"\r\ncontent-length: 0\r\n\r\n");
                                    let _ = client_write.write_all(&head).await;
                                    break;
                                }
                                Fault::ResetAfter(limit) => {
                                    chunk.truncate(limit.saturating_sub(relayed));
                                }
                                _ => {}
                            }
                            first = false;
                            if let Fault::Bandwidth(rate) = fault {
                                for piece in chunk.chunks((rate / 20).max(1)) {
                                    if client_write.write_all(piece).await.is_err() {
                                        return;
                                    }
                                    tokio::time::sleep(Duration::from_millis(50)).await;
                                }
                            } else if client_write.write_all(&chunk).await.is_err() {
                                return;
                            }
                            relayed += chunk.len();
                            if matches!(fault, Fault::ResetAfter(limit) if relayed >= limit) {
                                break;
                            }
                        }
                    };
                    // Whichever direction ends first ends the connection.
                    tokio::select! {
                        _ = upload => {}
                        _ = download => {}
                        _ = tokio::time::sleep(Duration::from_secs(60)) => {}
                    }
                    if let Fault::ResetAfter(_) = fault {
                        // A reset, not an orderly close. With a zero linger
                        // the close does not block: it sends RST at once.
                        #[allow(deprecated)]
                        let _ = client.set_linger(Some(Duration::ZERO));
                    }
                });
            }
        });
        FaultProxy { addr, task }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Waits until the access log at `path` has at least `n` lines; returns
/// them parsed (JSON format).
pub async fn access_lines(path: &std::path::Path, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        if lines.len() >= n {
            return lines;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {n} access lines after 10 s:\n{text}",
            lines.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
