//! What the benchmarks share: configurations and starting the binary.

// Each benchmark uses only some of these.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// Starts the real `cutover` binary on `config` and waits for its ready
/// line; returns the child and the ready line's JSON (addresses, pid).
pub fn start_gateway(config: &std::path::Path) -> (Child, serde_json::Value) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cutover"))
        .args(["run", "-c"])
        .arg(config)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start cutover");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let ready = loop {
        let line = lines
            .next()
            .expect("cutover exited before ready")
            .expect("read");
        if line.contains("\"event\":\"ready\"") {
            break line;
        }
    };
    // Keep draining stdout so that the gateway never blocks on it.
    std::thread::spawn(move || for _ in lines {});
    (child, serde_json::from_str(&ready).expect("ready JSON"))
}

/// A configuration with `n` routes over `n / 10` upstreams: a quarter
/// exact hosts, a quarter wildcards, a quarter host-less prefixes, a
/// quarter regexes (unique to `salt`, so that nothing is cached).
pub fn mixed_config(n: usize, salt: u64) -> String {
    let mut out = String::from("[admin]\nbind = \"127.0.0.1:0\"\n\n[[listeners]]\nname = \"web\"\nbind = \"127.0.0.1:0\"\n\n");
    let upstreams = (n / 10).max(1);
    for i in 0..n {
        let matcher = match i % 4 {
            0 => format!("hosts = [\"svc{i}.example.com\"]\npath_prefix = \"/api/{i}/\""),
            1 => format!("hosts = [\"*.tenant{i}.example.com\"]\npath_prefix = \"/\""),
            2 => format!("path_prefix = \"/static/{i}/\""),
            _ => format!(
                "hosts = [\"re{i}.example.com\"]\npath_regex = \"^/items/[0-9]+/{i}/{salt}$\""
            ),
        };
        out.push_str(&format!(
            "[[routes]]\nname = \"r{i}\"\nlisteners = [\"web\"]\n{matcher}\nupstream = \"u{}\"\n\n",
            i % upstreams
        ));
    }
    for u in 0..upstreams {
        out.push_str(&format!(
            "[upstreams.u{u}]\nbackends = [{{ addr = \"127.0.0.1:{}\" }}]\n\n",
            10000 + u
        ));
    }
    out
}
