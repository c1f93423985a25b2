//! Following a change to its end: `wait`, `activate --wait`.

use std::time::Duration;

use serde::de::DeserializeOwned;

use super::client::Client;
use super::print::print_json;
use super::{
    exit_code, CtlCommand, CtlError, EXIT_CONFLICT, EXIT_OK, EXIT_OTHER, EXIT_ROLLED_BACK,
};
use crate::control::HistoryView;
#[cfg(feature = "fleet")]
use crate::fleet::FleetStatus;
use crate::ids::GenerationId;
use crate::runtime::{OperationKind, Outcome};
use crate::writer::Status;

/// One poll of a follower (`wait`).
pub(super) enum Polled<T> {
    Read(T),
    /// Failed, but not for long enough to give up: poll again.
    Again,
    /// Gave up: the exit code.
    Failed(u8),
}

/// GETs `path` for a follower. The admin socket may pass to a new process
/// on the way (an upgrade), and etcd may be away for a while (a fleet):
/// up to a minute of failed polls, half a second apart, is not the end.
pub(super) async fn poll<T: DeserializeOwned>(
    client: &Client,
    path: &str,
    failures: &mut u32,
) -> Result<Polled<T>, CtlError> {
    match client.get(path).await {
        Ok(answer) if answer.status.is_success() => match answer.read() {
            Some(read) => {
                *failures = 0;
                Ok(Polled::Read(read))
            }
            None => {
                eprintln!("cutover ctl: {path} answered in a shape this ctl does not read");
                Ok(Polled::Failed(EXIT_OTHER))
            }
        },
        Ok(_) | Err(_) if *failures < 120 => {
            *failures += 1;
            tokio::time::sleep(Duration::from_millis(500)).await;
            Ok(Polled::Again)
        }
        Ok(answer) => Ok(Polled::Failed(exit_code(&CtlCommand::History, &answer))),
        Err(error) => Err(error),
    }
}

/// Follows pending generation `generation` until it is settled: exit 0
/// when it was confirmed, 4 when it was rolled back, 2 when another
/// activation superseded it. Prints the operation that settled it.
pub(super) async fn wait_settled(
    client: &Client,
    generation: GenerationId,
    json: bool,
) -> Result<u8, CtlError> {
    let mut percent = None;
    let mut failures = 0;
    loop {
        let status: Status = match poll(client, "/admin/runtime/status", &mut failures).await? {
            Polled::Read(status) => status,
            Polled::Again => continue,
            Polled::Failed(code) => return Ok(code),
        };
        #[cfg(feature = "fleet")]
        if status.fleet.is_some() {
            return wait_fleet_settled(client, generation, json).await;
        }
        if let Some(pending) = status.local.pending.filter(|p| p.generation == generation) {
            if !json && pending.canary_percent != percent {
                percent = pending.canary_percent;
                if let Some(percent) = percent {
                    println!("canary: generation {generation} takes {percent} % of new requests");
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        let history = client.get("/admin/runtime/history").await?;
        let operations = history
            .read::<HistoryView>()
            .map(|h| h.operations)
            .unwrap_or_default();
        let settled = operations.into_iter().rev().find(|op| {
            op.outcome == Outcome::Succeeded
                && match op.kind {
                    OperationKind::Confirm => op.generation == Some(generation),
                    OperationKind::Abort
                    | OperationKind::AutoRollback
                    | OperationKind::Rollback => op.previous_generation == Some(generation),
                    _ => false,
                }
        });
        let (code, what) = match &settled {
            Some(op) if op.kind == OperationKind::Confirm => (EXIT_OK, "confirmed"),
            Some(_) => (EXIT_ROLLED_BACK, "rolled back"),
            None => (EXIT_CONFLICT, "superseded"),
        };
        if json {
            print_json(&settled);
        } else {
            let op = settled.as_ref();
            println!(
                "generation {generation} {what}{}{}",
                because(op.and_then(|op| op.reason.as_deref())),
                by(op.and_then(|op| op.requested_by.as_deref())),
            );
            if settled.is_none() {
                println!(
                    "generation {} is active: another activation replaced it",
                    status.local.active_generation
                );
            }
        }
        return Ok(code);
    }
}

pub(super) fn because(reason: Option<&str>) -> String {
    reason.map_or(String::new(), |r| format!(": {r}"))
}

pub(super) fn by(who: Option<&str>) -> String {
    who.map_or(String::new(), |by| format!(" (by {by})"))
}

/// `wait_settled` in a fleet: follows the fleet's `active` record until
/// `generation` is no longer pending; its settlement says how it ended.
#[cfg(feature = "fleet")]
pub(super) async fn wait_fleet_settled(
    client: &Client,
    generation: GenerationId,
    json: bool,
) -> Result<u8, CtlError> {
    let mut failures = 0;
    loop {
        let status: FleetStatus = match poll(client, "/admin/fleet/status", &mut failures).await? {
            Polled::Read(status) => status,
            Polled::Again => continue,
            Polled::Failed(code) => return Ok(code),
        };
        let Some(active) = status.active else {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        if active.generation == generation && active.pending.is_some() {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        let settlement = active.settlement.filter(|s| s.generation == generation);
        let (code, what) = match &settlement {
            None => (EXIT_CONFLICT, "superseded"),
            Some(s) if s.outcome == "confirmed" => (EXIT_OK, "confirmed"),
            Some(_) => (EXIT_ROLLED_BACK, "rolled back"),
        };
        if json {
            print_json(&settlement);
        } else {
            let s = settlement.as_ref();
            println!(
                "fleet generation {generation} {what}{}{}",
                because(s.and_then(|s| s.reason.as_deref())),
                by(s.and_then(|s| s.by.as_deref())),
            );
            if what != "confirmed" {
                println!("fleet generation {} is active", active.generation);
            }
        }
        return Ok(code);
    }
}
