//! The tables and frames ctl prints: history, cache zones, fleet,
//! one `ctl status` frame. Pure functions of an admin answer, so each can
//! be read against a golden file.

use serde::Serialize;
use serde_json::Value;

use crate::control::{BackendsView, CacheView, HistoryView, StatusView};
#[cfg(feature = "fleet")]
use crate::fleet::FleetStatus;
use crate::ids::GenerationId;

/// An enum as the admin API spells it (`auto_rollback`, `startup`).
pub(super) fn spelled(value: &impl Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(text)) => text,
        Ok(other) => other.to_string(),
        Err(_) => "-".into(),
    }
}

pub(super) fn or_dash(id: Option<GenerationId>) -> String {
    id.map_or("-".into(), |id| id.to_string())
}

pub(super) fn yes_no(flag: bool) -> &'static str {
    if flag {
        "yes"
    } else {
        "no"
    }
}

/// `ctl fleet status`: one line per instance.
#[cfg(feature = "fleet")]
pub(super) fn fleet_table(fleet: &FleetStatus) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "fleet {}: generation {} ({}), {} of {} instances synced",
        fleet.prefix,
        or_dash(fleet.active.as_ref().map(|a| a.generation)),
        fleet
            .active
            .as_ref()
            .map_or("-", |a| a.config_version.as_str()),
        fleet.synced,
        fleet.total
    );
    let _ = writeln!(
        out,
        "{:<20} {:<9} {:>10}  {:<5}  error",
        "instance", "status", "generation", "drift"
    );
    for i in &fleet.instances {
        let _ = writeln!(
            out,
            "{:<20} {:<9} {:>10}  {:<5}  {}",
            i.instance,
            i.status,
            or_dash(i.generation),
            yes_no(i.drift),
            i.error.as_deref().unwrap_or("")
        );
    }
    out
}

/// `ctl cache show`: one line per zone, and its disk beneath it.
pub(super) fn zones_table(view: &CacheView) -> String {
    use std::fmt::Write;
    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    let mut out = String::new();
    if view.zones.is_empty() {
        let _ = writeln!(
            out,
            "no cache zone (no route of the active generation names one)"
        );
        return out;
    }
    let _ = writeln!(
        out,
        "{:<16} {:>20} {:>9} {:>10} {:>10} {:>6} {:>9} {:>9} {:>9}  routes",
        "zone",
        "MiB used/capacity",
        "objects",
        "hits",
        "misses",
        "hit %",
        "stored",
        "evicted",
        "purged"
    );
    for z in &view.zones {
        let lookups = z.hits + z.misses;
        let ratio = if lookups == 0 {
            "-".to_owned()
        } else {
            format!("{:.1}", 100.0 * z.hits as f64 / lookups as f64)
        };
        let _ = writeln!(
            out,
            "{:<16} {:>20} {:>9} {:>10} {:>10} {:>6} {:>9} {:>9} {:>9}  {}",
            z.name,
            format!("{:.1}/{:.1}", mib(z.bytes), mib(z.capacity_bytes)),
            z.objects,
            z.hits,
            z.misses,
            ratio,
            z.stored,
            z.evicted,
            z.purged,
            z.routes.join(",")
        );
        if let Some(d) = &z.disk {
            let _ = writeln!(
                out,
                "  disk {}: {:.1}/{:.1} MiB, {} written, {} read, {} evicted, {} corrupt, {} failed, {} dropped",
                d.path,
                mib(d.bytes),
                mib(d.capacity_bytes),
                d.written,
                d.read,
                d.evicted,
                d.corrupt,
                d.errors,
                d.dropped
            );
        }
    }
    out
}

/// The facts of one `ctl status` frame, as text.
pub(super) fn status_frame(
    status: &StatusView,
    backends: Option<&BackendsView>,
    history: Option<&HistoryView>,
    rates: Option<(f64, f64)>,
) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "cutover pid {}  {}  generation {}  config {}  activated {}",
        status.pid,
        status.phase.as_str(),
        status.active_generation,
        status.config_version,
        status.activated_at,
    );
    if let Some(pending) = &status.pending {
        let when = pending
            .seconds_left
            .map_or("when its guard says so".to_owned(), |s| {
                format!("in {s:.0}s unless confirmed")
            });
        let _ = writeln!(
            out,
            "PENDING: generation {} rolls back to {} {when}",
            pending.generation, pending.rollback_to,
        );
    }
    if let Some(shadow) = status
        .shadow
        .as_ref()
        .filter(|s| s.verdict == crate::runtime::shadow::ShadowVerdict::Running)
    {
        let _ = writeln!(
            out,
            "SHADOW: candidate generation {} for {:.0}s so far, {} requests compared, 5xx {:.2} % (active {:.2} %)",
            shadow.candidate_generation,
            shadow.seconds,
            shadow.total.compared,
            shadow.total.candidate.error_ratio * 100.0,
            shadow.total.active.error_ratio * 100.0,
        );
    }
    match rates {
        Some((requests, errors)) => {
            let ratio = if requests > 0.0 {
                errors / requests * 100.0
            } else {
                0.0
            };
            let _ = writeln!(
                out,
                "requests {requests:.1}/s  errors {errors:.1}/s ({ratio:.2} %)"
            );
        }
        None => {
            let _ = writeln!(
                out,
                "requests {} answered since start, {} of them 5xx",
                status.requests_total, status.errors_total
            );
        }
    }
    let _ = writeln!(out, "\nlive generations");
    let _ = writeln!(
        out,
        "  {:>6}  {:<10} {:>9} {:>11} {:>10} {:>8}",
        "gen", "state", "inflight", "connections", "requests", "errors"
    );
    for g in &status.generations {
        let state = match g.superseded_secs {
            Some(secs) => format!("old {secs:.0}s"),
            None => "active".to_owned(),
        };
        let _ = writeln!(
            out,
            "  {:>6}  {:<10} {:>9} {:>11} {:>10} {:>8}",
            g.generation, state, g.inflight_requests, g.open_connections, g.requests, g.errors,
        );
    }
    let _ = writeln!(out, "\nbackends");
    let _ = writeln!(
        out,
        "  {:<16} {:<24} {:<10} {:<8} {:>8} {:>9} {:>9}",
        "upstream", "backend", "health", "ejected", "inflight", "attempts", "failures"
    );
    for upstream in backends.iter().flat_map(|b| &b.upstreams) {
        for b in &upstream.backends {
            let _ = writeln!(
                out,
                "  {:<16} {:<24} {:<10} {:<8} {:>8} {:>9} {:>9}",
                upstream.name,
                b.addr,
                spelled(&b.health),
                yes_no(b.ejected),
                b.inflight,
                b.attempts,
                b.failures,
            );
        }
    }
    if !status.certificates.is_empty() {
        let _ = writeln!(out, "\ncertificates");
        let _ = writeln!(
            out,
            "  {:<10} {:<6} {:<32} {:<21} {:<9} note",
            "listener", "source", "names", "not after", "ocsp"
        );
        for c in &status.certificates {
            let ocsp = c.ocsp.as_ref().map_or("-", |o| {
                if o.stapled {
                    o.status.as_deref().unwrap_or("stapled")
                } else {
                    "none"
                }
            });
            let note = c
                .acme
                .as_ref()
                .and_then(|a| {
                    a.last_error
                        .as_ref()
                        .map(|e| format!("order failed: {e}"))
                        .or_else(|| a.renew_at.as_ref().map(|r| format!("renews {r}")))
                })
                .or_else(|| c.ocsp.as_ref().and_then(|o| o.error.clone()))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "  {:<10} {:<6} {:<32} {:<21} {:<9} {}",
                c.listener,
                c.source,
                c.names.join(","),
                c.not_after.as_deref().unwrap_or("(not issued yet)"),
                ocsp,
                note,
            );
        }
    }
    let _ = writeln!(out, "\nhistory (newest first)");
    for g in history.iter().flat_map(|h| &h.generations).take(10) {
        let who = [g.requested_by.as_deref(), g.reason.as_deref()]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(": ");
        let _ = writeln!(
            out,
            "  {:>6}  {:<9} {:<13} {}  {}",
            g.generation,
            g.status,
            spelled(&g.source),
            g.activated_at,
            who,
        );
    }
    out
}

/// Rows of cells as columns, each as wide as its widest cell, two spaces
/// apart (the last column unpadded).
fn aligned(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let pad = widths[i].saturating_sub(cell.chars().count());
                line.push_str(cell);
                line.push_str(&" ".repeat(pad + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `ctl history`: the retained generations, how each pending one was
/// settled and why, which are safe to return to (activatable now and not
/// rolled back as broken), then the operation log.
pub(super) fn history_table(view: &HistoryView) -> String {
    let mut out = format!(
        "active generation {} (keeping {})\n\n",
        view.active_generation, view.history_limit
    );
    let mut rows = vec![[
        "generation",
        "status",
        "source",
        "activated",
        "config",
        "settled",
        "",
    ]
    .map(String::from)
    .to_vec()];
    for g in &view.generations {
        let settled = g.settlement.as_ref().map_or("-".to_owned(), |s| {
            match s.reason.as_deref().filter(|r| !r.is_empty()) {
                Some(reason) => format!("{}: {reason}", s.state),
                None => s.state.to_string(),
            }
        });
        let broken = g
            .settlement
            .as_ref()
            .is_some_and(|s| matches!(&*s.state, "aborted" | "auto_rolled_back"));
        let note = if g.generation == view.active_generation {
            "active"
        } else if broken {
            "rolled back: not a target"
        } else if g.rollback_candidate {
            "rollback target"
        } else {
            "not activatable now"
        };
        rows.push(vec![
            g.generation.to_string(),
            g.status.to_string(),
            match g.rolled_back_to {
                Some(to) => format!("{} of {to}", spelled(&g.source)),
                None => spelled(&g.source),
            },
            g.activated_at.clone(),
            g.config_version.chars().take(19).collect(),
            settled,
            note.to_owned(),
        ]);
    }
    out.push_str(&aligned(&rows));
    if view.operations.is_empty() {
        return out;
    }
    out.push_str("\noperations\n");
    let mut rows = vec![["id", "at", "kind", "outcome", "generation", "by", "what"]
        .map(String::from)
        .to_vec()];
    for op in &view.operations {
        let generation = match (op.generation, op.previous_generation) {
            (Some(g), Some(p)) if g != p => format!("{p} -> {g}"),
            (Some(g), _) => g.to_string(),
            (None, Some(p)) => p.to_string(),
            (None, None) => "-".into(),
        };
        let what = [
            Some(op.summary.as_str()),
            op.reason.as_deref(),
            op.error.as_deref(),
        ]
        .into_iter()
        .flatten()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
        rows.push(vec![
            op.id.clone(),
            op.at.clone(),
            spelled(&op.kind),
            spelled(&op.outcome),
            generation,
            op.requested_by.clone().unwrap_or_else(|| "-".into()),
            what,
        ]);
    }
    out.push_str(&aligned(&rows));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ctl history`'s text for `fixtures/ctl/history.json` (a guard's
    /// rollback, a confirmed generation, a manual rollback, a generation
    /// no longer activatable) is `fixtures/ctl/history.txt`, byte for
    /// byte; `CUTOVER_BLESS=1` writes it.
    #[test]
    fn history_reads_as_its_golden_file() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/ctl");
        let json = std::fs::read_to_string(dir.join("history.json")).unwrap();
        let view: HistoryView = serde_json::from_str(&json).unwrap();
        let text = history_table(&view);
        let golden = dir.join("history.txt");
        if std::env::var_os("CUTOVER_BLESS").is_some() {
            std::fs::write(&golden, &text).unwrap();
        }
        assert_eq!(text, std::fs::read_to_string(golden).unwrap_or_default());
        // What the issue asked of it: the guard's victim is not offered.
        let eight = text.lines().find(|l| l.starts_with("8 ")).unwrap();
        assert!(eight.ends_with("rolled back: not a target"), "{eight}");
        assert!(
            eight.contains("auto_rolled_back: guard: 5xx ratio 0.61"),
            "{eight}"
        );
    }
}
