//! Route authentication, in process: what one request's check costs.
//!
//! - `jwt/es256_verify`: an ES256 token verified against a JWKS of one
//!   P-256 key (header and claims parsed, signature, times, issuer,
//!   audience, one claim to a header): a token's first request;
//! - `jwt/es256_remembered`: the same token again within its minute (the
//!   salted hash of the token and the lookup);
//! - `basic/remembered`: a Basic request whose success is remembered
//!   (the salted hash and the lookup; what every request after the first
//!   costs within 60 s);
//! - `basic/bcrypt_cost_N`: the hash itself, which a first request (or a
//!   wrong password) costs, at `htpasswd -B`'s default cost 5 and at 10.
//!
//! The forward-auth round trip is measured end to end in
//! `cargo bench --bench proxy` part (h). Run: `cargo bench --bench auth`.

use std::hint::black_box;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use criterion::{criterion_group, criterion_main, Criterion};
use cutover::auth::{basic, jwt, SecretFile, Verdict};
use http::{HeaderMap, HeaderName, HeaderValue};
use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};

/// The same allocator the `cutover` binary uses.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn bench_jwt(c: &mut Criterion) {
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("key");
    let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
        .expect("pair");
    // An uncompressed point: 0x04, x, y.
    let point = pair.public_key().as_ref();
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let jwks = serde_json::json!({ "keys": [{
        "kty": "EC", "crv": "P-256", "kid": "k1", "use": "sig",
        "x": b64(&point[1..33]), "y": b64(&point[33..65]),
    }]});
    let jwks = serde_json::to_vec(&jwks).expect("jwks");
    let checker = || {
        let file = SecretFile::new("jwks.json", "jwks.json".into(), &jwks, jwt::parse_jwks)
            .expect("jwks parses");
        jwt::Jwt::new(
            Some("https://idp.example".into()),
            vec!["api".into()],
            jwt::Keys::File(file),
            vec![jsonwebtoken::Algorithm::ES256],
            Duration::from_secs(30),
            jwt::TokenSource::Header(http::header::AUTHORIZATION),
            vec![("sub".into(), HeaderName::from_static("x-user"))],
            true,
        )
    };
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    header.kid = Some("k1".into());
    let claims = serde_json::json!({
        "iss": "https://idp.example", "aud": "api", "sub": "user-42", "exp": now + 3600,
    });
    let token = jsonwebtoken::encode(
        &header,
        &claims,
        &jsonwebtoken::EncodingKey::from_ec_der(pkcs8.as_ref()),
    )
    .expect("token");
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {token}")).expect("header"),
    );
    let rt = runtime();
    // A new checker each time: nothing remembered.
    c.bench_function("jwt/es256_verify", |b| {
        b.iter_batched(
            checker,
            |fresh| rt.block_on(fresh.check(black_box(&headers), None)),
            criterion::BatchSize::SmallInput,
        )
    });
    let warm = checker();
    assert!(matches!(
        rt.block_on(warm.check(&headers, None)),
        Verdict::Allowed(_)
    ));
    c.bench_function("jwt/es256_remembered", |b| {
        b.iter(|| rt.block_on(warm.check(black_box(&headers), None)))
    });
}

fn bench_basic(c: &mut Criterion) {
    let rt = runtime();
    let hash = bcrypt::hash("secret", 5).expect("hash");
    let users = format!("alice:{hash}\n");
    let file = SecretFile::new(
        "users",
        "users".into(),
        users.as_bytes(),
        basic::parse_users,
    )
    .expect("users parse");
    let checker = basic::Basic::new(file, "bench".into(), true).expect("basic");
    let mut headers = HeaderMap::new();
    let credentials = base64::engine::general_purpose::STANDARD.encode("alice:secret");
    headers.insert(
        http::header::AUTHORIZATION,
        HeaderValue::from_str(&format!("Basic {credentials}")).expect("header"),
    );
    // The first check hashes and remembers.
    assert!(matches!(
        rt.block_on(checker.check(&headers)),
        Verdict::Allowed(_)
    ));
    c.bench_function("basic/remembered", |b| {
        b.iter(|| rt.block_on(checker.check(black_box(&headers))))
    });
    let mut group = c.benchmark_group("basic");
    group.sample_size(10);
    for cost in [5u32, 10] {
        let hash = bcrypt::hash("secret", cost).expect("hash");
        group.bench_function(format!("bcrypt_cost_{cost}"), |b| {
            b.iter(|| bcrypt::verify(black_box("secret"), &hash))
        });
    }
    group.finish();
}

criterion_group!(benches, bench_jwt, bench_basic);
criterion_main!(benches);
