//! The WAF engine in process: the OWASP Core Rule Set v4.28.0 loaded
//! (read, checked, every regular expression compiled), and one request
//! evaluated through phases 1 and 2 at paranoia level 1 in blocking mode
//! (CRS's default set-up): a benign GET with a browser's headers, and a
//! 4 KiB URL-encoded POST of benign form fields. Needs the rule set
//! beside the project (`../shared/crs`); says so and measures nothing
//! without it. Run: `cargo bench --bench waf`.

use std::hint::black_box;
use std::path::PathBuf;

/// The same allocator the `cutover` binary uses.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{criterion_group, criterion_main, Criterion};
use cutover::waf::{conf_files, Mode, Request, RuleSet, Transaction};

fn crs_files() -> Option<Vec<PathBuf>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/crs");
    let mut files = vec![root.join("crs-setup.conf.example")];
    files.extend(conf_files(&root.join("rules")).ok()?);
    Some(files)
}

fn headers() -> Vec<(String, Vec<u8>)> {
    [
        ("Host", "shop.example.com"),
        (
            "User-Agent",
            "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0",
        ),
        (
            "Accept",
            "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
        ),
        ("Accept-Language", "en-US,en;q=0.5"),
        ("Accept-Encoding", "gzip, deflate, br"),
        ("Referer", "https://shop.example.com/catalog?page=2"),
        ("Cookie", "session=6f1c2a9e4b7d8e0f; theme=dark; consent=1"),
    ]
    .into_iter()
    .map(|(n, v)| (n.to_owned(), v.as_bytes().to_vec()))
    .collect()
}

fn benign_get() -> Request {
    Request {
        id: "bench".into(),
        remote_addr: "192.0.2.10".into(),
        method: "GET".into(),
        uri: "/catalog/item/4711?color=blue&size=m&ref=newsletter".into(),
        protocol: "HTTP/1.1".into(),
        headers: headers(),
        body: Vec::new(),
    }
}

/// Form fields of ordinary text up to 4 KiB.
fn form_post() -> Request {
    let mut body = String::new();
    let mut i = 0;
    while body.len() < 4096 - 64 {
        if !body.is_empty() {
            body.push('&');
        }
        body.push_str(&format!(
            "field{i}=Please+deliver+to+the+back+door+after+five+o%27clock+thank+you+{i}"
        ));
        i += 1;
    }
    let mut headers = headers();
    headers.push((
        "Content-Type".into(),
        b"application/x-www-form-urlencoded".to_vec(),
    ));
    headers.push(("Content-Length".into(), body.len().to_string().into_bytes()));
    Request {
        id: "bench".into(),
        remote_addr: "192.0.2.10".into(),
        method: "POST".into(),
        uri: "/checkout/address".into(),
        protocol: "HTTP/1.1".into(),
        headers,
        body: body.into_bytes(),
    }
}

fn bench_waf(c: &mut Criterion) {
    let Some(files) = crs_files() else {
        eprintln!("waf bench: ../shared/crs is not beside the project; nothing measured");
        return;
    };
    let mut group = c.benchmark_group("waf");
    group.sample_size(10);
    group.bench_function("load_crs", |b| {
        b.iter(|| black_box(RuleSet::load(&files).expect("CRS loads")))
    });
    drop(group);
    let set = RuleSet::load(&files).expect("CRS loads");
    let mut group = c.benchmark_group("waf");
    for (name, request) in [("benign_get", benign_get()), ("form_post_4k", form_post())] {
        // Benign: nothing is blocked (held here, or the figure would be
        // of a different path).
        let mut t = Transaction::new(&set, &request, Mode::Block);
        assert_eq!(t.request(), None, "{name} is blocked: {:?}", t.matches);
        group.bench_function(name, |b| {
            b.iter(|| {
                let mut t = Transaction::new(&set, &request, Mode::Block);
                black_box(t.request())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_waf);
criterion_main!(benches);
