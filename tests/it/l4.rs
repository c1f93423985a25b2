//! L4 (DESIGN §16): TLS pass-through by SNI, the PROXY protocol both
//! ways, idle timeouts and connect retries on `tcp` listeners.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::harness::*;
use crate::pki::*;

/// Every name the pass-through tests use: each backend's certificate
/// covers them all, so that a name moved to another backend still
/// completes its handshake there.
const NAMES: [&str; 4] = [
    "db.example.com",
    "eu.db.example.com",
    "api.example.com",
    "other.example.com",
];

/// A TLS backend that greets each connection with `id` and a newline
/// once the handshake is done, then echoes.
pub(crate) async fn tls_identity_backend(ca: &Ca, id: &'static str) -> SocketAddr {
    let acceptor = backend_acceptor_for(ca, &NAMES, &[]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(stream).await else {
                    return;
                };
                if tls.write_all(format!("{id}\n").as_bytes()).await.is_err() {
                    return;
                }
                let mut buf = [0u8; 1024];
                while let Ok(n) = tls.read(&mut buf).await {
                    if n == 0 || tls.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

pub(crate) type Tls = BufReader<tokio_rustls::client::TlsStream<TcpStream>>;

/// A TLS connection to `name` through `addr`, and the backend's greeting;
/// `None` when the gateway closes it instead.
pub(crate) async fn connect_tls(addr: SocketAddr, ca: &Ca, name: &str) -> Option<(Tls, String)> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let server_name = rustls::pki_types::ServerName::try_from(name.to_owned()).unwrap();
    let tls = tokio::time::timeout(
        Duration::from_secs(5),
        connector(ca, &[]).connect(server_name, tcp),
    )
    .await
    .expect("handshake within 5 s")
    .ok()?;
    let mut tls = BufReader::new(tls);
    let mut greeting = String::new();
    tls.read_line(&mut greeting).await.ok()?;
    Some((tls, greeting.trim().to_owned()))
}

/// One echo round trip on an established pass-through connection.
async fn echo(tls: &mut Tls, text: &str) -> bool {
    let line = format!("{text}\n");
    if tls.get_mut().write_all(line.as_bytes()).await.is_err() {
        return false;
    }
    let mut back = String::new();
    matches!(
        tokio::time::timeout(Duration::from_secs(5), tls.read_line(&mut back)).await,
        Ok(Ok(_)) if back == line
    )
}

/// Reads until the gateway closes the connection; how long that took.
async fn closed_within(stream: &mut TcpStream, limit: Duration) -> Duration {
    let started = Instant::now();
    let mut buf = [0u8; 256];
    match tokio::time::timeout(limit, stream.read(&mut buf)).await {
        Ok(Ok(0)) | Ok(Err(_)) => started.elapsed(),
        Ok(Ok(_)) => panic!("the gateway sent bytes on a connection it should close"),
        Err(_) => panic!("still open after {limit:?}"),
    }
}

/// A configuration with metrics and a JSON access log, then `text`.
fn head(text: &str) -> String {
    Config::new()
        .metrics()
        .log("format = \"json\"\naccess = true\naccess_file = \"access.log\"")
        .text(text)
        .build()
}

/// A pass-through listener routing db, the *.db wildcard and api to
/// `routes` (in that order).
fn sni_config(routes: [&str; 3], backends: &[(&str, SocketAddr)]) -> String {
    let mut text = head(&format!(
        r#"[[listeners]]
name = "tls"
bind = "127.0.0.1:0"
protocol = "tcp"
client_hello_timeout = "1s"
sni_routes = [
  {{ hosts = ["db.example.com"], upstream = "{}" }},
  {{ hosts = ["*.db.example.com"], upstream = "{}" }},
  {{ hosts = ["api.example.com"], upstream = "{}" }},
]
"#,
        routes[0], routes[1], routes[2]
    ));
    for (name, addr) in backends {
        text.push_str(&format!(
            "\n[upstreams.{name}]\nbackends = [{{ addr = \"{addr}\" }}]\n"
        ));
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_routes_pass_tls_through_by_name_and_close_what_they_cannot_route() {
    let ca = ca("l4 test CA");
    let backends = [
        ("a", tls_identity_backend(&ca, "a").await),
        ("b", tls_identity_backend(&ca, "b").await),
        ("c", tls_identity_backend(&ca, "c").await),
    ];
    let gw = Gateway::start(&sni_config(["a", "b", "c"], &backends));
    let tls = gw.listener("tls");
    // Exact, wildcard, exact: the backend's own certificate and greeting
    // reach the client, so TLS went through untouched.
    for (name, id) in [
        ("db.example.com", "a"),
        ("eu.db.example.com", "b"),
        ("api.example.com", "c"),
    ] {
        let (mut stream, greeting) = connect_tls(tls, &ca, name).await.expect(name);
        assert_eq!(greeting, id, "{name}");
        assert!(echo(&mut stream, "hello").await, "{name}");
    }
    // A name no route takes, and no default: closed.
    assert!(connect_tls(tls, &ca, "other.example.com").await.is_none());
    // Not TLS: closed at the first byte.
    let mut plain = TcpStream::connect(tls).await.unwrap();
    plain
        .write_all(b"GET / HTTP/1.1\r\nHost: db.example.com\r\n\r\n")
        .await
        .unwrap();
    assert!(closed_within(&mut plain, Duration::from_secs(2)).await < Duration::from_secs(1));
    // Silent: closed after client_hello_timeout (1 s), not before.
    let mut silent = TcpStream::connect(tls).await.unwrap();
    let waited = closed_within(&mut silent, Duration::from_secs(5)).await;
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    // The access log names the server name and why each one ended.
    let lines = access_lines(&gw.path("access.log"), 6).await;
    let with_name = |name: &str| {
        lines
            .iter()
            .find(|l| l["authority"] == name)
            .unwrap_or_else(|| panic!("no line for {name}: {lines:?}"))
            .clone()
    };
    assert_eq!(with_name("db.example.com")["protocol"], "tcp");
    assert!(with_name("db.example.com")["backend"].is_string());
    let unknown = with_name("other.example.com");
    assert_eq!(unknown["flags"], Value::from(vec!["no_route"]), "{unknown}");
    let flags: Vec<&Value> = lines.iter().map(|l| &l["flags"]).collect();
    assert!(
        flags.contains(&&Value::from(vec!["protocol_error"]))
            && flags.contains(&&Value::from(vec!["header_timeout"])),
        "{flags:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pass_through_connections_keep_their_backend_across_activations() {
    let ca = ca("l4 test CA");
    let backends = [
        ("a", tls_identity_backend(&ca, "a").await),
        ("b", tls_identity_backend(&ca, "b").await),
        ("c", tls_identity_backend(&ca, "c").await),
    ];
    let first = sni_config(["a", "b", "c"], &backends);
    // db.example.com moves to b, and the wildcard to c.
    let second = sni_config(["b", "c", "a"], &backends);
    let gw = Gateway::start(&first);
    let tls = gw.listener("tls");
    let (mut pinned, greeting) = connect_tls(tls, &ca, "db.example.com").await.unwrap();
    assert_eq!(greeting, "a");
    assert_eq!(activate_status(&gw, &second).await, 200);
    // Opened before: still on a. Opened after: b.
    assert!(echo(&mut pinned, "still here").await);
    let (_, greeting) = connect_tls(tls, &ca, "db.example.com").await.unwrap();
    assert_eq!(greeting, "b");

    // 200 connections across the three names, then 100 activations
    // back and forth: every one still answers.
    let mut open = Vec::with_capacity(200);
    for i in 0..200 {
        let name = NAMES[i % 3];
        let (stream, _) = connect_tls(tls, &ca, name).await.expect(name);
        open.push(stream);
    }
    for i in 0..100 {
        let config = if i % 2 == 0 { &first } else { &second };
        assert_eq!(activate_status(&gw, config).await, 200);
    }
    for (i, stream) in open.iter_mut().enumerate() {
        assert!(
            echo(stream, &format!("round trip {i}")).await,
            "connection {i}"
        );
    }
    assert!(echo(&mut pinned, "and still").await);
}

/// A server that hands over everything its first connection sent until
/// it ends with `hello`.
async fn capture_server(bind: &str) -> (SocketAddr, tokio::sync::oneshot::Receiver<Vec<u8>>) {
    let listener = tokio::net::TcpListener::bind(bind).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 512];
        while !got.ends_with(b"hello") {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        let _ = tx.send(got);
    });
    (addr, rx)
}

/// What a PROXY header must be, written out by hand from the protocol's
/// specification (not by the code under test).
fn expected_header(version: &str, client: SocketAddr, local: SocketAddr) -> Vec<u8> {
    match version {
        "v1" => {
            let family = if client.is_ipv4() { "TCP4" } else { "TCP6" };
            format!(
                "PROXY {family} {} {} {} {}\r\n",
                client.ip(),
                local.ip(),
                client.port(),
                local.port()
            )
            .into_bytes()
        }
        _ => {
            let mut out = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
            out.push(0x21);
            match (client.ip(), local.ip()) {
                (std::net::IpAddr::V4(c), std::net::IpAddr::V4(l)) => {
                    out.extend([0x11, 0, 12]);
                    out.extend(c.octets());
                    out.extend(l.octets());
                }
                (std::net::IpAddr::V6(c), std::net::IpAddr::V6(l)) => {
                    out.extend([0x21, 0, 36]);
                    out.extend(c.octets());
                    out.extend(l.octets());
                }
                _ => unreachable!("same family in this test"),
            }
            out.extend(client.port().to_be_bytes());
            out.extend(local.port().to_be_bytes());
            out
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_header_to_the_upstream_is_byte_exact_for_v1_and_v2_over_ipv4_and_ipv6() {
    let ipv6 = std::net::TcpListener::bind("[::1]:0").is_ok();
    if !ipv6 {
        eprintln!("IPv6 loopback is not available here: testing IPv4 only");
    }
    let mut cases = vec![("v1", "127.0.0.1"), ("v2", "127.0.0.1")];
    if ipv6 {
        cases.extend([("v1", "[::1]"), ("v2", "[::1]")]);
    }
    let mut listeners = String::new();
    let mut upstreams = String::new();
    let mut captures = Vec::new();
    for (i, (version, host)) in cases.iter().enumerate() {
        let (addr, rx) = capture_server(&format!("{host}:0")).await;
        listeners.push_str(&format!(
            "[[listeners]]\nname = \"l{i}\"\nbind = \"{host}:0\"\nprotocol = \"tcp\"\nupstream = \"u{i}\"\n\n"
        ));
        upstreams.push_str(&format!(
            "[upstreams.u{i}]\nproxy_protocol = \"{version}\"\nbackends = [{{ addr = \"{addr}\" }}]\n\n"
        ));
        captures.push(rx);
    }
    let gw = Gateway::start(&head(&format!("{listeners}{upstreams}")));
    for (i, ((version, _), rx)) in cases.iter().zip(captures).enumerate() {
        let listener = gw.listener(&format!("l{i}"));
        let mut client = TcpStream::connect(listener).await.unwrap();
        let me = client.local_addr().unwrap();
        client.write_all(b"hello").await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), rx)
            .await
            .expect("the backend got the bytes")
            .unwrap();
        let mut expected = expected_header(version, me, listener);
        expected.extend_from_slice(b"hello");
        assert_eq!(
            got,
            expected,
            "{version} from {me} to {listener}: {:?}",
            String::from_utf8_lossy(&got)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_takes_the_client_address_from_a_trusted_proxy_header_only() {
    let (echo_addr, _echo) = echo_server().await;
    let http = echo_backend().await;
    let gw = Gateway::start(&head(&format!(
        r#"[[listeners]]
name = "tcp_in"
bind = "127.0.0.1:0"
protocol = "tcp"
upstream = "echo"
accept_proxy_protocol = true
trusted_proxies = ["127.0.0.1/32"]

[[listeners]]
name = "untrusted"
bind = "127.0.0.1:0"
protocol = "tcp"
upstream = "echo"
accept_proxy_protocol = true
trusted_proxies = ["10.0.0.0/8"]

[[listeners]]
name = "web"
bind = "127.0.0.1:0"
accept_proxy_protocol = true
trusted_proxies = ["127.0.0.1"]

[[routes]]
name = "all"
listeners = ["web"]
upstream = "app"

[upstreams.echo]
backends = [{{ addr = "{echo_addr}" }}]

[upstreams.app]
backends = [{{ addr = "{}" }}]
"#,
        http.addr
    )));
    // TCP, v1 from a trusted peer: relayed, and logged with the
    // carried address.
    let mut stream = TcpStream::connect(gw.listener("tcp_in")).await.unwrap();
    stream
        .write_all(b"PROXY TCP4 203.0.113.9 127.0.0.1 5555 80\r\nping")
        .await
        .unwrap();
    let mut back = [0u8; 4];
    stream.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"ping");
    drop(stream);
    // HTTP, v2 carrying an IPv6 client: X-Forwarded-For names it.
    let mut header = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    header.extend([0x21, 0x21, 0, 36]);
    header.extend(
        "2001:db8::7"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets(),
    );
    header.extend(std::net::Ipv6Addr::LOCALHOST.octets());
    header.extend(4444u16.to_be_bytes());
    header.extend(80u16.to_be_bytes());
    header.extend_from_slice(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let answer = raw_exchange(gw.listener("web"), &header).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer.contains("x-forwarded-for: 2001:db8::7\n"),
        "{answer}"
    );
    // A peer outside trusted_proxies: closed without a byte relayed.
    let mut untrusted = TcpStream::connect(gw.listener("untrusted")).await.unwrap();
    let _ = untrusted
        .write_all(b"PROXY TCP4 203.0.113.9 127.0.0.1 5555 80\r\nping")
        .await;
    closed_within(&mut untrusted, Duration::from_secs(2)).await;
    // A trusted peer that sends no header: closed.
    let mut bare = TcpStream::connect(gw.listener("tcp_in")).await.unwrap();
    bare.write_all(b"just the payload, no header\n")
        .await
        .unwrap();
    closed_within(&mut bare, Duration::from_secs(2)).await;

    let lines = access_lines(&gw.path("access.log"), 2).await;
    let clients: Vec<&str> = lines.iter().filter_map(|l| l["client"].as_str()).collect();
    assert!(clients.contains(&"203.0.113.9:5555"), "{clients:?}");
    assert!(clients.contains(&"[2001:db8::7]:4444"), "{clients:?}");
    let (_, _, text) = get(gw.metrics.expect("metrics"), "x", "/metrics").await;
    for (listener, outcome) in [
        ("tcp_in", "accepted"),
        ("untrusted", "untrusted"),
        ("tcp_in", "invalid"),
    ] {
        assert!(
            text.contains(&format!(
                "cutover_proxy_protocol_headers_total{{listener=\"{listener}\",outcome=\"{outcome}\"}} 1"
            )),
            "{listener} {outcome}:\n{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_end_busy_ones_do_not_and_a_dead_backend_is_skipped() {
    let (echo_addr, _echo) = echo_server().await;
    let gw = Gateway::start(&head(&format!(
        r#"[[listeners]]
name = "tcp"
bind = "127.0.0.1:0"
protocol = "tcp"
upstream = "flaky"
idle_timeout = "600ms"

[upstreams.flaky]
backends = [{{ addr = "{}" }}, {{ addr = "{echo_addr}" }}]
"#,
        refusing_addr()
    )));
    let tcp = gw.listener("tcp");
    // Every connection reaches the echo server, the dead backend's
    // refusals retried on the other.
    let mut connections = Vec::new();
    for _ in 0..6 {
        let mut stream = TcpStream::connect(tcp).await.unwrap();
        stream.write_all(b"x").await.unwrap();
        let mut one = [0u8; 1];
        stream.read_exact(&mut one).await.unwrap();
        connections.push(stream);
    }
    // One busy (a byte every 200 ms, one way is enough), one quiet.
    let mut busy = connections.pop().unwrap();
    let mut quiet = connections.pop().unwrap();
    drop(connections);
    let quiet_closed =
        tokio::spawn(async move { closed_within(&mut quiet, Duration::from_secs(5)).await });
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        busy.write_all(b"y").await.unwrap();
        let mut one = [0u8; 1];
        busy.read_exact(&mut one).await.unwrap();
    }
    let waited = quiet_closed.await.unwrap();
    assert!(
        waited >= Duration::from_millis(500) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
    drop(busy);
    let lines = access_lines(&gw.path("access.log"), 6).await;
    // Each connection's life is in the histogram (folded in within a
    // second of its end).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, _, text) = get(gw.metrics.expect("metrics"), "x", "/metrics").await;
        if text.contains("cutover_tcp_connection_duration_seconds_count{listener=\"tcp\"} 6\n") {
            break;
        }
        assert!(Instant::now() < deadline, "{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        lines.iter().any(|l| l["flags"]
            .as_array()
            .is_some_and(|f| f.contains(&Value::from("idle_timeout")))),
        "{lines:?}"
    );
    assert!(
        lines.iter().any(|l| {
            let flags = l["flags"].as_array().cloned().unwrap_or_default();
            flags.contains(&Value::from("retried"))
                && flags.contains(&Value::from("connect_failure"))
                && l["attempts"] == 2
        }),
        "{lines:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_cuts_tcp_connections_at_the_deadline_and_not_before() {
    let (echo_addr, _echo) = echo_server().await;
    let mut gw = Gateway::start(&head(&format!(
        "[runtime]\ndrain_timeout = \"2s\"\n\n[[listeners]]\nname = \"tcp\"\nbind = \"127.0.0.1:0\"\nprotocol = \"tcp\"\nupstream = \"echo\"\n\n[upstreams.echo]\nbackends = [{{ addr = \"{echo_addr}\" }}]\n"
    )));
    let mut stream = TcpStream::connect(gw.listener("tcp")).await.unwrap();
    let mut one = [0u8; 1];
    stream.write_all(b"a").await.unwrap();
    stream.read_exact(&mut one).await.unwrap();
    let signalled = Instant::now();
    gw.signal("TERM");
    // Round trips every 100 ms until the connection is cut.
    let cut = loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let alive = stream.write_all(b"z").await.is_ok()
            && matches!(
                tokio::time::timeout(Duration::from_secs(1), stream.read_exact(&mut one)).await,
                Ok(Ok(_))
            );
        if !alive {
            break signalled.elapsed();
        }
        assert!(signalled.elapsed() < Duration::from_secs(6), "never cut");
    };
    assert!(
        cut >= Duration::from_millis(1800) && cut < Duration::from_secs(4),
        "cut {cut:?} after SIGTERM, with drain_timeout 2s"
    );
    let exited = tokio::task::spawn_blocking(move || gw.wait_exit(Duration::from_secs(10)))
        .await
        .unwrap();
    assert!(exited.is_some(), "the process did not exit");
}

/// A UDP backend that answers each datagram with `id:` and the datagram.
pub(crate) async fn udp_echo(id: &'static str) -> SocketAddr {
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = [0u8; 2048];
        while let Ok((n, from)) = socket.recv_from(&mut buf).await {
            let answer = [format!("{id}:").as_bytes(), &buf[..n]].concat();
            let _ = socket.send_to(&answer, from).await;
        }
    });
    addr
}

/// Sends `text` from `client` to `to` and returns the answer.
async fn ask(client: &tokio::net::UdpSocket, to: SocketAddr, text: &str) -> String {
    client.send_to(text.as_bytes(), to).await.unwrap();
    let mut buf = [0u8; 2048];
    let (n, from) = tokio::time::timeout(Duration::from_secs(5), client.recv_from(&mut buf))
        .await
        .expect("an answer within 5 s")
        .unwrap();
    assert_eq!(from, to, "answered from the listener's address");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

fn udp_config(backends: &[SocketAddr]) -> String {
    let list: Vec<String> = backends
        .iter()
        .map(|b| format!("{{ addr = \"{b}\" }}"))
        .collect();
    head(&format!(
        "[[listeners]]\nname = \"dns\"\nbind = \"127.0.0.1:0\"\nprotocol = \"udp\"\nupstream = \"resolvers\"\nidle_timeout = \"1s\"\n\n[upstreams.resolvers]\nbackends = [{}]\n",
        list.join(", ")
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_sessions_keep_their_backend_activation_moves_new_ones_and_idle_ones_end() {
    let (a, b, c) = (
        udp_echo("a").await,
        udp_echo("b").await,
        udp_echo("c").await,
    );
    let gw = Gateway::start(&udp_config(&[a, b]));
    let dns = gw.listener("dns");
    let one = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let two = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    // Each client keeps one backend for its session; round-robin gave
    // them one each.
    let first_one = ask(&one, dns, "q0").await;
    let first_two = ask(&two, dns, "q0").await;
    let backend_of = |answer: &str| answer.split(':').next().unwrap().to_owned();
    let (one_backend, two_backend) = (backend_of(&first_one), backend_of(&first_two));
    assert_ne!(one_backend, two_backend);
    for i in 1..5 {
        assert_eq!(
            ask(&one, dns, &format!("q{i}")).await,
            format!("{one_backend}:q{i}")
        );
        assert_eq!(
            ask(&two, dns, &format!("q{i}")).await,
            format!("{two_backend}:q{i}")
        );
    }
    // An activation sends new sessions to c; the open one stays.
    assert_eq!(activate_status(&gw, &udp_config(&[c])).await, 200);
    assert_eq!(
        ask(&one, dns, "after").await,
        format!("{one_backend}:after")
    );
    let three = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    assert_eq!(ask(&three, dns, "new").await, "c:new");
    // Idle for longer than idle_timeout (1 s): the session ended, and the
    // client's next datagram opens one on the active generation.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert_eq!(ask(&one, dns, "later").await, "c:later");
    // One access-log line per ended session, with its bytes.
    let lines = access_lines(&gw.path("access.log"), 3).await;
    let me = one.local_addr().unwrap().to_string();
    let ended = lines
        .iter()
        .find(|l| l["client"] == me.as_str())
        .unwrap_or_else(|| panic!("no line for {me}: {lines:?}"));
    assert_eq!(ended["protocol"], "udp");
    assert_eq!(ended["generation"], 1);
    // "q0".."q4" and "after" in; each with "x:" prepended out.
    assert_eq!(ended["bytes_in"], 15);
    assert_eq!(ended["bytes_out"], 15 + 6 * 2);
    // Client one sent 7, two 5, three 1.
    let (_, _, text) = get(gw.metrics.expect("metrics"), "x", "/metrics").await;
    assert!(
        text.contains("cutover_udp_datagrams_total{listener=\"dns\",direction=\"downstream_to_upstream\"} 13\n"),
        "{text}"
    );
    assert!(
        text.contains("cutover_udp_sessions{listener=\"dns\"}"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_udp_listener_keeps_answering_through_a_drain_aware_upgrade() {
    let a = udp_echo("a").await;
    let mut gw = Gateway::start(&udp_config(&[a]));
    let dns = gw.listener("dns");
    let before = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    assert_eq!(ask(&before, dns, "one").await, "a:one");
    let op = crate::lifecycle::upgrade(&gw, None).await;
    assert_eq!(op["outcome"], "succeeded", "{op}");
    gw.adopted.push(op["pid"].as_u64().unwrap() as u32);
    // The new process took the socket over: same address, new clients
    // answered; the old client too (by whichever process has its
    // session, or a new one).
    assert_eq!(gw.status().await["pid"], op["pid"]);
    let after = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    for i in 0..5 {
        assert_eq!(ask(&after, dns, &format!("n{i}")).await, format!("a:n{i}"));
        assert_eq!(ask(&before, dns, &format!("o{i}")).await, format!("a:o{i}"));
    }
}

/// A raw HTTP/1.1 backend whose connections start with a PROXY v1 line:
/// each request is answered with that line as its body (keep-alive); an
/// upgrade request gets 101 and its bytes echoed. Counts connections.
async fn proxied_http_backend() -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = std::sync::Arc::clone(&connections);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut stream = BufReader::new(stream);
                let mut proxy_line = String::new();
                if stream.read_line(&mut proxy_line).await.is_err() {
                    return;
                }
                let proxy_line = proxy_line.trim_end().to_owned();
                loop {
                    let mut head = String::new();
                    loop {
                        let mut line = String::new();
                        match stream.read_line(&mut line).await {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {}
                        }
                        if line == "\r\n" {
                            break;
                        }
                        head.push_str(&line.to_ascii_lowercase());
                    }
                    if head.contains("upgrade: websocket") {
                        let answer = "HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n";
                        if stream.get_mut().write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                        let _ = stream
                            .get_mut()
                            .write_all(format!("{proxy_line}\n").as_bytes())
                            .await;
                        let mut buf = [0u8; 256];
                        while let Ok(n) = stream.read(&mut buf).await {
                            if n == 0 || stream.get_mut().write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                        return;
                    }
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{proxy_line}",
                        proxy_line.len()
                    );
                    if stream.get_mut().write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, connections)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_backends_get_a_proxy_header_per_client_and_never_share_its_connection() {
    use std::sync::atomic::Ordering;
    let (backend, connections) = proxied_http_backend().await;
    let gw = Gateway::start(&head(&format!(
        "[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n\n[[routes]]\nname = \"all\"\nlisteners = [\"web\"]\nupstream = \"app\"\n\n[upstreams.app]\nproxy_protocol = \"v1\"\nbackends = [{{ addr = \"{backend}\" }}]\n"
    )));
    let web = gw.listener("web");
    let expected = |client: SocketAddr| {
        format!(
            "PROXY TCP4 {} {} {} {}",
            client.ip(),
            web.ip(),
            client.port(),
            web.port()
        )
    };
    // Two requests from each of two clients, interleaved: each backend
    // connection serves the one client its header names.
    let mut clients = Vec::new();
    for _ in 0..2 {
        let stream = TcpStream::connect(web).await.unwrap();
        let me = stream.local_addr().unwrap();
        let sender = crate::harness::h1_over(stream).await.unwrap();
        clients.push((me, sender));
    }
    for round in 0..2 {
        for (me, sender) in &mut clients {
            use http_body_util::BodyExt;
            sender.ready().await.unwrap();
            let request = hyper::Request::get("/")
                .header("host", "x")
                .body(http_body_util::Empty::<bytes::Bytes>::new())
                .unwrap();
            let response = sender.send_request(request).await.unwrap();
            assert_eq!(response.status(), 200);
            let body = response.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(
                String::from_utf8_lossy(&body),
                expected(*me),
                "round {round}"
            );
        }
    }
    assert_eq!(
        connections.load(Ordering::SeqCst),
        2,
        "one backend connection per client, reused"
    );
    // A protocol upgrade goes on a connection of its own, with its header.
    let mut ws = TcpStream::connect(web).await.unwrap();
    let me = ws.local_addr().unwrap();
    ws.write_all(
        b"GET /chat HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n",
    )
    .await
    .unwrap();
    let mut ws = BufReader::new(ws);
    let mut status = String::new();
    ws.read_line(&mut status).await.unwrap();
    assert!(status.starts_with("HTTP/1.1 101"), "{status}");
    loop {
        let mut line = String::new();
        ws.read_line(&mut line).await.unwrap();
        if line == "\r\n" {
            break;
        }
    }
    let mut greeting = String::new();
    ws.read_line(&mut greeting).await.unwrap();
    assert_eq!(greeting.trim_end(), expected(me));
    ws.get_mut().write_all(b"ping\n").await.unwrap();
    let mut echoed = String::new();
    ws.read_line(&mut echoed).await.unwrap();
    assert_eq!(echoed, "ping\n");
}
