//! Where proposals are kept (DESIGN §23): with this process's history
//! when it stands alone, in etcd when it is in a fleet (so that any
//! instance lists, approves or rejects what another proposed). Both
//! answer the same three calls; `approvals.rs` never asks which.

use std::sync::Arc;

#[cfg(feature = "fleet")]
use crate::fleet::Fleet;
use crate::ids::GenerationId;
use crate::runtime::proposals::{ProposalError, ProposalRecord, ProposalState, OPEN_LIMIT};
use crate::writer::Writer;

pub(super) enum Book {
    Local(Arc<crate::control::Control>),
    #[cfg(feature = "fleet")]
    Fleet(Arc<Fleet>),
}

impl Book {
    pub fn of(writer: &Writer) -> Self {
        match writer {
            Writer::Local(control) => Book::Local(Arc::clone(control)),
            #[cfg(feature = "fleet")]
            Writer::Fleet(fleet) => Book::Fleet(Arc::clone(fleet)),
        }
    }

    /// The fleet instance this process is (none: it stands alone).
    pub fn instance(&self) -> Option<&str> {
        match self {
            Book::Local(_) => None,
            #[cfg(feature = "fleet")]
            Book::Fleet(fleet) => Some(fleet.instance()),
        }
    }

    /// Every proposal kept, oldest first.
    pub async fn all(&self) -> Result<Vec<ProposalRecord>, ProposalError> {
        match self {
            Book::Local(control) => Ok(control.read_history(|h| h.proposals().to_vec())),
            #[cfg(feature = "fleet")]
            Book::Fleet(fleet) => fleet.proposals().await,
        }
    }

    /// Adds the proposal `make` builds from a fresh id (429 when
    /// `OPEN_LIMIT` are open).
    pub async fn add(
        &self,
        make: impl Fn(String) -> ProposalRecord,
    ) -> Result<ProposalRecord, ProposalError> {
        match self {
            Book::Local(control) => control.with_history(|h| {
                let open = h
                    .proposals()
                    .iter()
                    .filter(|p| p.state == ProposalState::Open)
                    .count();
                if open >= OPEN_LIMIT {
                    return Err(ProposalError::TooMany(open));
                }
                let record = make(h.next_proposal_id());
                h.update_proposals(|proposals| proposals.push(record.clone()));
                Ok(record)
            }),
            #[cfg(feature = "fleet")]
            Book::Fleet(fleet) => fleet.add_proposal(make).await,
        }
    }

    /// Runs `change` on proposal `id` and keeps what it made. In a fleet
    /// `change` may run more than once: again on a fresh read when
    /// another instance changed the proposal first.
    pub async fn change<T>(
        &self,
        id: &str,
        mut change: impl FnMut(&mut ProposalRecord) -> Result<T, ProposalError>,
    ) -> Result<(ProposalRecord, T), ProposalError> {
        match self {
            Book::Local(control) => control.with_history(|h| {
                h.update_proposals(|proposals| {
                    let p = proposals
                        .iter_mut()
                        .find(|p| p.id == id)
                        .ok_or_else(|| ProposalError::NotFound(id.to_owned()))?;
                    let out = change(p)?;
                    Ok((p.clone(), out))
                })
            }),
            #[cfg(feature = "fleet")]
            Book::Fleet(fleet) => fleet.change_proposal(id, change).await,
        }
    }

    /// The generation an activation or rollback is planned against now:
    /// in a fleet, the fleet's (its ids are what `expected_generation`
    /// names there).
    pub async fn active_generation(&self) -> Result<GenerationId, ProposalError> {
        match self {
            Book::Local(control) => Ok(control.store().active_id()),
            #[cfg(feature = "fleet")]
            Book::Fleet(fleet) => fleet.active_generation().await,
        }
    }
}
