//! Route authentication (DESIGN §19) through the real binary, with
//! artefacts from other implementations: users files made by `htpasswd
//! -B` (apache2-utils) and tokens and JWKS made by PyJWT (python3-jwt);
//! `.ci/run` installs both. A test whose tool is absent says so and
//! skips.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use serde_json::Value;

use crate::harness::*;

fn tool(path: &str, package: &str) -> bool {
    let present = Path::new(path).exists();
    if !present {
        eprintln!("skipped: {path} is absent (Debian package {package}; .ci/run installs it)");
    }
    present
}

fn htpasswd(file: &Path, user: &str, password: &str, scheme: &str) {
    let mut args = vec!["-b", scheme];
    if !file.exists() {
        args.insert(0, "-c");
    }
    let status = Command::new("/usr/bin/htpasswd")
        .args(&args)
        .arg(file)
        .args([user, password])
        .output()
        .expect("htpasswd runs");
    assert!(status.status.success(), "{status:?}");
}

fn basic(user: &str, password: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// A header's value in the echo backend's answer.
fn echoed<'a>(body: &'a str, name: &str) -> Option<&'a str> {
    body.lines()
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_once(": "))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v)
}

fn basic_config(backend: SocketAddr) -> String {
    Config::new()
        .metrics()
        .log("access = true\naccess_file = \"access.log\"\nformat = \"json\"")
        .listener(
            "web",
            r#"defaults = { auth = { basic = { users_file = "users.htpasswd", realm = "ops" } } }"#,
        )
        .route(
            "health",
            "listeners = [\"web\"]\npath_exact = \"/healthz\"\nauth = \"none\"\nrespond = { status = 200, body = \"ok\" }",
        )
        .route("api", "listeners = [\"web\"]\npath_prefix = \"/\"\nupstream = \"app\"")
        .upstream("app", &[backend], "")
        .build()
}

pub(crate) fn argon2id(password: &str) -> String {
    use argon2::PasswordHasher as _;
    argon2::Argon2::default()
        .hash_password_with_salt(password.as_bytes(), b"an-argon2-salt16")
        .expect("argon2 hash")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_auth_takes_htpasswd_bcrypt_and_argon2id_and_reloads_its_file() {
    if !tool("/usr/bin/htpasswd", "apache2-utils") {
        return;
    }
    let backend = echo_backend().await;
    let dir = tempfile::tempdir().unwrap();
    let users = dir.path().join("users.htpasswd");
    htpasswd(&users, "alice", "alice-pass", "-B");
    let mut text = std::fs::read_to_string(&users).unwrap();
    text.push_str(&format!("bob:{}\n", argon2id("bob-pass")));
    std::fs::write(&users, &text).unwrap();
    let gw = Gateway::start_in(dir, &basic_config(backend.addr));
    let web = gw.listener("web");

    let (status, headers, _) = get_with(web, "/x", &[]).await;
    assert_eq!(status, 401);
    assert_eq!(
        headers["www-authenticate"],
        "Basic realm=\"ops\", charset=\"UTF-8\""
    );
    let (status, _, _) = get_with(web, "/x", &[("authorization", &basic("alice", "nope"))]).await;
    assert_eq!(status, 401);
    let (status, _, _) =
        get_with(web, "/x", &[("authorization", &basic("eve", "alice-pass"))]).await;
    assert_eq!(status, 401);
    let (status, _, _) = get_with(web, "/x", &[("authorization", "Basic !!not-base64")]).await;
    assert_eq!(status, 401);
    for (user, password) in [
        ("alice", "alice-pass"),
        ("bob", "bob-pass"),
        ("alice", "alice-pass"),
    ] {
        let (status, _, body) =
            get_with(web, "/x", &[("authorization", &basic(user, password))]).await;
        assert_eq!(status, 200, "{user}: {body}");
    }
    // `auth = "none"` written out opts out of the listener's default.
    let (status, _, body) = get_with(web, "/healthz", &[]).await;
    assert_eq!((status, body.as_str()), (200, "ok"));

    let metrics = scrape(&gw).await;
    let auth = |outcome: &str| {
        sample(
            &metrics,
            "cutover_auth_total",
            &[
                "route=\"api\"",
                "method=\"basic\"",
                &format!("outcome=\"{outcome}\""),
            ],
        )
    };
    assert_eq!(
        (auth("allowed"), auth("missing"), auth("invalid")),
        (3.0, 1.0, 3.0)
    );
    let lines = access_lines(&gw.path("access.log"), 8).await;
    let allowed: Vec<&Value> = lines.iter().filter(|l| l["auth"] == "allowed").collect();
    assert_eq!(allowed.len(), 3, "{lines:?}");
    assert_eq!(allowed[1]["subject"], "bob");
    assert!(lines
        .iter()
        .any(|l| l["auth"] == "missing" && l["status"] == 401));
    assert!(lines
        .iter()
        .any(|l| l["route"] == "health" && l["auth"].is_null()));

    // A rotated users file goes live through reload-certs, and only then.
    htpasswd(&gw.path("users.htpasswd"), "alice", "new-pass", "-B");
    let (status, _, _) =
        get_with(web, "/x", &[("authorization", &basic("alice", "new-pass"))]).await;
    assert_eq!(status, 401, "a changed file waits for reload-certs");
    let (status, body) = reload_certs(&gw).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["secrets"][0]["file"], "users.htpasswd", "{body}");
    assert_eq!(body["secrets"][0]["changed"], true, "{body}");
    let (status, _, _) =
        get_with(web, "/x", &[("authorization", &basic("alice", "new-pass"))]).await;
    assert_eq!(status, 200);
    let (status, _, _) = get_with(
        web,
        "/x",
        &[("authorization", &basic("alice", "alice-pass"))],
    )
    .await;
    assert_eq!(
        status, 401,
        "the old password is gone, remembered success or not"
    );

    // Removed, or rewritten with an MD5 line: the last good file stays.
    std::fs::remove_file(gw.path("users.htpasswd")).unwrap();
    let (status, body) = reload_certs(&gw).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body["secrets"][0]["error"]
            .as_str()
            .unwrap()
            .contains("cannot read"),
        "{body}"
    );
    assert!(body["warnings"].to_string().contains("last good"), "{body}");
    let (status, _, _) = get_with(web, "/x", &[("authorization", &basic("bob", "bob-pass"))]).await;
    assert_eq!(status, 200);

    // At activation, a file with an MD5-crypt line is refused with its line.
    std::fs::write(gw.path("users.htpasswd"), &text).unwrap();
    htpasswd(&gw.path("users.htpasswd"), "carol", "carol-pass", "-m");
    let (status, body) = activate_with(&gw, &basic_config(backend.addr), "").await;
    assert_eq!(status, 422, "{body}");
    let error = &body["errors"][0];
    assert_eq!(error["code"], "invalid_secret_file", "{body}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("line 3") && message.contains("MD5-crypt"),
        "{message}"
    );
    assert!(!message.contains("$apr1$"), "{message}");
}

/// PyJWT makes the keys, the JWKS and the tokens.
const MAKE_TOKENS: &str = r#"
import base64, hmac, hashlib, json, sys, time
import jwt
from jwt.algorithms import RSAAlgorithm, ECAlgorithm, OKPAlgorithm
from cryptography.hazmat.primitives.asymmetric import rsa, ec, ed25519
from cryptography.hazmat.primitives import serialization

out = sys.argv[1]
now = int(time.time())
rsa1 = rsa.generate_private_key(public_exponent=65537, key_size=2048)
rsa2 = rsa.generate_private_key(public_exponent=65537, key_size=2048)
ec1 = ec.generate_private_key(ec.SECP256R1())
ed1 = ed25519.Ed25519PrivateKey.generate()
# PyJWT 2.6 (Debian 12) publishes an EC coordinate without its leading
# zero bytes (31 of 32 for one key in 128): such a key must work too.
ec2 = next(k for k in iter(lambda: ec.generate_private_key(ec.SECP256R1()), None)
           if k.public_key().public_numbers().x < 1 << 248)

def jwk(alg, key, kid):
    k = json.loads(alg.to_jwk(key.public_key()))
    k["kid"] = kid
    k["use"] = "sig"
    return k

jwks1 = {"keys": [jwk(RSAAlgorithm, rsa1, "rsa-1"), jwk(ECAlgorithm, ec1, "ec-1"), jwk(ECAlgorithm, ec2, "ec-2"), jwk(OKPAlgorithm, ed1, "ed-1")]}
jwks2 = {"keys": jwks1["keys"] + [jwk(RSAAlgorithm, rsa2, "rsa-2")]}

def claims(**over):
    c = {"iss": "https://idp.test", "aud": "api", "sub": "alice", "exp": now + 600, "iat": now, "role": "admin"}
    c.update(over)
    return {k: v for k, v in c.items() if v is not None}

def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

def unsigned(header, payload):
    return b64(json.dumps(header).encode()) + "." + b64(json.dumps(payload).encode())

public_pem = rsa1.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
confused = unsigned({"alg": "HS256", "typ": "JWT", "kid": "rsa-1"}, claims(sub="mallory"))
confused += "." + b64(hmac.new(public_pem, confused.encode(), hashlib.sha256).digest())
good = jwt.encode(claims(), rsa1, algorithm="RS256", headers={"kid": "rsa-1"})
head, body, sig = good.split(".")
tampered = head + "." + b64(json.dumps(claims(sub="mallory")).encode()) + "." + sig
hmac_key = b"k" * 40

tokens = {
    "rs256": good,
    "es256": jwt.encode(claims(sub="bob"), ec1, algorithm="ES256", headers={"kid": "ec-1"}),
    "es256_short_x": jwt.encode(claims(sub="bob"), ec2, algorithm="ES256", headers={"kid": "ec-2"}),
    "eddsa": jwt.encode(claims(sub="carol"), ed1, algorithm="EdDSA", headers={"kid": "ed-1"}),
    "expired": jwt.encode(claims(exp=now - 3600), rsa1, algorithm="RS256", headers={"kid": "rsa-1"}),
    "early": jwt.encode(claims(nbf=now + 3600), rsa1, algorithm="RS256", headers={"kid": "rsa-1"}),
    "wrong_iss": jwt.encode(claims(iss="https://evil.test"), rsa1, algorithm="RS256", headers={"kid": "rsa-1"}),
    "wrong_aud": jwt.encode(claims(aud="other"), rsa1, algorithm="RS256", headers={"kid": "rsa-1"}),
    "no_exp": jwt.encode(claims(exp=None), rsa1, algorithm="RS256", headers={"kid": "rsa-1"}),
    "unknown_kid": jwt.encode(claims(sub="dave"), rsa2, algorithm="RS256", headers={"kid": "rsa-2"}),
    "alg_none": unsigned({"alg": "none", "typ": "JWT"}, claims(sub="mallory")) + ".",
    "confused": confused,
    "tampered": tampered,
    "hs256": jwt.encode(claims(sub="erin"), hmac_key, algorithm="HS256"),
    "hs256_other_key": jwt.encode(claims(sub="erin"), b"x" * 40, algorithm="HS256"),
}
json.dump(jwks1, open(out + "/jwks.json", "w"))
json.dump(jwks2, open(out + "/jwks2.json", "w"))
open(out + "/hmac.key", "wb").write(hmac_key + b"\n")
json.dump(tokens, open(out + "/tokens.json", "w"))
"#;

/// An echo backend and a folder whose `users.htpasswd` (bcrypt) holds
/// alice; `None`, having said so, without `htpasswd`.
async fn alice_beside_an_echo_backend() -> Option<(Backend, tempfile::TempDir)> {
    if !tool("/usr/bin/htpasswd", "apache2-utils") {
        return None;
    }
    let backend = echo_backend().await;
    let dir = tempfile::tempdir().unwrap();
    htpasswd(
        &dir.path().join("users.htpasswd"),
        "alice",
        "alice-pass",
        "-B",
    );
    Some((backend, dir))
}

/// A users file that a listener default and a route both name is one
/// secret (issue 56 item 6): `reload-certs` reloads and lists it once,
/// and the rotated file is live on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_file_named_twice_is_one_secret() {
    let Some((backend, dir)) = alice_beside_an_echo_backend().await else {
        return;
    };
    let config = Config::new()
        .listener(
            "web",
            r#"defaults = { auth = { basic = { users_file = "users.htpasswd", realm = "ops" } } }"#,
        )
        .route(
            "own",
            "listeners = [\"web\"]\npath_prefix = \"/own\"\nupstream = \"app\"\nauth = { basic = { users_file = \"users.htpasswd\", realm = \"own\" } }",
        )
        .route("api", "listeners = [\"web\"]\npath_prefix = \"/\"\nupstream = \"app\"")
        .upstream("app", &[backend.addr], "")
        .build();
    let gw = Gateway::start_in(dir, &config);
    let web = gw.listener("web");
    htpasswd(&gw.path("users.htpasswd"), "bob", "bob-pass", "-B");
    let (status, body) = reload_certs(&gw).await;
    assert_eq!(status, 200, "{body}");
    let secrets = body["secrets"].as_array().expect("secrets");
    assert_eq!(secrets.len(), 1, "one file, one secret: {body}");
    assert_eq!(secrets[0]["file"], "users.htpasswd", "{body}");
    assert_eq!(secrets[0]["changed"], true, "{body}");
    for path in ["/own/x", "/x"] {
        let (status, _, body) =
            get_with(web, path, &[("authorization", &basic("bob", "bob-pass"))]).await;
        assert_eq!(status, 200, "{path}: {body}");
    }
}

/// `forward_credentials = false` (issue 56 item 7): once checked, the
/// client's `Authorization` (its password) is not sent on; by default it
/// is, as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_auth_forwards_the_credentials_unless_told_not_to() {
    let Some((backend, dir)) = alice_beside_an_echo_backend().await else {
        return;
    };
    let config = Config::new()
        .listener("web", "")
        .route(
            "kept",
            "listeners = [\"web\"]\npath_prefix = \"/kept\"\nupstream = \"app\"\nauth = { basic = { users_file = \"users.htpasswd\" } }",
        )
        .route(
            "dropped",
            "listeners = [\"web\"]\npath_prefix = \"/dropped\"\nupstream = \"app\"\nauth = { basic = { users_file = \"users.htpasswd\", forward_credentials = false } }",
        )
        .upstream("app", &[backend.addr], "")
        .build();
    let gw = Gateway::start_in(dir, &config);
    let web = gw.listener("web");
    let credentials = basic("alice", "alice-pass");
    let (status, _, body) = get_with(web, "/kept", &[("authorization", &credentials)]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        echoed(&body, "authorization"),
        Some(credentials.as_str()),
        "{body}"
    );
    // Twice: the first check hashes, the second is remembered; neither
    // sends the password on.
    for _ in 0..2 {
        let (status, _, body) = get_with(web, "/dropped", &[("authorization", &credentials)]).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(echoed(&body, "authorization"), None, "{body}");
    }
    let (status, _, _) = get_with(web, "/dropped", &[]).await;
    assert_eq!(status, 401);
}

fn make_tokens(dir: &Path) -> Option<Value> {
    if !tool("/usr/bin/python3", "python3") {
        return None;
    }
    let probe = Command::new("/usr/bin/python3")
        .args(["-c", "import jwt, cryptography"])
        .status()
        .is_ok_and(|s| s.success());
    if !probe {
        eprintln!("skipped: PyJWT is absent (Debian packages python3-jwt, python3-cryptography; .ci/run installs them)");
        return None;
    }
    let script = dir.join("make_tokens.py");
    std::fs::write(&script, MAKE_TOKENS).unwrap();
    let output = Command::new("/usr/bin/python3")
        .arg(&script)
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::remove_file(&script).unwrap();
    Some(serde_json::from_str(&std::fs::read_to_string(dir.join("tokens.json")).unwrap()).unwrap())
}

fn jwt_config(backend: SocketAddr, keys: &str) -> String {
    Config::new()
        .metrics()
        .log("access = true\naccess_file = \"access.log\"\nformat = \"json\"")
        .listener("web", "")
        .route(
            "api",
            &format!(
                r#"listeners = ["web"]
path_prefix = "/"
upstream = "app"
auth = {{ jwt = {{ issuer = "https://idp.test", audiences = ["api"], {keys}, leeway = "5s", claims_to_headers = {{ sub = "x-user", role = "x-role" }}, forward_token = false }} }}"#
            ),
        )
        .upstream("app", &[backend], "")
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_tokens_from_pyjwt_pass_or_fail_on_signature_time_issuer_and_audience() {
    let dir = tempfile::tempdir().unwrap();
    let Some(tokens) = make_tokens(dir.path()) else {
        return;
    };
    let token = |name: &str| tokens[name].as_str().unwrap().to_owned();
    let backend = echo_backend().await;
    let keys = r#"jwks_file = "jwks.json", algorithms = ["RS256", "ES256", "EdDSA"]"#;
    let gw = Gateway::start_in(dir, &jwt_config(backend.addr, keys));
    let web = gw.listener("web");

    for (name, user) in [
        ("rs256", "alice"),
        ("es256", "bob"),
        ("es256_short_x", "bob"),
        ("eddsa", "carol"),
    ] {
        let auth = bearer(&token(name));
        // The identity headers a client sends are replaced, never passed.
        let (status, _, body) = get_with(
            web,
            "/x",
            &[
                ("authorization", &auth),
                ("x-user", "root"),
                ("x-role", "root"),
            ],
        )
        .await;
        assert_eq!(status, 200, "{name}: {body}");
        assert_eq!(echoed(&body, "x-user"), Some(user), "{body}");
        assert_eq!(echoed(&body, "x-role"), Some("admin"), "{body}");
        // forward_token = false: the backend does not see the token.
        assert_eq!(echoed(&body, "authorization"), None, "{body}");
    }
    let (status, headers, _) = get_with(web, "/x", &[("x-user", "root")]).await;
    assert_eq!(status, 401);
    assert_eq!(headers["www-authenticate"], "Bearer");
    let oversized = format!(
        "{}.{}.{}",
        "a".repeat(3000),
        "b".repeat(3000),
        "c".repeat(3000)
    );
    for name in [
        "expired",
        "early",
        "wrong_iss",
        "wrong_aud",
        "no_exp",
        "unknown_kid",
        "alg_none",
        "confused",
        "tampered",
        "hs256",
    ] {
        let (status, headers, _) =
            get_with(web, "/x", &[("authorization", &bearer(&token(name)))]).await;
        assert_eq!(status, 401, "{name}");
        let challenge = headers["www-authenticate"].to_str().unwrap();
        assert!(
            challenge.starts_with("Bearer error=\"invalid_token\""),
            "{name}: {challenge}"
        );
    }
    for bad in [oversized.as_str(), "not.a.token", "%%%.$$$.###"] {
        let (status, _, _) = get_with(web, "/x", &[("authorization", &bearer(bad))]).await;
        assert_eq!(status, 401, "{bad:.40}");
    }
    let metrics = scrape(&gw).await;
    let count = |outcome: &str| {
        sample(
            &metrics,
            "cutover_auth_total",
            &["method=\"jwt\"", &format!("outcome=\"{outcome}\"")],
        )
    };
    assert_eq!(
        (count("allowed"), count("missing"), count("invalid")),
        (4.0, 1.0, 13.0)
    );
    let lines = access_lines(&gw.path("access.log"), 18).await;
    assert!(
        lines
            .iter()
            .any(|l| l["auth"] == "allowed" && l["subject"] == "carol"),
        "{lines:?}"
    );

    // HMAC only from a key file, and only with HS algorithms.
    let keys = r#"hmac_key_file = "hmac.key", algorithms = ["HS256"]"#;
    let (status, body) = activate_with(&gw, &jwt_config(backend.addr, keys), "").await;
    assert_eq!(status, 200, "{body}");
    let (status, _, body) =
        get_with(web, "/x", &[("authorization", &bearer(&token("hs256")))]).await;
    assert_eq!(
        (status, echoed(&body, "x-user")),
        (200, Some("erin")),
        "{body}"
    );
    for name in ["hs256_other_key", "rs256"] {
        let (status, _, _) = get_with(web, "/x", &[("authorization", &bearer(&token(name)))]).await;
        assert_eq!(status, 401, "{name}");
    }
    for (keys, wanted) in [
        (
            r#"jwks_file = "jwks.json", algorithms = ["HS256"]"#,
            "needs hmac_key_file",
        ),
        (
            r#"hmac_key_file = "hmac.key", algorithms = ["RS256"]"#,
            "not an HMAC algorithm",
        ),
        (
            r#"jwks_file = "jwks.json", algorithms = ["none"]"#,
            "not an algorithm",
        ),
        (
            r#"jwks_url = "http://idp.example/jwks.json""#,
            "must be https",
        ),
        (
            r#"jwks_file = "jwks.json", jwks_url = "https://idp.example/jwks.json""#,
            "exactly one",
        ),
    ] {
        let (status, body) = activate_with(&gw, &jwt_config(backend.addr, keys), "").await;
        assert_eq!(status, 422, "{keys}: {body}");
        assert!(body.to_string().contains(wanted), "{keys}: {body}");
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Serve {
    Keys(usize),
    Fail500,
    Huge,
    NotJson,
    Hang,
}

/// A JWKS endpoint over HTTPS that serves what the test says and counts
/// its fetches.
struct JwksServer {
    addr: SocketAddr,
    mode: Arc<Mutex<Serve>>,
    fetches: Arc<AtomicU64>,
}

impl JwksServer {
    async fn start(ca: &crate::pki::Ca, sets: Vec<String>) -> JwksServer {
        let acceptor = crate::pki::backend_acceptor(ca, "localhost", &[b"http/1.1"]);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mode = Arc::new(Mutex::new(Serve::Keys(0)));
        let fetches = Arc::new(AtomicU64::new(0));
        let (m, f) = (Arc::clone(&mode), Arc::clone(&fetches));
        let sets = Arc::new(sets);
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let (acceptor, m, f, sets) = (
                    acceptor.clone(),
                    Arc::clone(&m),
                    Arc::clone(&f),
                    Arc::clone(&sets),
                );
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |_req| {
                        f.fetch_add(1, Ordering::SeqCst);
                        let mode = *m.lock().unwrap();
                        let sets = Arc::clone(&sets);
                        async move {
                            let (status, body) = match mode {
                                Serve::Keys(i) => (200, Bytes::from(sets[i].clone())),
                                Serve::Fail500 => (500, Bytes::from_static(b"oops")),
                                Serve::Huge => (200, Bytes::from(vec![b' '; 10 * 1024 * 1024])),
                                Serve::NotJson => (200, Bytes::from_static(b"{\"keys\": [")),
                                Serve::Hang => {
                                    tokio::time::sleep(Duration::from_secs(30)).await;
                                    (200, Bytes::new())
                                }
                            };
                            let mut response = hyper::Response::new(Full::new(body));
                            *response.status_mut() = http::StatusCode::from_u16(status).unwrap();
                            Ok::<_, std::convert::Infallible>(response)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        JwksServer {
            addr,
            mode,
            fetches,
        }
    }

    fn set(&self, mode: Serve) {
        *self.mode.lock().unwrap() = mode;
    }

    fn fetches(&self) -> u64 {
        self.fetches.load(Ordering::SeqCst)
    }

    /// Waits for `n` more fetches than `from`.
    async fn wait_fetches(&self, from: u64, n: u64) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while self.fetches() < from + n {
            assert!(Instant::now() < deadline, "no JWKS fetch within 15 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwks_url_rotates_and_keeps_its_last_good_keys_through_failures() {
    let dir = tempfile::tempdir().unwrap();
    let Some(tokens) = make_tokens(dir.path()) else {
        return;
    };
    let token = |name: &str| bearer(tokens[name].as_str().unwrap());
    let ca = crate::pki::ca("jwks ca");
    std::fs::write(dir.path().join("ca.pem"), &ca.pem).unwrap();
    let sets = ["jwks.json", "jwks2.json"]
        .map(|f| std::fs::read_to_string(dir.path().join(f)).unwrap())
        .to_vec();
    let server = JwksServer::start(&ca, sets).await;
    let backend = echo_backend().await;
    let keys = format!(
        r#"jwks_url = "https://localhost:{}/jwks.json", jwks_ca = "ca.pem", jwks_refresh = "2s""#,
        server.addr.port()
    );
    let gw = Gateway::start_in(dir, &jwt_config(backend.addr, &keys));
    let web = gw.listener("web");
    let (status, _, body) = get_with(web, "/x", &[("authorization", &token("rs256"))]).await;
    assert_eq!(status, 200, "{body}");

    // An unknown kid asks for a fetch at once, then not again for 30 s.
    let before = server.fetches();
    let (status, _, _) = get_with(web, "/x", &[("authorization", &token("unknown_kid"))]).await;
    assert_eq!(status, 401);
    let asked = server.fetches();
    assert_eq!(asked, before + 1, "an unknown kid fetched once");
    let (status, _, _) = get_with(web, "/x", &[("authorization", &token("unknown_kid"))]).await;
    assert_eq!(status, 401);
    assert_eq!(
        server.fetches(),
        asked,
        "a second unknown kid within 30 s fetches nothing"
    );

    // Rotation: the next scheduled fetch brings the new key.
    server.set(Serve::Keys(1));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, _, _) = get_with(web, "/x", &[("authorization", &token("unknown_kid"))]).await;
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the rotated key never arrived");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A failing endpoint leaves the last good keys in place.
    for mode in [Serve::Fail500, Serve::Huge, Serve::NotJson, Serve::Hang] {
        server.set(mode);
        let from = server.fetches();
        server.wait_fetches(from, 1).await;
        let started = Instant::now();
        for name in ["rs256", "unknown_kid"] {
            let (status, _, _) = get_with(web, "/x", &[("authorization", &token(name))]).await;
            assert_eq!(status, 200, "{name} while the endpoint fails");
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "requests never wait on a failing fetch"
        );
    }
    assert!(gw.logs().contains("JWKS fetch failed"), "{}", gw.logs());
}

/// What must never appear anywhere the gateway shows or writes things.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_history_preview_status_the_admin_page_metrics_or_logs() {
    let dir = tempfile::tempdir().unwrap();
    let Some(tokens) = make_tokens(dir.path()) else {
        return;
    };
    let hash = argon2id("basic-password-1");
    std::fs::write(dir.path().join("users.htpasswd"), format!("alice:{hash}\n")).unwrap();
    let backend = echo_backend().await;
    let config = Config::new()
        .metrics()
        .log("access = true\naccess_file = \"access.log\"\nformat = \"json\"")
        .listener("web", "")
        .route(
            "basic",
            "listeners = [\"web\"]\npath_prefix = \"/b/\"\nupstream = \"app\"\nauth = { basic = { users_file = \"users.htpasswd\" } }",
        )
        .route(
            "jwks",
            "listeners = [\"web\"]\npath_prefix = \"/j/\"\nupstream = \"app\"\nauth = { jwt = { jwks_file = \"jwks.json\", audiences = [\"api\"] } }",
        )
        .route(
            "hmac",
            "listeners = [\"web\"]\npath_prefix = \"/h/\"\nupstream = \"app\"\nauth = { jwt = { hmac_key_file = \"hmac.key\", audiences = [\"api\"], from = \"cookie:session\" } }",
        )
        .upstream("app", &[backend.addr], "")
        .build();
    let gw = Gateway::start_in(dir, &config);
    let web = gw.listener("web");
    let rs = tokens["rs256"].as_str().unwrap();
    let hs = tokens["hs256"].as_str().unwrap();
    let password = basic("alice", "basic-password-1");
    for (path, header, value, want) in [
        ("/b/x", "authorization", password.clone(), 200),
        (
            "/b/x",
            "authorization",
            basic("alice", "basic-password-2"),
            401,
        ),
        ("/j/x", "authorization", bearer(rs), 200),
        ("/h/x", "cookie", format!("session={hs}"), 200),
    ] {
        let (status, _, _) = get_with(web, path, &[(header, &value)]).await;
        assert_eq!(status, want, "{path}");
    }
    let (status, _) = activate_with(&gw, &config.replace("/b/", "/basic/"), "").await;
    assert_eq!(status, 200);
    let (status, _) = reload_certs(&gw).await;
    assert_eq!(status, 200);

    let mut seen = Vec::new();
    for path in [
        "/admin/runtime/history",
        "/admin/runtime/history/1",
        "/admin/runtime/history/2",
        "/admin/runtime/status",
        "/admin/runtime/backends",
        "/admin/",
    ] {
        let (status, _, body) = get(gw.admin, &gw.admin.to_string(), path).await;
        assert_eq!(status, 200, "{path}");
        seen.push((path.to_owned(), body));
    }
    for kind in ["preview", "validate"] {
        let (_, body) = admin_request(
            gw.admin,
            "POST",
            &format!("/admin/runtime/{kind}"),
            Some("application/toml"),
            Some(config.clone()),
        )
        .await;
        seen.push((kind.to_owned(), body.to_string()));
    }
    let export = Command::new(env!("CARGO_BIN_EXE_cutover"))
        .args(["ctl", "--admin", &format!("http://{}", gw.admin), "export"])
        .output()
        .unwrap();
    seen.push((
        "ctl export".into(),
        String::from_utf8_lossy(&export.stdout).into_owned(),
    ));
    assert!(
        seen.last().unwrap().1.contains("users.htpasswd"),
        "export printed the configuration"
    );
    seen.push(("metrics".into(), scrape(&gw).await));
    access_lines(&gw.path("access.log"), 4).await;
    seen.push((
        "access log".into(),
        std::fs::read_to_string(gw.path("access.log")).unwrap(),
    ));
    seen.push(("process log".into(), gw.logs()));
    seen.push((
        "state".into(),
        std::fs::read_dir(gw.dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
            .filter(|e| {
                !e.file_name().to_string_lossy().starts_with("jwks")
                    && e.file_name() != "tokens.json"
            })
            .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
            .collect(),
    ));
    let hmac_key = "k".repeat(40);
    let jwks = std::fs::read_to_string(gw.path("jwks.json")).unwrap();
    let modulus: Value = serde_json::from_str(&jwks).unwrap();
    let modulus = modulus["keys"][0]["n"].as_str().unwrap().to_owned();
    let secrets = [
        ("argon2 hash", hash.as_str()),
        ("password", "basic-password-1"),
        ("wrong password", "basic-password-2"),
        ("Basic header", password.trim_start_matches("Basic ")),
        ("RS256 token", rs),
        ("HS256 token", hs),
        ("HMAC key", hmac_key.as_str()),
        ("JWKS key", modulus.as_str()),
    ];
    for (place, text) in &seen {
        for (what, secret) in secrets {
            assert!(!text.contains(secret), "the {what} appears in {place}");
        }
    }
}

/// An auth service in the test: `Bearer ok` passes as alice, `Bearer
/// forbidden` gets 403, `Bearer login` a redirect, `Bearer slow` an answer
/// after 2 s, `Bearer broken` a 500; anything else 401. It remembers the
/// last request's forwarded headers.
async fn auth_service(seen: Arc<Mutex<Vec<(String, String)>>>) -> Backend {
    Backend::start(Arc::new(move |req: Request<hyper::body::Incoming>| {
        let seen = Arc::clone(&seen);
        Box::pin(async move {
            *seen.lock().unwrap() = req
                .headers()
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or("?").to_owned()))
                .chain(std::iter::once(("path".to_owned(), req.uri().to_string())))
                .collect();
            let token = req
                .headers()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let mut response = hyper::Response::new(full("denied by authz\n"));
            match token.as_str() {
                "Bearer ok" => {
                    *response.body_mut() = full("");
                    let headers = response.headers_mut();
                    headers.insert("x-user", "alice".parse().unwrap());
                    headers.insert("x-tenant", "blue".parse().unwrap());
                    headers.insert("x-internal", "never copied".parse().unwrap());
                }
                "Bearer forbidden" => *response.status_mut() = http::StatusCode::FORBIDDEN,
                "Bearer login" => {
                    *response.status_mut() = http::StatusCode::FOUND;
                    response
                        .headers_mut()
                        .insert("location", "https://login.test/?next=%2Fx".parse().unwrap());
                }
                "Bearer slow" => {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                "Bearer broken" => *response.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR,
                _ => {
                    *response.status_mut() = http::StatusCode::UNAUTHORIZED;
                    response.headers_mut().insert(
                        "www-authenticate",
                        "Bearer realm=\"authz\"".parse().unwrap(),
                    );
                    response
                        .headers_mut()
                        .insert("x-internal", "not for clients".parse().unwrap());
                }
            }
            response
        })
    }))
    .await
}

fn forward_config(backend: SocketAddr, authz: SocketAddr, failure: &str) -> String {
    Config::new()
        .metrics()
        .log("access = true\naccess_file = \"access.log\"\nformat = \"json\"")
        .listener("web", "")
        .route(
            "api",
            &format!(
                r#"listeners = ["web"]
path_prefix = "/"
upstream = "app"
auth = {{ forward = {{ url = "http://authz/check?v=1", timeout = "500ms", response_headers = ["x-user", "x-tenant"], failure = "{failure}" }} }}"#
            ),
        )
        .upstream("app", &[backend], "")
        .upstream("authz", &[authz], "")
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_auth_asks_an_upstream_and_passes_its_refusals_on() {
    let backend = echo_backend().await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let authz = auth_service(Arc::clone(&seen)).await;
    let gw = Gateway::start(&forward_config(backend.addr, authz.addr, "deny"));
    let web = gw.listener("web");

    let (status, _, body) = get_with(
        web,
        "/x?q=1",
        &[
            ("authorization", "Bearer ok"),
            ("x-user", "root"),
            ("cookie", "s=1"),
            ("x-other", "y"),
        ],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(echoed(&body, "x-user"), Some("alice"), "{body}");
    assert_eq!(echoed(&body, "x-tenant"), Some("blue"), "{body}");
    assert_eq!(
        echoed(&body, "x-internal"),
        None,
        "only response_headers are copied"
    );
    let asked: Vec<(String, String)> = seen.lock().unwrap().clone();
    let field = |name: &str| {
        asked
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(field("path").as_deref(), Some("/check?v=1"));
    assert_eq!(field("x-forwarded-method").as_deref(), Some("GET"));
    assert_eq!(field("x-forwarded-uri").as_deref(), Some("/x?q=1"));
    assert_eq!(field("x-forwarded-host").as_deref(), Some("api.test"));
    assert_eq!(field("x-forwarded-proto").as_deref(), Some("http"));
    assert_eq!(field("x-forwarded-for").as_deref(), Some("127.0.0.1"));
    assert_eq!(field("authorization").as_deref(), Some("Bearer ok"));
    assert_eq!(field("cookie").as_deref(), Some("s=1"));
    assert_eq!(field("x-other"), None, "only request_headers are sent");

    let (status, headers, body) = get_with(web, "/x", &[]).await;
    assert_eq!((status, body.as_str()), (401, "denied by authz\n"));
    assert_eq!(headers["www-authenticate"], "Bearer realm=\"authz\"");
    assert!(headers.get("x-internal").is_none(), "{headers:?}");
    let (status, _, body) = get_with(web, "/x", &[("authorization", "Bearer forbidden")]).await;
    assert_eq!((status, body.as_str()), (403, "denied by authz\n"));
    let (status, headers, _) = get_with(web, "/x", &[("authorization", "Bearer login")]).await;
    assert_eq!(status, 302);
    assert_eq!(headers["location"], "https://login.test/?next=%2Fx");
    // A failing auth service follows `failure`: deny (503) ...
    for token in ["Bearer slow", "Bearer broken"] {
        let started = Instant::now();
        let (status, _, _) = get_with(web, "/x", &[("authorization", token)]).await;
        assert_eq!(status, 503, "{token}");
        assert!(
            started.elapsed() < Duration::from_millis(1500),
            "{token}: the timeout holds"
        );
    }
    let metrics = scrape(&gw).await;
    let count = |outcome: &str| {
        sample(
            &metrics,
            "cutover_auth_total",
            &["method=\"forward\"", &format!("outcome=\"{outcome}\"")],
        )
    };
    assert_eq!(
        (count("allowed"), count("refused"), count("unavailable")),
        (1.0, 3.0, 2.0)
    );
    let lines = access_lines(&gw.path("access.log"), 6).await;
    assert!(
        lines
            .iter()
            .any(|l| l["auth"] == "allowed" && l["subject"] == "alice"),
        "{lines:?}"
    );

    // ... or allow, without an identity; so does a service that is down.
    let config = forward_config(backend.addr, refusing_addr(), "allow");
    assert_eq!(activate_status(&gw, &config).await, 200);
    let (status, _, body) = get_with(
        web,
        "/x",
        &[("authorization", "Bearer ok"), ("x-user", "root")],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        echoed(&body, "x-user"),
        None,
        "no identity, and the client's is gone"
    );
    let config = forward_config(backend.addr, refusing_addr(), "deny");
    assert_eq!(activate_status(&gw, &config).await, 200);
    let (status, _, _) = get_with(web, "/x", &[("authorization", "Bearer ok")]).await;
    assert_eq!(status, 503);
    assert!(scrape(&gw).await.contains("outcome=\"failed_open\""));

    for (url, wanted) in [
        ("http://nowhere/check", "not an upstream"),
        (
            "http://authz:9000/check",
            "the upstream's backends give the address",
        ),
        ("https://authz/check", "https needs tls"),
    ] {
        let config =
            forward_config(backend.addr, authz.addr, "deny").replace("http://authz/check?v=1", url);
        let (status, body) = activate_with(&gw, &config, "").await;
        assert_eq!(status, 422, "{url}");
        assert!(body.to_string().contains(wanted), "{url}: {body}");
    }
}

/// `examples/auth.toml` as shipped (its ports moved to free ones, its
/// backends to a test's): the demo user gets in, nobody else does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_auth_example_serves_its_demo_user() {
    let backend = echo_backend().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("auth")).unwrap();
    for file in ["users.htpasswd", "jwks.json"] {
        std::fs::copy(
            workspace().join("examples/auth").join(file),
            dir.path().join("auth").join(file),
        )
        .unwrap();
    }
    let text = std::fs::read_to_string(workspace().join("examples/auth.toml"))
        .unwrap()
        .replace("127.0.0.1:9190", "127.0.0.1:0")
        .replace("127.0.0.1:8080", "127.0.0.1:0");
    let text = ["9001", "9002", "9003"].iter().fold(text, |text, port| {
        text.replace(&format!("127.0.0.1:{port}"), &backend.addr.to_string())
    });
    let gw = Gateway::start_in(dir, &text);
    let web = gw.listener("web");
    let (status, _, body) = get_with(web, "/", &[("authorization", &basic("demo", "demo"))]).await;
    assert_eq!(status, 200, "{body}");
    let (status, headers, _) = get_with(web, "/", &[]).await;
    assert_eq!(status, 401);
    assert_eq!(
        headers["www-authenticate"],
        "Basic realm=\"example\", charset=\"UTF-8\""
    );
    let (status, _, _) = get_with(web, "/healthz", &[]).await;
    assert_eq!(status, 200);
    let (status, _, _) = get_with(web, "/api/x", &[("authorization", "Bearer a.b.c")]).await;
    assert_eq!(status, 401);
}

/// With `run --watch`, replacing a users file (write, then rename) is
/// enough: the watch sees a referenced file change under the same text
/// and calls reload-certs, which takes the new file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_users_file_is_taken_when_replaced() {
    if !tool("/usr/bin/htpasswd", "apache2-utils") {
        return;
    }
    let backend = echo_backend().await;
    let dir = tempfile::tempdir().unwrap();
    htpasswd(&dir.path().join("users.htpasswd"), "alice", "first", "-B");
    let gw = Gateway::start_args_in(dir, &basic_config(backend.addr), &["--watch"]);
    let web = gw.listener("web");
    let (status, _, _) = get_with(web, "/x", &[("authorization", &basic("alice", "first"))]).await;
    assert_eq!(status, 200);
    let next = gw.path("users.next");
    htpasswd(&next, "alice", "second", "-B");
    std::fs::rename(&next, gw.path("users.htpasswd")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (status, _, _) =
            get_with(web, "/x", &[("authorization", &basic("alice", "second"))]).await;
        if status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the replaced file was never taken:\n{}",
            gw.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, _, _) = get_with(web, "/x", &[("authorization", &basic("alice", "first"))]).await;
    assert_eq!(status, 401);
    // A certificate operation, not a new generation.
    assert_eq!(gw.active_generation().await, 1);
}

/// Forward auth with `cache` (issue 56 item 2): the auth service is asked
/// once per set of credentials within `ttl`; its `Cache-Control`
/// shortens or forbids keeping; a 5xx is never kept; `reload-certs`
/// forgets everything. Counted at the auth service and in
/// `cutover_auth_cache_total`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_auth_keeps_answers_per_credentials_as_the_service_allows() {
    let backend = echo_backend().await;
    let asked = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&asked);
    let authz = Backend::start(Arc::new(move |req: Request<hyper::body::Incoming>| {
        counted.fetch_add(1, Ordering::Relaxed);
        let token = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        Box::pin(async move {
            let mut response = hyper::Response::new(full(""));
            let (status, user, cache_control) = match token.as_str() {
                "Bearer alice" => (200, Some("alice"), None),
                "Bearer bob" => (200, Some("bob"), None),
                "Bearer brief" => (200, Some("brief"), Some("max-age=1")),
                "Bearer unkept" => (200, Some("unkept"), Some("no-store")),
                "Bearer broken" => (500, None, None),
                _ => (401, None, None),
            };
            *response.status_mut() = http::StatusCode::from_u16(status).unwrap();
            if let Some(user) = user {
                response
                    .headers_mut()
                    .insert("x-user", user.parse().unwrap());
            }
            if let Some(value) = cache_control {
                response
                    .headers_mut()
                    .insert("cache-control", value.parse().unwrap());
            }
            response
        })
    }))
    .await;
    let config = Config::new()
        .metrics()
        .listener("web", "")
        .route(
            "api",
            r#"listeners = ["web"]
path_prefix = "/"
upstream = "app"
auth = { forward = { url = "http://authz/check", request_headers = ["authorization"], response_headers = ["x-user"], cache = { ttl = "60s", max_entries = 1000 } } }"#,
        )
        .upstream("app", &[backend.addr], "")
        .upstream("authz", &[authz.addr], "")
        .build();
    let gw = Gateway::start(&config);
    let web = gw.listener("web");
    let asked_now = || asked.load(Ordering::Relaxed);
    // Who is who, each asked once: 200 requests, 2 checks.
    for n in 0..200 {
        let (user, token) = if n % 2 == 0 {
            ("alice", "Bearer alice")
        } else {
            ("bob", "Bearer bob")
        };
        let (status, _, body) = get_with(web, &format!("/{n}"), &[("authorization", token)]).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(echoed(&body, "x-user"), Some(user), "request {n}: {body}");
    }
    assert_eq!(asked_now(), 2, "one check per set of credentials");
    // A refusal is kept too: the client gets it as the service gave it.
    for _ in 0..5 {
        let (status, _, _) = get_with(web, "/", &[("authorization", "Bearer wrong")]).await;
        assert_eq!(status, 401);
    }
    assert_eq!(asked_now(), 3);
    // A 5xx never: asked every time (and refused, failure = "deny").
    for _ in 0..5 {
        let (status, _, _) = get_with(web, "/", &[("authorization", "Bearer broken")]).await;
        assert_eq!(status, 503);
    }
    assert_eq!(asked_now(), 8, "a failing service is asked every time");
    // no-store: asked every time; max-age=1: again after a second.
    for _ in 0..3 {
        let (status, _, _) = get_with(web, "/", &[("authorization", "Bearer unkept")]).await;
        assert_eq!(status, 200);
    }
    assert_eq!(asked_now(), 11);
    let (status, _, _) = get_with(web, "/", &[("authorization", "Bearer brief")]).await;
    assert_eq!(status, 200);
    let (status, _, _) = get_with(web, "/", &[("authorization", "Bearer brief")]).await;
    assert_eq!(status, 200);
    assert_eq!(asked_now(), 12, "kept for its second");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (status, _, _) = get_with(web, "/", &[("authorization", "Bearer brief")]).await;
    assert_eq!(status, 200);
    assert_eq!(asked_now(), 13, "asked again once its max-age passed");

    let metrics = scrape(&gw).await;
    let result = |result: &str| {
        sample(
            &metrics,
            "cutover_auth_cache_total",
            &["route=\"api\"", &format!("result=\"{result}\"")],
        )
    };
    // 216 requests: 203 answered from the cache, 13 asked (5 kept).
    assert_eq!(
        (result("hit"), result("stored"), result("miss")),
        (203.0, 5.0, 8.0),
        "{metrics}"
    );

    // reload-certs forgets every kept answer: alice is asked again.
    let (status, reload) = reload_certs(&gw).await;
    assert_eq!(status, 200, "{reload}");
    assert!(
        reload["auth_answers_forgotten"].as_u64() >= Some(3),
        "{reload}"
    );
    let (status, _, _) = get_with(web, "/", &[("authorization", "Bearer alice")]).await;
    assert_eq!(status, 200);
    assert_eq!(asked_now(), 14, "forgotten by reload-certs");
}
