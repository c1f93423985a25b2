//! Discovery at 1 000 members from one DNS name, resolved for real from a
//! DNS server on loopback (the tests' own, `tests/it/dns.rs`): the cost of
//! a request's pick (p2c and hash, target ≤ 100 ns) against the same
//! 1 000 backends written as fixed addresses, and what one change of the
//! set costs the gateway (`rebuild`: backends from the registry, the
//! weighted schedule, the Maglev table; a refresh that finds the set
//! unchanged costs one query and a comparison, no rebuild).
//! Run: `cargo bench --bench discovery`.

use std::hint::black_box;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

/// The same allocator the `cutover` binary uses.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{criterion_group, criterion_main, Criterion};
use cutover::config::ConfigText;
use cutover::generation::{build, hash_key, SharedState};
use cutover::ids::GenerationId;

#[allow(dead_code)]
#[path = "../tests/it/dns.rs"]
mod dns;

const MEMBERS: u32 = 1000;

fn bench_discovery(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let _entered = runtime.enter();
    let server = runtime.block_on(dns::DnsServer::start());
    let ips: Vec<Ipv4Addr> = (0..MEMBERS)
        .map(|i| Ipv4Addr::new(10, 1, (i / 250) as u8, (i % 250 + 1) as u8))
        .collect();
    server.set_a("pool.bench", &ips);
    server.set_ttl(300);
    let fixed: Vec<String> = ips
        .iter()
        .map(|ip| format!("{{ addr = \"{ip}:8080\" }}"))
        .collect();
    let mut text = String::from(
        "[admin]\nbind = \"127.0.0.1:0\"\n\n[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n\n",
    );
    let upstreams = [
        ("fixed_p2c", "policy = \"p2c\"", fixed.join(", ")),
        (
            "dns_p2c",
            "policy = \"p2c\"",
            "{ dns = \"pool.bench:8080\", refresh = \"5m\" }".into(),
        ),
        (
            "fixed_hash",
            "policy = \"hash\"\nhash_key = \"header:x-user\"",
            fixed.join(", "),
        ),
        (
            "dns_hash",
            "policy = \"hash\"\nhash_key = \"header:x-user\"",
            "{ dns = \"pool.bench:8080\", refresh = \"5m\" }".into(),
        ),
    ];
    for (name, _, _) in &upstreams {
        text.push_str(&format!(
            "[[routes]]\nname = \"{name}\"\nlisteners = [\"web\"]\npath_prefix = \"/{name}\"\nupstream = \"{name}\"\n\n"
        ));
    }
    for (name, policy, backends) in &upstreams {
        text.push_str(&format!(
            "[upstreams.{name}]\n{policy}\nbackends = [{backends}]\n\n"
        ));
    }
    text.push_str(&format!(
        "[discovery]\nnameservers = [\"{}\"]\ntimeout = \"5s\"\n",
        server.addr
    ));
    let text = ConfigText::inline(text, ".".into(), "<bench>");
    let spec = Arc::new(cutover::plan::validate(&text).expect("validates"));
    let shared = SharedState::default();
    shared.discovery.configure(&spec.discovery);
    let primed = runtime.block_on(shared.discovery.prime(&spec, Duration::from_secs(20)));
    let generation = build(spec, GenerationId(1), &shared).expect("builds");
    drop(primed);
    let upstream = |name: &str| Arc::clone(generation.upstream(name).expect("built"));
    for name in ["dns_p2c", "dns_hash"] {
        let members = upstream(name).members().backends.len();
        assert_eq!(
            members, MEMBERS as usize,
            "{name}: the name gave {members} members"
        );
    }

    let mut group = c.benchmark_group("pick_1000_members");
    for name in ["fixed_p2c", "dns_p2c"] {
        let upstream = upstream(name);
        group.bench_function(name, |b| {
            b.iter(|| black_box(upstream.pick(&upstream.members()).is_some()))
        });
    }
    let keys: Vec<u64> = (0..1024u32)
        .map(|k| hash_key(format!("user-{k}").as_bytes()))
        .collect();
    for name in ["fixed_hash", "dns_hash"] {
        let upstream = upstream(name);
        let mut i = 0;
        group.bench_function(name, |b| {
            b.iter(|| {
                i = (i + 1) % keys.len();
                black_box(upstream.pick_hashed(&upstream.members(), keys[i]).is_some())
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("refresh_1000_members");
    group.sample_size(20);
    for name in ["dns_p2c", "dns_hash"] {
        let upstream = upstream(name);
        let membership = Arc::clone(upstream.membership().expect("discovered"));
        group.bench_function(format!("rebuild_{name}"), |b| {
            b.iter(|| membership.rebuild())
        });
    }
    group.finish();
    drop(server);
}

criterion_group!(benches, bench_discovery);
criterion_main!(benches);
