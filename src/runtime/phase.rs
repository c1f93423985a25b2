//! The process lifecycle phase, published through a tokio `watch`.

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// `starting → running → draining → stopped`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Starting,
    Running,
    Draining,
    Stopped,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Starting => "starting",
            Phase::Running => "running",
            Phase::Draining => "draining",
            Phase::Stopped => "stopped",
        }
    }

    /// The phase as a number for the `cutover_phase` gauge.
    pub fn as_gauge(self) -> f64 {
        match self {
            Phase::Starting => 0.0,
            Phase::Running => 1.0,
            Phase::Draining => 2.0,
            Phase::Stopped => 3.0,
        }
    }
}

/// Owner of the phase; cheap to clone receivers from.
#[derive(Debug)]
pub struct PhaseCell {
    sender: watch::Sender<Phase>,
}

impl Default for PhaseCell {
    fn default() -> Self {
        Self {
            sender: watch::channel(Phase::Starting).0,
        }
    }
}

impl PhaseCell {
    pub fn get(&self) -> Phase {
        *self.sender.borrow()
    }

    /// Moves forward to `next`; the lifecycle never goes back. Returns
    /// whether the phase changed.
    pub fn advance(&self, next: Phase) -> bool {
        self.sender.send_if_modified(|current| {
            let forward = (next as u8) > (*current as u8);
            if forward {
                *current = next;
            }
            forward
        })
    }

    pub fn subscribe(&self) -> watch::Receiver<Phase> {
        self.sender.subscribe()
    }
}
