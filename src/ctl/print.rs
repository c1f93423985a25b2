//! What ctl prints for a person: summaries of answers, status frames.

use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use super::client::Client;
#[cfg(feature = "fleet")]
use super::tables::fleet_table;
use super::tables::{
    activation_text, diff_text, history_table, or_dash, spelled, status_frame, yes_no, zones_table,
    Rates,
};
use super::{Answer, CacheCommand, CtlCommand, CtlError, FleetCommand, EXIT_OK, EXIT_OTHER};
use crate::admin::{ErrorBody, Started};
use crate::control::{
    Activation, BackendsView, CertReload, GenerationDetail, HistoryView, Purged, RecordedPlan,
    TimelineView,
};
#[cfg(feature = "fleet")]
use crate::fleet::{FleetActivation, FleetStatus};
use crate::plan::{Diff, Plan};
use crate::runtime::proposals::ProposalRecord;
use crate::runtime::shadow::ShadowReport;
use crate::runtime::OperationRecord;
use crate::writer::{Activated, Settlement, Status};

pub(super) fn print_json(value: &impl Serialize) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_default()
    );
}

/// A plan: whether the candidate (read from `file`, whose name its
/// errors carry as `cutover check` prints them) can be activated, why
/// not, and what it changes.
pub(super) fn print_plan(plan: &Plan, file: Option<&Path>) {
    println!(
        "activatable: {}  (candidate config_version {}, against active generation {})",
        if plan.activatable { "yes" } else { "no" },
        plan.config_version.as_deref().unwrap_or("-"),
        or_dash(plan.active_generation),
    );
    let origin = file.map_or_else(|| "candidate".to_owned(), |f| f.display().to_string());
    for e in &plan.errors {
        println!("error: {}", e.render(&origin));
    }
    for w in &plan.warnings {
        println!("warning: {}", w.render(&origin));
    }
    for r in &plan.rejected {
        println!(
            "restart required: {} ({} → {}); {}",
            r.path, r.from, r.to, r.action
        );
    }
    for upstream in &plan.members {
        for source in &upstream.sources {
            println!(
                "members of {} from {}{}: {}",
                upstream.upstream,
                source.source,
                if source.followed {
                    ""
                } else {
                    " (resolved now)"
                },
                if source.members.is_empty() {
                    "none".to_owned()
                } else {
                    source.members.join(", ")
                }
            );
        }
    }
    print_diff(&plan.diff);
    if let Some(impact) = &plan.impact {
        print_impact(impact);
    }
}

/// The impact table: the kinds, then each route's and upstream's share,
/// then the examples of each kind.
pub(super) fn print_impact(impact: &crate::plan::impact::Impact) {
    if let Some(waf) = &impact.waf {
        println!("waf: would refuse, of the sample ({})", waf.sample);
        print_waf(&waf.judged);
    }
    if impact.sample_size == 0 {
        println!("impact: no data (no request sampled yet)");
        return;
    }
    println!(
        "impact: {} sampled requests over {:.0}s",
        impact.sample_size, impact.span_seconds
    );
    for (label, kind) in [
        ("moved", &impact.moved),
        ("unrouted (404 after)", &impact.unrouted),
        ("unusable upstream", &impact.unusable),
        ("newly routed", &impact.newly_routed),
    ] {
        let [low, high] = kind.interval;
        println!(
            "  {label:<22} {:>7}  {:>6.2} %  (95 %: {low:.2}–{high:.2} %)",
            kind.count, kind.percent
        );
    }
    for (title, shares) in [("route", &impact.routes), ("upstream", &impact.upstreams)] {
        if shares.is_empty() {
            continue;
        }
        println!("  {title:<22} {:>8} {:>8}", "before", "after");
        for share in shares {
            let marker = if share.before == share.after {
                " "
            } else {
                "*"
            };
            println!(
                "{marker} {:<22} {:>7.2}% {:>7.2}%",
                share.name, share.before_percent, share.after_percent
            );
        }
    }
    let place = |d: &Option<crate::plan::impact::Destination>| match d {
        Some(d) => match &d.upstream {
            Some(u) => format!("{} → {u}", d.route),
            None => d.route.clone(),
        },
        None => "404".to_owned(),
    };
    // Examples of one request seen many times are one line, counted.
    for (label, kind) in [
        ("moved", &impact.moved),
        ("unrouted", &impact.unrouted),
        ("unusable", &impact.unusable),
    ] {
        let mut lines: Vec<(String, usize)> = Vec::new();
        for e in &kind.examples {
            let line = format!(
                "  {label}: {} {}{} ({}): {} ⇒ {}",
                e.method,
                e.host,
                e.path,
                e.listener,
                place(&e.before),
                place(&e.after)
            );
            match lines.iter_mut().find(|(l, _)| *l == line) {
                Some((_, n)) => *n += 1,
                None => lines.push((line, 1)),
            }
        }
        for (line, n) in lines {
            match n {
                1 => println!("{line}"),
                n => println!("{line}  (×{n})"),
            }
        }
    }
}

pub(super) fn print_diff(diff: &Diff) {
    print!("{}", diff_text(diff));
}

/// A summary of `answer` for a person; an answer this ctl cannot read
/// (a gateway of another version) is printed as its JSON.
pub(super) fn print_human(command: &CtlCommand, answer: &Answer) {
    if !answer.status.is_success() {
        let refusal = answer.read::<ErrorBody>();
        if matches!(command, CtlCommand::Rollback { .. })
            && refusal.as_ref().and_then(|r| r.error.as_deref()) == Some("target_active")
        {
            let target = answer.body["target_generation"]
                .as_u64()
                .unwrap_or_default();
            println!("generation {target} is already active: nothing to roll back");
            return;
        }
        let plan = answer.read::<Plan>();
        eprintln!(
            "{} {}: {}",
            answer.status.as_u16(),
            refusal
                .as_ref()
                .and_then(|r| r.error.as_deref())
                .unwrap_or(if plan.is_some() { "rejected" } else { "error" }),
            refusal
                .as_ref()
                .and_then(|r| r.message.as_deref())
                .unwrap_or("")
        );
        if let Some(plan) = &plan {
            print_plan(plan, command.file());
        }
        let shadow = answer
            .body
            .get("shadow")
            .and_then(|v| serde_json::from_value::<ShadowReport>(v.clone()).ok());
        if let Some(report) = &shadow {
            print_shadow(report);
        }
        return;
    }
    // A change that waits for approval, whatever the command.
    if let Some(proposal) = answer
        .body
        .get("proposal")
        .and_then(|p| serde_json::from_value::<ProposalRecord>(p.clone()).ok())
    {
        if !matches!(command, CtlCommand::Proposals) {
            super::tables::print_proposal(&proposal);
            if answer.body.get("result").is_none() {
                return;
            }
        }
    }
    if summarize(command, answer).is_none() {
        eprintln!("(an answer this ctl does not know the shape of; as sent:)");
        print_json(&answer.body);
    }
}

/// `print_human` for a successful answer; `None` when it does not read
/// as the type the command expects.
pub(super) fn summarize(command: &CtlCommand, answer: &Answer) -> Option<()> {
    match command {
        CtlCommand::Validate { file } => print_plan(&answer.read::<Plan>()?, Some(file)),
        CtlCommand::Preview { file, .. } => {
            let recorded = answer.read::<RecordedPlan>()?;
            print_plan(&recorded.plan, Some(file));
            println!("recorded as {}", recorded.operation_id);
        }
        CtlCommand::Activate { .. } | CtlCommand::Rollback { .. } => {
            match answer.read::<Activated>()? {
                Activated::Local(activation) => print_activation(&activation),
                #[cfg(feature = "fleet")]
                Activated::Fleet(activation) => print_fleet_activation(&activation),
            }
        }
        CtlCommand::Confirm { .. } | CtlCommand::Abort { .. } => {
            let (outcome, generation, rolled_back_to, operation) = match answer
                .read::<Settlement>()?
            {
                Settlement::Local(s) => (s.outcome, s.generation, s.rolled_back_to, s.operation_id),
                #[cfg(feature = "fleet")]
                Settlement::Fleet(s) => (s.outcome, s.generation, s.rolled_back_to, "fleet".into()),
            };
            println!(
                "{outcome}: generation {generation} active{} ({operation})",
                rolled_back_to.map_or(String::new(), |to| format!(", the configuration of {to}")),
            );
        }
        CtlCommand::History => print!("{}", history_table(&answer.read::<HistoryView>()?)),
        // The proposal was printed (`print_human`).
        CtlCommand::Propose { .. } | CtlCommand::Reject { .. } => {}
        CtlCommand::Proposals => {
            let proposals: Vec<ProposalRecord> =
                serde_json::from_value(answer.body.get("proposals")?.clone()).ok()?;
            print!("{}", super::tables::proposals_table(&proposals));
        }
        // Carried out: what the change answered.
        CtlCommand::Approve { .. } => {
            let result = answer.body.get("result")?;
            match serde_json::from_value::<Activated>(result.clone()) {
                Ok(Activated::Local(activation)) => print_activation(&activation),
                #[cfg(feature = "fleet")]
                Ok(Activated::Fleet(activation)) => print_fleet_activation(&activation),
                Err(_) => println!(
                    "started operation {}",
                    result.get("operation_id")?.as_str()?
                ),
            }
        }
        // Printed as it follows the generation.
        CtlCommand::Wait { .. } => {}
        // The text as it was activated, byte for byte.
        CtlCommand::Export => print!("{}", answer.read::<GenerationDetail>()?.config),
        CtlCommand::Status { .. } => print_json(&answer.read::<Status>()?),
        #[cfg(feature = "fleet")]
        CtlCommand::Fleet(FleetCommand::Status) => {
            print!("{}", fleet_table(&answer.read::<FleetStatus>()?))
        }
        #[cfg(not(feature = "fleet"))]
        CtlCommand::Fleet(FleetCommand::Status) => return None,
        CtlCommand::Fleet(FleetCommand::Forget { instance }) => {
            println!("instance {instance} forgotten")
        }
        CtlCommand::Cache(CacheCommand::Show) => print!("{}", zones_table(&answer.read()?)),
        CtlCommand::Cache(CacheCommand::Purge(_)) => {
            let purged = answer.read::<Purged>()?;
            let zones: Vec<String> = purged
                .zones
                .iter()
                .map(|z| format!("{} {}", z.zone, z.purged))
                .collect();
            println!(
                "purged {} keys ({}) ({})",
                purged.purged,
                zones.join(", "),
                purged.operation_id
            );
        }
        CtlCommand::Backends => {
            println!(
                "{:<16} {:<24} {:<10} {:<9} {:>8} {:>9} {:>10} {:>9}  source",
                "upstream",
                "backend",
                "health",
                "ejected",
                "inflight",
                "ewma_ms",
                "attempts",
                "failures"
            );
            let view = answer.read::<BackendsView>()?;
            for upstream in &view.upstreams {
                for b in &upstream.backends {
                    println!(
                        "{:<16} {:<24} {:<10} {:<9} {:>8} {:>9.1} {:>10} {:>9}  {}",
                        upstream.name,
                        b.addr,
                        spelled(&b.health),
                        yes_no(b.ejected),
                        b.inflight,
                        b.ewma_ms.unwrap_or(0.0),
                        b.attempts,
                        b.failures,
                        b.source.as_deref().unwrap_or("addr"),
                    );
                }
            }
            let sources: Vec<_> = view
                .upstreams
                .iter()
                .flat_map(|u| u.sources.iter().map(move |s| (&u.name, s)))
                .collect();
            if !sources.is_empty() {
                println!(
                    "\n{:<16} {:<40} {:>7} {:<24} {:<24} error",
                    "upstream", "source", "members", "last resolution", "next refresh"
                );
            }
            let at = |ms: Option<u64>| {
                ms.map_or_else(
                    || "-".to_owned(),
                    |ms| {
                        humantime::format_rfc3339_seconds(
                            std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms),
                        )
                        .to_string()
                    },
                )
            };
            for (upstream, s) in sources {
                let mut members = s.members.to_string();
                if s.left_out > 0 {
                    members.push_str(&format!(" (+{} left out)", s.left_out));
                }
                println!(
                    "{:<16} {:<40} {:>7} {:<24} {:<24} {}{}",
                    upstream,
                    s.source,
                    members,
                    at(s.last_resolution_unix_ms),
                    at(s.next_refresh_unix_ms),
                    if s.stale { "stale: " } else { "" },
                    s.error.as_deref().unwrap_or("-"),
                );
            }
        }
        CtlCommand::Drain => println!("draining ({})", answer.read::<Started>()?.operation_id),
        CtlCommand::ReloadCerts { .. } => {
            let reload = answer.read::<CertReload>()?;
            for listener in &reload.listeners {
                for cert in &listener.certificates {
                    println!(
                        "{}: {} {:?} not_after {}{}",
                        listener.listener,
                        cert.fingerprint,
                        cert.names,
                        cert.not_after,
                        if cert.changed { " (changed)" } else { "" }
                    );
                }
            }
            for secret in &reload.secrets {
                let state = match (&secret.error, secret.changed) {
                    (Some(_), _) => "not reloaded (last good kept)",
                    (None, true) => "changed",
                    (None, false) => "unchanged",
                };
                println!("secret {}: {state}", secret.file);
            }
            if reload.auth_answers_forgotten > 0 {
                println!(
                    "forward auth: {} kept answers forgotten",
                    reload.auth_answers_forgotten
                );
            }
            for warning in &reload.warnings {
                println!("warning: {warning}");
            }
        }
        CtlCommand::Upgrade { .. } => {
            let op = answer.read::<OperationRecord>()?;
            println!(
                "upgrade {}: {} ({})",
                spelled(&op.outcome),
                op.summary,
                op.id
            );
            if let Some(error) = &op.error {
                println!("error: {error}");
            }
        }
    }
    Some(())
}

pub(super) fn print_activation(activation: &Activation) {
    print!("{}", activation_text(activation));
    if let Some(report) = &activation.shadow {
        print_shadow(report);
    }
    print!("{}", diff_text(&activation.diff));
}

/// A shadow stage's report: its verdict, what became of the copies,
/// then both generations' answers in all and per route.
pub(super) fn print_shadow(report: &ShadowReport) {
    println!("{}", report.reason);
    if let Some(waf) = &report.waf {
        println!(
            "waf shadow of generation {} against {}: {:.2} % of requests for {:.0} s; {} judged ({} dropped, {} skipped)",
            report.candidate_generation,
            report.active_generation,
            report.percent,
            report.seconds,
            waf.evaluated,
            waf.dropped,
            waf.skipped
        );
        return print_waf(waf);
    }
    let c = &report.copies;
    println!(
        "shadow of generation {} against {}: {:.2} % of safe requests for {:.0} s; {} compared ({} dropped, {} skipped, {} timed out, {} failed)",
        report.candidate_generation,
        report.active_generation,
        report.percent,
        report.seconds,
        c.compared,
        c.dropped,
        c.skipped,
        c.timeout,
        c.failed
    );
    println!(
        "  {:<24} {:>8} {:>10} {:>10} {:>11} {:>11} {:>8}",
        "route", "compared", "5xx now", "5xx cand.", "p99 now", "p99 cand.", "changed"
    );
    let ms = |p: Option<f64>| p.map_or("-".to_owned(), |p| format!("{p:.2} ms"));
    for route in std::iter::once(&report.total).chain(&report.routes) {
        println!(
            "  {:<24} {:>8} {:>9.2}% {:>9.2}% {:>11} {:>11} {:>8}",
            route.route,
            route.compared,
            route.active.error_ratio * 100.0,
            route.candidate.error_ratio * 100.0,
            ms(route.active.p99_ms),
            ms(route.candidate.p99_ms),
            route.changed_class
        );
    }
    if report.routes_tallied > report.routes.len() {
        println!(
            "  ({} more routes in the total)",
            report.routes_tallied - report.routes.len()
        );
    }
}

/// Two firewalls' verdicts, in all and per route: the shares each
/// refuses, the change with its interval, the candidate's rules and
/// examples.
fn print_waf(waf: &crate::waf::tally::WafShadowReport) {
    println!(
        "  {:<24} {:>8} {:>9} {:>9} {:>19} {:>19}",
        "route", "judged", "now", "cand.", "cand. (95 %)", "change (95 %)"
    );
    let pct = |r: f64| r * 100.0;
    for route in std::iter::once(&waf.total).chain(&waf.routes) {
        println!(
            "  {:<24} {:>8} {:>8.2}% {:>8.2}% {:>8.2}–{:>6.2} % {:>+8.2}–{:>+6.2} %",
            route.route,
            route.evaluated,
            pct(route.active_ratio),
            pct(route.candidate_ratio),
            pct(route.candidate_interval[0]),
            pct(route.candidate_interval[1]),
            pct(route.interval[0]),
            pct(route.interval[1]),
        );
    }
    let rules: Vec<String> = waf
        .total
        .top_rules
        .iter()
        .map(|r| format!("{} ({})", r.rule, r.count))
        .collect();
    if !rules.is_empty() {
        println!("  rules: {}", rules.join(", "));
    }
    for e in &waf.total.examples {
        let rules: Vec<String> = e.rules.iter().map(u32::to_string).collect();
        println!(
            "  only the candidate refuses: {} {} ({})",
            e.method,
            e.path,
            rules.join(",")
        );
    }
}

#[cfg(feature = "fleet")]
pub(super) fn print_fleet_activation(activation: &FleetActivation) {
    use crate::fleet::InstanceOutcome;
    println!(
        "{}: fleet generation {} (previous {}), {}",
        activation.outcome,
        activation.generation,
        or_dash(activation.previous_generation),
        activation.config_version,
    );
    if let Some(pending) = &activation.pending {
        let mut how = Vec::new();
        if let Some(ms) = pending.deadline_unix_ms {
            let at = std::time::UNIX_EPOCH + Duration::from_millis(ms);
            how.push(format!(
                "confirm by {}",
                humantime::format_rfc3339_seconds(at)
            ));
        }
        if pending.guard.is_some() {
            how.push("its guard judges every instance's answers".into());
        }
        if let Some(canary) = &pending.canary {
            how.push(format!("canary steps {:?}", canary.steps));
        }
        println!(
            "pending: rolls back to fleet generation {} unless settled ({})",
            pending.rollback_to,
            how.join("; ")
        );
    }
    if let Some(report) = &activation.shadow {
        print_shadow(report);
    }
    match &activation.instance {
        InstanceOutcome::Serving {
            instance,
            generation,
            local_generation,
        } => println!(
            "instance {instance}: serves fleet generation {generation} as local generation {local_generation}"
        ),
        InstanceOutcome::Applied {
            instance,
            activation,
        } => {
            println!(
                "instance {instance}: local generation {} ({})",
                activation.generation, activation.outcome
            );
            print_diff(&activation.diff);
        }
        InstanceOutcome::Refused { instance, error } => println!("instance {instance}: {error}"),
    }
    println!("other instances follow through etcd: `cutover ctl fleet status`");
}

/// `ctl status`: one frame, or (`--watch`) a frame every `interval`,
/// redrawn in place on a terminal, until `frames` have been shown.
pub(super) async fn watch_status(
    client: &Client,
    interval: Duration,
    frames: Option<u64>,
) -> Result<u8, CtlError> {
    use std::io::{IsTerminal, Write};
    let terminal = std::io::stdout().is_terminal();
    // History plans every retained configuration: read again only when
    // the last operation changed.
    let mut history: Option<(Option<String>, HistoryView)> = None;
    let mut shown = 0u64;
    loop {
        let answer = client.get("/admin/runtime/status").await?;
        let Some(status) = answer
            .status
            .is_success()
            .then(|| answer.read::<Status>())
            .flatten()
        else {
            print_human(&CtlCommand::History, &answer);
            return Ok(EXIT_OTHER);
        };
        let status = status.local;
        let backends = client
            .get("/admin/runtime/backends")
            .await?
            .read::<BackendsView>();
        let last_operation = status.last_operation.as_ref().map(|o| o.id.clone());
        if history
            .as_ref()
            .is_none_or(|(seen, _)| *seen != last_operation)
        {
            let answer = client.get("/admin/runtime/history").await?;
            history = answer.read().map(|h| (last_operation, h));
        }
        // Rates over the gateway's own seconds, not this client's clock.
        let rates = client
            .get("/admin/runtime/timeline")
            .await?
            .read::<TimelineView>()
            .and_then(|t| Rates::of(&t));
        let frame = status_frame(
            &status,
            backends.as_ref(),
            history.as_ref().map(|(_, h)| h),
            rates,
        );
        let mut out = std::io::stdout().lock();
        if terminal && frames != Some(1) {
            // Home and clear: the frame replaces the last one.
            let _ = write!(out, "\x1b[H\x1b[2J");
        } else if shown > 0 {
            let _ = writeln!(out);
        }
        let _ = write!(out, "{frame}");
        let _ = out.flush();
        drop(out);
        shown += 1;
        if frames.is_some_and(|n| shown >= n) {
            return Ok(EXIT_OK);
        }
        tokio::time::sleep(interval).await;
    }
}
