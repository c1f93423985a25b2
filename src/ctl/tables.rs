//! The tables and frames ctl prints: history, cache zones, fleet,
//! one `ctl status` frame. Pure functions of an admin answer, so each can
//! be read against a golden file.

use serde::Serialize;
use serde_json::Value;

use crate::control::{Activation, BackendsView, CacheView, HistoryView, StatusView, TimelineView};
#[cfg(feature = "fleet")]
use crate::fleet::FleetStatus;
use crate::ids::GenerationId;
use crate::plan::Diff;
use crate::runtime::proposals::{ProposalRecord, ProposalState};

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

/// What an activation or a rollback did: for a rollback, what it
/// restored first; then the outcome, and what settles a pending
/// generation (its deadline, its guard, its canary's share).
pub(super) fn activation_text(activation: &Activation) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    if let Some(restored) = activation.rolled_back_to {
        let _ = writeln!(
            out,
            "rolled back to the configuration of generation {restored}, now active as generation {} (was {})",
            activation.generation, activation.previous_generation
        );
    }
    let _ = writeln!(
        out,
        "{}: generation {} (previous {}), {} in {} ms",
        activation.outcome,
        activation.generation,
        activation.previous_generation,
        activation.operation_id,
        activation.duration_ms
    );
    if let Some(pending) = &activation.pending {
        let _ = match &pending.deadline {
            Some(deadline) => writeln!(
                out,
                "pending: confirm generation {} by {deadline} or it rolls back to {}",
                pending.generation, pending.rollback_to
            ),
            None => writeln!(
                out,
                "pending: generation {} is judged by its guard (rollback to {})",
                pending.generation, pending.rollback_to
            ),
        };
        if let Some(c) = &pending.canary {
            let _ = writeln!(
                out,
                "canary: generation {} takes {} % of new requests, generation {} the rest (step {} of {})",
                pending.generation,
                c.percent,
                pending.rollback_to,
                c.step,
                c.steps.len()
            );
        }
    }
    out
}

/// A diff's summary (one count per route, upstream, listener… changed)
/// and its text.
pub(super) fn diff_text(diff: &Diff) -> String {
    let s = &diff.summary;
    let mut out = String::new();
    if !diff.changes.is_empty() {
        out = format!(
            "changes: {} added, {} removed, {} modified, {} restart-required\n",
            s.added, s.removed, s.modified, s.restart_required
        );
    }
    out.push_str(&diff.text);
    out
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

/// What the gateway answered per second over its last seconds (the
/// timeline's last five points): requests, 5xx, and which seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Rates {
    pub requests: f64,
    pub errors: f64,
    pub seconds: u64,
}

impl Rates {
    pub(super) fn of(timeline: &TimelineView) -> Option<Self> {
        let points = &timeline.points[timeline.points.len().saturating_sub(5)..];
        let (first, last) = (points.first()?, points.last()?);
        let seconds = last.t.saturating_sub(first.t) + timeline.interval_seconds.max(1);
        let roles = points.iter().flat_map(|p| &p.roles);
        let (requests, errors) = roles.fold((0, 0), |(n, e), r| (n + r.requests, e + r.errors));
        Some(Rates {
            requests: requests as f64 / seconds as f64,
            errors: errors as f64 / seconds as f64,
            seconds,
        })
    }
}

/// The facts of one `ctl status` frame, as text.
pub(super) fn status_frame(
    status: &StatusView,
    backends: Option<&BackendsView>,
    history: Option<&HistoryView>,
    rates: Option<Rates>,
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
    let canary = status.pending.as_ref().and_then(|p| p.canary.as_ref());
    if let Some(pending) = &status.pending {
        let when = match (pending.seconds_left, canary, pending.guarded) {
            (Some(s), _, _) => format!("in {s:.0}s unless confirmed"),
            (None, Some(_), true) => {
                "if aborted or its guard breaches (its last canary step confirms it)".to_owned()
            }
            (None, Some(_), false) => "if aborted (its last canary step confirms it)".to_owned(),
            (None, None, _) => "when its guard says so".to_owned(),
        };
        let _ = writeln!(
            out,
            "PENDING: generation {} rolls back to {} {when}",
            pending.generation, pending.rollback_to,
        );
    }
    if let (Some(pending), Some(c)) = (&status.pending, canary) {
        let steps: Vec<String> = c.steps.iter().map(|p| format!("{p} %")).collect();
        let next = match (c.next_percent, c.seconds_to_next_step) {
            (Some(next), Some(secs)) if pending.guarded => {
                format!("; next: {next} % in {secs:.0}s unless its guard ends it")
            }
            (Some(next), Some(secs)) => format!("; next: {next} % in {secs:.0}s"),
            (Some(next), None) => format!("; next: {next} %"),
            (None, _) => String::new(),
        };
        let _ = writeln!(
            out,
            "CANARY: generation {} takes {} % of new requests, generation {} takes {} % (step {} of {}: {}{next})",
            pending.generation,
            c.percent,
            pending.rollback_to,
            100u8.saturating_sub(c.percent),
            c.step,
            c.steps.len(),
            steps.join(", "),
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
        Some(Rates {
            requests,
            errors,
            seconds,
        }) => {
            let ratio = if requests > 0.0 {
                errors / requests * 100.0
            } else {
                0.0
            };
            let _ = writeln!(
                out,
                "requests {requests:.1}/s  5xx {errors:.1}/s ({ratio:.2} %) over the gateway's last {seconds} s"
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
    let mut rows = vec![
        ["gen", "role", "inflight", "connections", "requests", "5xx"]
            .map(String::from)
            .to_vec(),
    ];
    for g in &status.generations {
        let pending = status.pending.as_ref();
        // Named by what it does: a canary's previous generation still
        // takes most new requests; only one no generation routes to is
        // draining.
        let role = match (pending, canary) {
            (Some(p), Some(c)) if p.generation == g.generation => {
                format!("canary, takes {} %", c.percent)
            }
            (Some(p), Some(c)) if p.rollback_to == g.generation => {
                format!("previous, takes {} %", 100u8.saturating_sub(c.percent))
            }
            (Some(p), None) if p.generation == g.generation => "pending".to_owned(),
            _ => match g.superseded_secs {
                Some(secs) => format!("draining {secs:.0}s"),
                None => "active".to_owned(),
            },
        };
        rows.push(vec![
            g.generation.to_string(),
            role,
            g.inflight_requests.to_string(),
            g.open_connections.to_string(),
            g.requests.to_string(),
            g.errors.to_string(),
        ]);
    }
    indent(&mut out, &aligned(&rows));
    let _ = writeln!(out, "\nbackends");
    let mut rows = vec![[
        "upstream", "backend", "health", "ejected", "inflight", "attempts", "failures", "",
    ]
    .map(String::from)
    .to_vec()];
    for upstream in backends.iter().flat_map(|b| &b.upstreams) {
        for b in &upstream.backends {
            // Health checks can pass while every request fails: say so.
            let failing = match b.attempts {
                0 => String::new(),
                n => {
                    let ratio = b.failures as f64 / n as f64;
                    if ratio >= 0.05 {
                        format!("FAILING {:.0} %", ratio * 100.0)
                    } else {
                        String::new()
                    }
                }
            };
            rows.push(vec![
                upstream.name.clone(),
                b.addr.clone(),
                spelled(&b.health),
                yes_no(b.ejected).to_owned(),
                b.inflight.to_string(),
                b.attempts.to_string(),
                b.failures.to_string(),
                failing,
            ]);
        }
    }
    indent(&mut out, &aligned(&rows));
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
        let line = format!(
            "  {:>6}  {:<9} {:<13} {}  {}",
            g.generation,
            g.status,
            spelled(&g.source),
            g.activated_at,
            who,
        );
        let _ = writeln!(out, "{}", line.trim_end());
    }
    out
}

/// Appends `table`, each line two spaces in.
fn indent(out: &mut String, table: &str) {
    for line in table.lines() {
        out.push_str("  ");
        out.push_str(line);
        out.push('\n');
    }
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
    let mut rows = vec![[
        "id",
        "at",
        "kind",
        "outcome",
        "generation",
        "caller",
        "by",
        "what",
    ]
    .map(String::from)
    .to_vec()];
    for op in &view.operations {
        let generation = match (op.generation, op.previous_generation) {
            (Some(g), Some(p)) if g != p => format!("{p} -> {g}"),
            (Some(g), _) => g.to_string(),
            (None, Some(p)) => p.to_string(),
            (None, None) => "-".into(),
        };
        let overrode = op
            .overrode_freeze
            .as_ref()
            .map(|w| format!("through freeze \"{}\" (until {})", w.reason, w.until));
        let what = [
            Some(op.summary.as_str()),
            op.reason.as_deref(),
            overrode.as_deref(),
            // A refusal's summary is its error: said once.
            op.error.as_deref().filter(|e| *e != op.summary),
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
            op.caller.clone().unwrap_or_else(|| "-".into()),
            op.requested_by.clone().unwrap_or_else(|| "-".into()),
            what,
        ]);
    }
    out.push_str(&aligned(&rows));
    out
}

/// A proposal, as `ctl activate` (when the change waits), `propose`,
/// `approve` and `reject` print it.
pub(super) fn print_proposal(p: &ProposalRecord) {
    let approvals: Vec<&str> = p.approvals.iter().map(|a| a.caller.as_str()).collect();
    println!(
        "proposal {} ({}): {} by {} against generation {}, {}/{} approvals{}; expires {}",
        p.id,
        spelled(&p.state),
        p.operation.name(),
        p.proposer,
        p.expected_generation,
        p.approvals.len(),
        p.approvers,
        if approvals.is_empty() {
            String::new()
        } else {
            format!(" ({})", approvals.join(", "))
        },
        p.expires_at
    );
    if let Some(instance) = &p.instance {
        println!("  proposed through fleet instance {instance}");
    }
    if let (ProposalState::Approved, Some(carrier)) = (p.state, &p.carrier) {
        println!("  approved: fleet instance {carrier} carries it out");
    }
    if let Some(error) = &p.error {
        println!("  not carried out: {error}");
    }
    if let Some(rejection) = &p.rejection {
        println!(
            "  rejected by {}: {}",
            rejection.caller,
            rejection.reason.as_deref().unwrap_or("-")
        );
    }
}

/// `ctl proposals`: one row each, newest first.
pub(super) fn proposals_table(proposals: &[ProposalRecord]) -> String {
    let mut rows = vec![vec![
        "id".to_owned(),
        "state".to_owned(),
        "operation".to_owned(),
        "proposer".to_owned(),
        "against".to_owned(),
        "approvals".to_owned(),
        "expires".to_owned(),
        "what".to_owned(),
    ]];
    for p in proposals {
        let approvals: Vec<&str> = p.approvals.iter().map(|a| a.caller.as_str()).collect();
        let what = [
            p.reason.clone(),
            p.error.as_ref().map(|e| format!("not carried out: {e}")),
            p.rejection.as_ref().map(|r| {
                format!(
                    "rejected by {}: {}",
                    r.caller,
                    r.reason.as_deref().unwrap_or("-")
                )
            }),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join("; ");
        rows.push(vec![
            p.id.clone(),
            spelled(&p.state),
            p.operation.name().to_owned(),
            p.proposer.clone(),
            p.expected_generation.to_string(),
            format!(
                "{}/{} {}",
                p.approvals.len(),
                p.approvers,
                approvals.join(",")
            )
            .trim_end()
            .to_owned(),
            // Only an open proposal can still expire.
            if p.state == ProposalState::Open {
                p.expires_at.clone()
            } else {
                "-".to_owned()
            },
            if what.is_empty() {
                "-".to_owned()
            } else {
                what
            },
        ]);
    }
    aligned(&rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `text` against `fixtures/ctl/NAME`, byte for byte;
    /// `CUTOVER_BLESS=1` writes it.
    fn golden(name: &str, text: &str) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/ctl")
            .join(name);
        if std::env::var_os("CUTOVER_BLESS").is_some() {
            std::fs::write(&path, text).unwrap();
        }
        assert_eq!(text, std::fs::read_to_string(path).unwrap_or_default());
    }

    fn fixture(name: &str) -> serde_json::Value {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/ctl");
        serde_json::from_str(&std::fs::read_to_string(dir.join(name)).unwrap()).unwrap()
    }

    /// `ctl history`'s text for `fixtures/ctl/history.json` (a guard's
    /// rollback, a confirmed generation, a manual rollback, a generation
    /// no longer activatable) is `fixtures/ctl/history.txt`.
    #[test]
    fn history_reads_as_its_golden_file() {
        let view: HistoryView = serde_json::from_value(fixture("history.json")).unwrap();
        let text = history_table(&view);
        golden("history.txt", &text);
        // What the issue asked of it: the guard's victim is not offered.
        let eight = text.lines().find(|l| l.starts_with("8 ")).unwrap();
        assert!(eight.ends_with("rolled back: not a target"), "{eight}");
        assert!(
            eight.contains("auto_rolled_back: guard: 5xx ratio 0.61"),
            "{eight}"
        );
    }

    /// A `ctl status` frame during a canary at 10 % whose backend fails
    /// every request (`fixtures/ctl/status.json`, read from a real
    /// gateway) is `fixtures/ctl/status.txt`: the canary's share, step
    /// and next step; the previous generation named by what it takes;
    /// the failing backend said to be failing.
    #[test]
    fn a_canary_status_frame_reads_as_its_golden_file() {
        let json = fixture("status.json");
        let mut status: StatusView = serde_json::from_value(json["status"].clone()).unwrap();
        // Times that move: as a frame would show them at one moment.
        if let Some(c) = status.pending.as_mut().and_then(|p| p.canary.as_mut()) {
            c.seconds_to_next_step = Some(596.0);
        }
        for g in &mut status.generations {
            g.superseded_secs = g.superseded_secs.map(|_| 3.0);
        }
        let backends: BackendsView = serde_json::from_value(json["backends"].clone()).unwrap();
        let history: HistoryView = serde_json::from_value(json["history"].clone()).unwrap();
        let rates = Rates {
            requests: 100.0,
            errors: 6.0,
            seconds: 5,
        };
        let text = status_frame(&status, Some(&backends), Some(&history), Some(rates));
        golden("status.txt", &text);
        assert!(
            text.contains("CANARY: generation 2 takes 10 % of new requests, generation 1 takes 90 % (step 1 of 3: 10 %, 50 %, 100 %; next: 50 % in 596s)"),
            "{text}"
        );
        assert!(text.contains("previous, takes 90 %"), "{text}");
        assert!(text.contains("canary, takes 10 %"), "{text}");
        assert!(text.contains("FAILING 100 %"), "{text}");
    }

    /// `ctl proposals` for a real gateway's list
    /// (`fixtures/ctl/proposals.json`: one executed, one failed because
    /// another activation came first, one rollback open, one rejected)
    /// is `fixtures/ctl/proposals.txt`: newest first, each with its
    /// approvals, and why it was not carried out or was rejected.
    #[test]
    fn proposals_read_as_their_golden_file() {
        let list: Vec<ProposalRecord> =
            serde_json::from_value(fixture("proposals.json")["proposals"].clone()).unwrap();
        let text = proposals_table(&list);
        golden("proposals.txt", &text);
        let rows: Vec<&str> = text.lines().skip(1).collect();
        assert!(rows[0].starts_with("p-000004  rejected"), "{text}");
        assert!(
            rows[0].ends_with("four; rejected by bob: not on a friday"),
            "{text}"
        );
        assert!(rows[1].contains("open      rollback"), "{text}");
        assert!(
            rows[2].contains("not carried out: expected generation 1 but generation 2 is active"),
            "{text}"
        );
        assert!(rows[3].contains("1/1 alice"), "{text}");
    }

    /// What `ctl rollback 3` prints for a real gateway's answer
    /// (`fixtures/ctl/rollback.json`): what it restored first.
    #[test]
    fn a_rollback_reads_as_its_golden_file() {
        let activation: Activation = serde_json::from_value(fixture("rollback.json")).unwrap();
        let text = activation_text(&activation) + &diff_text(&activation.diff);
        golden("rollback.txt", &text);
        assert!(
            text.starts_with("rolled back to the configuration of generation 3, now active as generation 5 (was 4)\n"),
            "{text}"
        );
    }
}
