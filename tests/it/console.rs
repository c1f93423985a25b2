//! The admin page as an operator console (issue 34), driven in a real
//! headless Chromium through ChromeDriver (WebDriver over HTTP): confirm
//! and abort a pending generation by clicking (a double click is one
//! action; a page showing an old generation gets the 409 and says so),
//! roll back by clicking, preview a pasted candidate, the charts of a
//! canary whose two series count what the generations' ledgers count,
//! a phone-width layout without sideways scrolling, and a cross-origin
//! form post that changes nothing. The screenshots it takes are the ones
//! `docs/operations.md` shows (`CUTOVER_SCREENSHOTS=1` writes them to
//! `docs/img/`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::Request;
use serde_json::{json, Value};

use crate::harness::*;
use crate::observability::installed;

/// A WebDriver session on a ChromeDriver of our own; the browser is shut
/// and the driver killed on drop.
struct Driver {
    child: Child,
    addr: SocketAddr,
    session: String,
    _profile: tempfile::TempDir,
}

impl Driver {
    async fn start(chromedriver: &Path, chromium: &Path) -> Driver {
        let mut child = Command::new(chromedriver)
            .arg("--port=0")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let stdout = child.stdout.take().expect("stdout");
        let port = tokio::task::spawn_blocking(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines() {
                let line = line.ok()?;
                if let Some(rest) = line.split("started successfully on port ").nth(1) {
                    return rest.trim_end_matches('.').trim().parse::<u16>().ok();
                }
            }
            None
        })
        .await
        .unwrap()
        .expect("chromedriver says its port");
        let profile = tempfile::tempdir().unwrap();
        let mut driver = Driver {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            session: String::new(),
            _profile: profile,
        };
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1280,1000",
        ];
        let mut args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        args.push(format!(
            "--user-data-dir={}",
            driver._profile.path().display()
        ));
        let answer = driver
            .call(
                "POST",
                "/session",
                json!({ "capabilities": { "alwaysMatch": { "browserName": "chrome",
                    "goog:chromeOptions": { "binary": chromium, "args": args } } } }),
            )
            .await;
        driver.session = answer["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {answer}"))
            .to_owned();
        driver
    }

    async fn call(&self, method: &str, path: &str, body: Value) -> Value {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", self.addr.to_string())
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let (_, _, bytes) = send(self.addr, req).await.expect("chromedriver answers");
        let answer: Value = serde_json::from_slice(&bytes).expect("WebDriver JSON");
        answer["value"].clone()
    }

    fn at(&self, path: &str) -> String {
        format!("/session/{}{path}", self.session)
    }

    async fn go(&self, url: &str) {
        self.call("POST", &self.at("/url"), json!({ "url": url }))
            .await;
    }

    /// Runs `script` (a function body) in the page; its return value.
    async fn script(&self, script: &str) -> Value {
        self.call(
            "POST",
            &self.at("/execute/sync"),
            json!({ "script": script, "args": [] }),
        )
        .await
    }

    /// Waits (bounded) until `condition` (an expression) holds in the page.
    async fn wait(&self, condition: &str, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if self.script(&format!("return !!({condition});")).await == json!(true) {
                return;
            }
            if Instant::now() > deadline {
                let text = self.script("return document.body.innerText;").await;
                panic!("{what}: `{condition}` never held; the page said:\n{text}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A WebDriver click on the element `css` selects: scrolled into
    /// view, refused if something covers it; found again if the page
    /// re-rendered it in between.
    async fn click(&self, css: &str) {
        let mut clicked = Value::Null;
        for _ in 0..5 {
            let found = self
                .call(
                    "POST",
                    &self.at("/element"),
                    json!({ "using": "css selector", "value": css }),
                )
                .await;
            let id = found
                .as_object()
                .and_then(|o| o.values().next())
                .and_then(Value::as_str)
                .unwrap_or_else(|| panic!("no element {css}: {found}"))
                .to_owned();
            clicked = self
                .call("POST", &self.at(&format!("/element/{id}/click")), json!({}))
                .await;
            if clicked["error"] != "stale element reference" {
                break;
            }
        }
        assert!(clicked.is_null(), "click on {css}: {clicked}");
    }

    async fn resize(&self, width: u32, height: u32) {
        self.call(
            "POST",
            &self.at("/window/rect"),
            json!({ "width": width, "height": height }),
        )
        .await;
    }

    async fn screenshot(&self, name: &str) {
        use base64::Engine as _;
        let png = self.call("GET", &self.at("/screenshot"), json!({})).await;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap_or_default())
            .expect("a PNG");
        let dir = if std::env::var_os("CUTOVER_SCREENSHOTS").is_some() {
            workspace().join("docs/img")
        } else {
            std::env::temp_dir()
        };
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // Shuts the browser (blocking: this may run while a test panics).
        if !self.session.is_empty() {
            use std::io::{Read, Write};
            if let Ok(mut stream) = std::net::TcpStream::connect(self.addr) {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                let _ = write!(
                    stream,
                    "DELETE /session/{} HTTP/1.1\r\nHost: {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    self.session, self.addr
                );
                let _ = stream.read_to_end(&mut Vec::new());
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the headline must say for the seconds it names (`to`, the last
/// one, and how many): the timeline's requests over them, per second.
async fn headline_of_the_timeline(gw: &Gateway, to: u64, seconds: u64) -> String {
    let (_, timeline) = admin_request(gw.admin, "GET", "/admin/runtime/timeline", None, None).await;
    let requests: u64 = timeline["points"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["t"].as_u64().is_some_and(|t| t + seconds > to && t <= to))
        .flat_map(|p| p["roles"].as_array().unwrap().iter())
        .map(|r| r["requests"].as_u64().unwrap())
        .sum();
    format!("{:.1}", requests as f64 / seconds as f64)
}

/// The console's headline under `--virtual-time-budget` (what
/// docs/operations.md gives for incident screenshots), where the page's
/// own clock runs ahead of the gateway's: it shows the gateway's rate
/// over the gateway's seconds, the same figure the timeline gives, and
/// near what the client offers (issue 70 item 1: it showed 2.0 req/s
/// for 100).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_headline_is_the_gateways_rate_even_under_virtual_time() {
    let Some(chromium) = installed("chromium") else {
        eprintln!(
            "SKIPPED: chromium is not installed (apt-get install chromium; .ci/run installs it)"
        );
        return;
    };
    let backend = Backend::named("a").await;
    let gw = Gateway::start(&proxy_config(backend.addr, ""));
    let web = gw.listener("web");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sending = std::sync::Arc::clone(&stop);
    // About 100 requests a second, on keep-alive connections of its own.
    let traffic = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        let mut sent = 0u64;
        while !sending.load(std::sync::atomic::Ordering::Relaxed) && sent < 3_000 {
            tick.tick().await;
            let (status, _, _) = get(web, "api.test", "/").await;
            assert_eq!(status, 200);
            sent += 1;
        }
        sent
    });
    tokio::time::sleep(Duration::from_secs(4)).await;
    let out = headless_dom(chromium, format!("{}/admin/?poll", gw.admin_url())).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent = traffic.await.unwrap();
    let dom = String::from_utf8_lossy(&out.stdout);
    let start = dom.find(r#"id="rate-requests""#).expect("the headline");
    let element = &dom[start..start + dom[start..].find("</span>").unwrap()];
    let attribute = |name: &str| -> u64 {
        let at = element
            .find(&format!("{name}=\""))
            .unwrap_or_else(|| panic!("{name} in {element}"));
        let value = &element[at + name.len() + 2..];
        value[..value.find('"').unwrap()].parse().unwrap()
    };
    let (to, seconds) = (attribute("data-to"), attribute("data-seconds"));
    let shown = &element[element.rfind('>').unwrap() + 1..];
    assert_eq!(
        shown,
        headline_of_the_timeline(&gw, to, seconds).await,
        "{element}"
    );
    let rate: f64 = shown.parse().unwrap();
    assert!(
        (40.0..=130.0).contains(&rate),
        "{rate} req/s shown while about 100 a second were sent ({sent} in all)"
    );
}

/// A WAF shadow stage and the blocks over time (DESIGN §24): after a
/// WAF shadow refused a paranoia 4 candidate, the page shows its
/// per-route table (the share the candidate would refuse, its interval,
/// the rules) instead of the copies' one, and a chart of the share the
/// firewall refused once it refused something.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_a_waf_shadow_and_the_blocks_over_time() {
    let Some(chromium) = installed("chromium") else {
        eprintln!(
            "SKIPPED: chromium is not installed (apt-get install chromium; .ci/run installs it)"
        );
        return;
    };
    let Some((root, gw)) = crate::waf_change::at_paranoia_1() else {
        return;
    };
    let web = gw.listener("web");
    for _ in 0..10 {
        let (status, _, _) = get(web, "shop.test", "/item?id=1%27%20OR%20%271%27%3D%271").await;
        assert_eq!(status, 403);
    }
    let mix = crate::waf_change::Mix::start(web, 2, crate::waf_change::benign);
    let (status, answer) = post_json(
        gw.admin,
        "/admin/runtime/activate",
        json!({
            "config": crate::waf_change::crs_at(&root, 4),
            "expected_generation": 1,
            "shadow": { "waf": true, "percent": 100, "duration": "20s",
                        "min_requests": 30, "max_block_increase": 0.05 },
        }),
    )
    .await;
    let (_, refused, errors) = mix.stop().await;
    assert!(
        errors.is_empty() && refused == 0,
        "{refused} refused, {errors:?}"
    );
    assert_eq!(status, 409, "{answer:#}");
    assert_eq!(answer["shadow"]["verdict"], "breached", "{answer:#}");
    let out = headless_dom(chromium, format!("{}/admin/?poll", gw.admin_url())).await;
    let dom = String::from_utf8_lossy(&out.stdout);
    let table = dom
        .find(r#"<table id="shadow-waf""#)
        .map(|at| &dom[at..at + dom[at..].find("</table>").unwrap()])
        .unwrap_or_else(|| panic!("no WAF shadow table: {dom}"));
    assert!(
        !table[..table.find('>').unwrap()].contains("hidden"),
        "{table}"
    );
    assert!(table.contains("<td>app</td>"), "{table}");
    assert!(table.contains("949110 ("), "the rules: {table}");
    assert!(dom.contains("Last WAF shadow stage"), "the title");
    assert!(
        dom.contains("refused by the WAF"),
        "no chart of the blocks: {dom}"
    );
}

/// Every line of every chart against the server's timeline: each of its
/// seconds lists its role with its generation (a line never spans a
/// generation change), and its seconds follow one another with no
/// second missing from the timeline between them (a line never spans a
/// gap where the role was not measured).
async fn chart_lines_follow_the_timeline(gw: &Gateway, driver: &Driver) {
    let lines = driver
        .script(
            "return [...document.querySelectorAll('#charts polyline.series')].map((p) => \
               [p.getAttribute('data-role'), Number(p.getAttribute('data-generation')), p.getAttribute('data-times').split(',').map(Number)]);",
        )
        .await;
    let (_, timeline) = admin_request(gw.admin, "GET", "/admin/runtime/timeline", None, None).await;
    let points = timeline["points"].as_array().unwrap();
    let has = |t: u64, role: &str, generation: u64| {
        points.iter().any(|p| {
            p["t"] == t
                && p["roles"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|r| r["role"] == role && r["generation"] == generation)
        })
    };
    let lines = lines.as_array().unwrap();
    assert!(lines.len() >= 3, "{lines:?}");
    for line in lines {
        let (role, generation) = (line[0].as_str().unwrap(), line[1].as_u64().unwrap());
        let times: Vec<u64> = line[2]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect();
        for pair in times.windows(2) {
            let between = points
                .iter()
                .filter(|p| p["t"].as_u64().is_some_and(|t| t > pair[0] && t < pair[1]))
                .count();
            assert_eq!(between, 0, "{line}: a line across seconds the timeline has");
            assert!(pair[1] - pair[0] <= 2, "{line}: a line across a gap");
        }
        for t in times {
            assert!(
                has(t, role, generation),
                "{line}: second {t} is not {role} {generation}"
            );
        }
    }
}

fn tools() -> Option<(PathBuf, PathBuf)> {
    match (installed("chromedriver"), installed("chromium")) {
        (Some(driver), Some(chromium)) => Some((driver, chromium)),
        _ => {
            eprintln!(
                "SKIPPED: chromium or chromedriver is not installed \
                 (apt-get install chromium chromium-driver; .ci/run installs them)"
            );
            None
        }
    }
}

async fn activate_json(gw: &Gateway, body: Value) -> Value {
    let (status, answer) = post_json(gw.admin, "/admin/runtime/activate", body).await;
    assert_eq!(status, 200, "{answer}");
    answer
}

fn page_says(text: &str) -> String {
    format!(
        "document.getElementById('action-result').textContent.includes({})",
        json!(text)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_confirms_aborts_rolls_back_and_previews_by_clicking() {
    let Some((chromedriver, chromium)) = tools() else {
        return;
    };
    let backend = Backend::named("a").await;
    let config = |timeout: &str| proxy_config(backend.addr, &format!("timeout = \"{timeout}\""));
    let gw = Gateway::start(&config("15s"));
    activate_json(
        &gw,
        json!({ "config": config("3s"), "requested_by": "pipeline" }),
    )
    .await;
    activate_json(
        &gw,
        json!({ "config": config("5s"), "confirm_within": "10m" }),
    )
    .await;
    let driver = Driver::start(&chromedriver, &chromium).await;
    let page = format!("{}/admin/", gw.admin_url());
    driver.go(&page).await;
    driver
        .wait(
            "!document.getElementById('actions').hidden",
            "the pending actions show",
        )
        .await;
    driver
        .wait(
            "document.getElementById('confirm').textContent === 'Confirm generation 3'",
            "the confirm button names the pending generation",
        )
        .await;
    driver.screenshot("console-1280.png").await;

    // A page that shows an old active generation: the API's 409, said.
    driver
        .script("shown = Object.assign({}, shown, { active_generation: 2 }); document.getElementById('confirm').click(); return true;")
        .await;
    driver
        .wait(
            &page_says("refused (409 generation_conflict)"),
            "the 409 is shown",
        )
        .await;
    assert_eq!(gw.status().await["pending"]["generation"], 3);

    // Confirm, double-clicked: one action.
    driver
        .script("const b = document.getElementById('confirm'); b.click(); b.click(); return true;")
        .await;
    driver
        .wait(&page_says("confirmed"), "the confirmation is shown")
        .await;
    assert!(gw.status().await["pending"].is_null());
    let (_, history) = admin_request(gw.admin, "GET", "/admin/runtime/history", None, None).await;
    // The stale page's refused one, and one more: a second call would
    // have been recorded too (refused: nothing pends any more).
    let confirms: Vec<&Value> = history["operations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["kind"] == "confirm")
        .collect();
    assert_eq!(confirms.len(), 2, "a double click is one action: {history}");
    assert_eq!(confirms[0]["outcome"], "succeeded");
    assert_eq!(confirms[1]["outcome"], "conflict");
    driver
        .wait("document.getElementById('actions').hidden", "nothing pends")
        .await;

    // Abort a new pending generation by clicking.
    activate_json(
        &gw,
        json!({ "config": config("7s"), "confirm_within": "10m" }),
    )
    .await;
    driver
        .wait(
            "document.getElementById('abort').textContent === 'Abort: roll back to generation 3'",
            "the abort button names the rollback target",
        )
        .await;
    driver.click("#abort").await;
    driver
        .wait(&page_says("rolled back"), "the abort is shown")
        .await;
    let status = gw.status().await;
    assert_eq!(status["active_generation"], 5, "{status}");
    assert!(status["pending"].is_null());

    // Roll back to generation 2 from the history: two clicks.
    driver.click("li[data-generation=\"2\"]").await;
    driver
        .wait(
            "!document.getElementById('rollback').hidden && document.getElementById('rollback').textContent === 'Roll back to generation 2'",
            "the rollback button",
        )
        .await;
    driver.click("#rollback").await;
    driver
        .wait(
            "document.getElementById('rollback').textContent.startsWith('Click again')",
            "the first click arms it",
        )
        .await;
    assert_eq!(gw.active_generation().await, 5, "one click changes nothing");
    driver.click("#rollback").await;
    driver
        .wait(
            &page_says("roll back to generation 2"),
            "the rollback is shown",
        )
        .await;
    gw.wait_generation(6).await;
    let (_, detail) = admin_request(gw.admin, "GET", "/admin/runtime/history/6", None, None).await;
    assert_eq!(detail["rolled_back_to"], 2, "{detail}");

    // Preview a pasted candidate: its diff, nothing activated.
    let candidate = config("9s");
    driver
        .script(&format!(
            "document.getElementById('candidate').value = {}; return true;",
            json!(candidate)
        ))
        .await;
    driver.click("#preview").await;
    driver
        .wait(
            "document.getElementById('preview-summary').textContent.startsWith('activatable against generation 6')",
            "the preview's plan",
        )
        .await;
    driver
        .wait(
            "[...document.querySelectorAll('#preview-diff td.add')].some((td) => td.textContent.includes('timeout = \"9s\"'))",
            "the preview's diff",
        )
        .await;
    assert_eq!(gw.active_generation().await, 6);

    // A canary: the charts' two series count what the ledgers count.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let canary = activate_json(
        &gw,
        json!({ "config": config("11s"), "expected_generation": 6,
                "steps": [50, 100], "step_interval": "10m", "confirm_within": "20m" }),
    )
    .await;
    assert_eq!(canary["pending"]["canary_percent"], 50, "{canary}");
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    for _ in 0..200 {
        let (status, _, _) = get(gw.listener("web"), "api.test", "/").await;
        assert_eq!(status, 200);
    }
    let ledgers = gw.status().await["generations"].clone();
    let requests = |id: u64| {
        ledgers
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["generation"] == id)
            .map_or(0, |g| g["requests"].as_u64().unwrap())
    };
    let (pending, previous) = (requests(7), requests(6));
    assert_eq!(pending + previous, 200, "{ledgers}");
    assert!(pending > 40 && previous > 40, "{ledgers}");
    // A role's lines for one generation (a gap or a late second may cut
    // it in several), their requests added.
    let series = |role: &str, generation: u64| {
        format!(
            "[...document.querySelectorAll('#charts figure:first-child polyline.series.{role}[data-generation=\"{generation}\"]')]\
               .reduce((n, e) => n + Number(e.getAttribute('data-total')), 0)"
        )
    };
    driver
        .wait(
            &format!(
                "{} === {pending} && {} === {previous}",
                series("pending", 7),
                series("previous", 6)
            ),
            "the requests/s chart's two series match the ledgers",
        )
        .await;
    let legend = driver
        .script("return document.querySelector('#charts .legend').textContent;")
        .await;
    assert!(
        legend
            .as_str()
            .unwrap()
            .contains("pending (generation 7, canary 50 %)")
            && legend
                .as_str()
                .unwrap()
                .contains("previous (generation 6, takes 50 %)"),
        "{legend}"
    );
    // The canary's share, where the pending generation is shown.
    driver
        .wait(
            "document.getElementById('canary').textContent.startsWith('CANARY: generation 7 takes 50 % of new requests, generation 6 takes 50 % (step 1 of 2: 50 %, 100 %; next: 100 % in')",
            "the canary's share and step",
        )
        .await;
    let roles = driver
        .script("return [...document.querySelectorAll('#live tbody tr')].map((tr) => tr.children[1].textContent);")
        .await;
    assert!(
        roles
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r == "previous: takes 50 % of new requests")
            && roles
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r == "canary: takes 50 % of new requests"),
        "{roles}"
    );
    chart_lines_follow_the_timeline(&gw, &driver).await;
    // Without virtual time too, the headline is the timeline's.
    let headline = driver
        .script("const h = document.getElementById('rate-requests'); return [h.textContent, Number(h.dataset.to), Number(h.dataset.seconds)];")
        .await;
    assert_eq!(
        headline[0].as_str().unwrap(),
        headline_of_the_timeline(
            &gw,
            headline[1].as_u64().unwrap(),
            headline[2].as_u64().unwrap()
        )
        .await,
        "{headline}"
    );
    // Activations are marked on the time axis; a refused one (a stale
    // expected_generation: 409) is marked apart from those that took.
    let (status, _) = post_json(
        gw.admin,
        "/admin/runtime/activate",
        json!({ "config": config("12s"), "expected_generation": 2 }),
    )
    .await;
    assert_eq!(status, 409);
    driver
        .wait(
            // The double click's refused confirm is marked too when it
            // falls inside the charts' window: only the activation is
            // counted here.
            "document.querySelectorAll('#charts figure:first-child line.event.refused[data-outcome=\"conflict\"][data-kind=\"activate\"]').length === 1",
            "the refused activation's mark",
        )
        .await;
    let marks = driver
        .script("return [...document.querySelectorAll('#charts figure:first-child line.event')].map((l) => [l.getAttribute('class'), l.getAttribute('data-outcome')]);")
        .await;
    let marks = marks.as_array().unwrap();
    assert!(
        marks
            .iter()
            .filter(|m| m[0].as_str().unwrap().contains("done"))
            .count()
            >= 4,
        "{marks:?}"
    );
    for mark in marks {
        let class = mark[0].as_str().unwrap();
        let refused = ["rejected", "conflict", "failed"].contains(&mark[1].as_str().unwrap());
        assert_eq!(class.contains("refused"), refused, "{mark}");
        assert_eq!(class.contains("done"), !refused, "{mark}");
    }
    // Each label has a row of its own where it does not fit beside
    // another: no two drawn labels overlap.
    let overlaps = driver
        .script(
            "const boxes = [...document.querySelectorAll('#charts figure:first-child text.event-label')].map((t) => t.getBoundingClientRect());\
             const texts = [...document.querySelectorAll('#charts figure:first-child text.event-label')].map((t) => t.textContent);\
             return boxes.flatMap((a, i) => boxes.map((b, j) => [i, j, b]).filter(([i, j, b]) => j > i && a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom)\
               .map(([i, j]) => `${texts[i]} [${boxes[i].left}..${boxes[i].right}, ${boxes[i].top}..${boxes[i].bottom}] over ${texts[j]} [${boxes[j].left}..${boxes[j].right}, ${boxes[j].top}..${boxes[j].bottom}]`));",
        )
        .await;
    assert_eq!(overlaps, json!([]), "event labels drawn over each other");
    // The 5xx axis carries its unit.
    let unit = driver
        .script(
            "return document.querySelector('#charts figure:nth-child(2) text.unit').textContent;",
        )
        .await;
    assert_eq!(unit, "%");
    driver.script("window.scrollTo(0, 0); return true;").await;
    driver.screenshot("console-canary.png").await;

    // A phone's width: nothing scrolls sideways but the wide tables.
    driver.resize(390, 844).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let wider = driver
        .script(
            "return [...document.querySelectorAll('body *')]\
               .filter((e) => e.getBoundingClientRect().right > window.innerWidth + 1 && !e.closest('.scroll') && !e.closest('svg'))\
               .map((e) => `${e.tagName}#${e.id}.${e.className.baseVal ?? e.className}`);",
        )
        .await;
    assert_eq!(wider, json!([]), "wider than a phone");
    driver
        .wait(
            "document.documentElement.scrollWidth <= window.innerWidth + 1",
            "the page fits a phone's width",
        )
        .await;
    driver.script("window.scrollTo(0, 0); return true;").await;
    driver.screenshot("console-phone.png").await;

    // A page of another origin posts a form to confirm: refused, the
    // generation still pends.
    let admin = gw.admin;
    let evil = Backend::start(std::sync::Arc::new(move |_req| {
        let form = format!(
            "<!doctype html><form id=f method=post enctype=text/plain action=\"http://{admin}/admin/runtime/confirm\">\
             <input name='{{\"generation\":7,\"x\":\"' value='\"}}'></form><script>document.getElementById('f').submit()</script>"
        );
        Box::pin(async move {
            let mut response = hyper::Response::new(full(form));
            response
                .headers_mut()
                .insert("content-type", "text/html".parse().unwrap());
            response
        })
    }))
    .await;
    driver.go(&format!("http://{}/", evil.addr)).await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let status = gw.status().await;
    assert_eq!(
        status["pending"]["generation"], 7,
        "still pending: {status}"
    );
    assert_eq!(status["active_generation"], 7);
}

/// The console acts on proposals (DESIGN §23), in headless Chromium
/// logged in as an approver: it lists the open ones with what they would
/// change, rejects one with the reason typed beside it and approves the
/// other, which is carried out and recorded with the approver's name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approver_rejects_and_approves_proposals_by_clicking() {
    use base64::Engine as _;
    use sha2::Digest as _;
    let Some((chromedriver, chromium)) = tools() else {
        return;
    };
    let (bob, alice) = ("bob-token-0123456789abcdef", "alice-token-0123456789abcd");
    let hash = |token: &str| -> String {
        sha2::Sha256::digest(token.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let text = |body: &str| {
        format!(
            r#"[admin]
bind = "127.0.0.1:0"

[admin.approval]
required_for = ["activate"]

[[admin.callers]]
name = "bob"
token_sha256 = "{}"
scopes = ["read", "activate"]

[[admin.callers]]
name = "alice"
token_sha256 = "{}"
scopes = ["read", "approve"]

[[listeners]]
name = "web"
bind = "127.0.0.1:0"

[[routes]]
name = "hello"
listeners = ["web"]
respond = {{ body = "{body}" }}
"#,
            hash(bob),
            hash(alice)
        )
    };
    let gw = Gateway::start(&text("one"));
    let propose = |body: &str, reason: &str| {
        let req = Request::post(format!("/admin/runtime/activate?reason={reason}"))
            .header("host", gw.admin.to_string())
            .header("authorization", format!("Bearer {bob}"))
            .header("content-type", "application/toml")
            .body(Full::new(Bytes::from(text(body))))
            .unwrap();
        send(gw.admin, req)
    };
    let (status, _, answer) = propose("two", "ship-two").await.unwrap();
    assert_eq!(status, 202, "{}", String::from_utf8_lossy(&answer));
    let (status, _, _) = propose("three", "ship-three").await.unwrap();
    assert_eq!(status, 202);

    let driver = Driver::start(&chromedriver, &chromium).await;
    // Logged in as alice: every request of the page carries her
    // credentials, as a browser sends them after the login prompt.
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("alice:{alice}"));
    driver
        .call(
            "POST",
            &driver.at("/goog/cdp/execute"),
            json!({ "cmd": "Network.enable", "params": {} }),
        )
        .await;
    driver
        .call(
            "POST",
            &driver.at("/goog/cdp/execute"),
            json!({ "cmd": "Network.setExtraHTTPHeaders",
                    "params": { "headers": { "Authorization": format!("Basic {basic}") } } }),
        )
        .await;
    driver.go(&format!("{}/admin/", gw.admin_url())).await;
    driver
        .wait(
            "document.querySelectorAll('#proposals tbody tr').length === 2",
            "both proposals are listed",
        )
        .await;
    let listed = driver
        .script("return document.getElementById('proposals').innerText;")
        .await;
    let listed = listed.as_str().unwrap_or_default();
    assert!(
        listed.contains("bob") && listed.contains("ship-two") && listed.contains("~1"),
        "{listed}"
    );
    driver.screenshot("console-proposals").await;

    // Reject the second: no reason, no rejection; then with one.
    driver
        .click("tr[data-proposal='p-000002'] button.reject")
        .await;
    driver
        .wait(&page_says("takes a reason"), "a reason is asked for")
        .await;
    // The reason is typed, and the table is rebuilt by a refresh before
    // the click (as it is every 1.5 s): what was typed, the focus and the
    // caret stay with the row.
    driver
        .script(
            "const input = document.querySelector(\"tr[data-proposal='p-000002'] input\");
             input.focus(); input.value = 'not this week'; input.setSelectionRange(4, 4);
             window.typedInto = input; return true;",
        )
        .await;
    driver
        .wait(
            "document.querySelector(\"tr[data-proposal='p-000002'] input\") !== window.typedInto",
            "a refresh rebuilds the table",
        )
        .await;
    let kept = driver
        .script(
            "const input = document.querySelector(\"tr[data-proposal='p-000002'] input\");
             return [input.value, document.activeElement === input, input.selectionStart];",
        )
        .await;
    assert_eq!(kept, json!(["not this week", true, 4]));
    driver
        .click("tr[data-proposal='p-000002'] button.reject")
        .await;
    driver
        .wait(
            &page_says("reject p-000002: rejected"),
            "the rejection is shown",
        )
        .await;
    driver
        .click("tr[data-proposal='p-000001'] button.approve")
        .await;
    driver
        .wait(
            &page_says("approve p-000001: executed (generation 2 active)"),
            "the approval is carried out",
        )
        .await;
    driver
        .wait(
            "document.getElementById('proposals-section').hidden",
            "no open proposal is left",
        )
        .await;
    assert_eq!(get(gw.listener("web"), "x", "/").await.2, "two");
    let req = Request::get("/admin/runtime/proposals")
        .header("host", gw.admin.to_string())
        .header("authorization", format!("Bearer {alice}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (_, _, bytes) = send(gw.admin, req).await.unwrap();
    let proposals: Value = serde_json::from_slice(&bytes).unwrap();
    let proposals = proposals["proposals"].as_array().unwrap();
    assert_eq!(proposals[0]["state"], "rejected");
    assert_eq!(proposals[0]["rejection"]["caller"], "alice");
    assert_eq!(proposals[0]["rejection"]["reason"], "not this week");
    assert_eq!(proposals[1]["state"], "executed");
    assert_eq!(proposals[1]["approvals"][0]["caller"], "alice");
}
