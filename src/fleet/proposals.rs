//! A fleet's proposals (DESIGN §23), kept in etcd so that a change
//! proposed through one instance can be approved through another: one
//! key per proposal under `proposals/`, each change written only if the
//! key is still at the revision it was read at (as `active` is), and a
//! counter that numbers them. What a proposal means and who may decide
//! it stays in `admin/approvals.rs`; this is only where it is kept.

use crate::ids::GenerationId;
use crate::runtime::proposals::{
    ProposalError, ProposalRecord, ProposalState, CLOSED_LIMIT, OPEN_LIMIT,
};

use super::etcd::{self, wire::KeyValue, Client};
use super::{within, Fleet, FleetError};

/// How often a change is tried again on a fresh read when another
/// instance changed the same key between the read and the write.
const ATTEMPTS: usize = 8;

impl From<FleetError> for ProposalError {
    fn from(error: FleetError) -> Self {
        ProposalError::Unavailable(error.to_string())
    }
}

fn encode(record: &ProposalRecord) -> Result<Vec<u8>, ProposalError> {
    serde_json::to_vec(record).map_err(|e| ProposalError::Unavailable(e.to_string()))
}

/// A record as stored; `None` (with a warning) when it does not read, so
/// that one bad key does not hide the others.
fn decode(kv: &KeyValue) -> Option<ProposalRecord> {
    match serde_json::from_slice(&kv.value) {
        Ok(record) => Some(record),
        Err(error) => {
            let key = String::from_utf8_lossy(&kv.key);
            tracing::warn!(%key, %error, "a fleet proposal does not read; it is left out");
            None
        }
    }
}

/// Whether a proposal is done with (kept for the record, pruned first).
fn closed(record: &ProposalRecord) -> bool {
    !matches!(record.state, ProposalState::Open | ProposalState::Approved)
}

impl Fleet {
    /// Every proposal the fleet keeps, oldest first.
    pub async fn proposals(&self) -> Result<Vec<ProposalRecord>, ProposalError> {
        let client = self.client().await?;
        Ok(self.read_proposals(&client).await?)
    }

    async fn read_proposals(&self, client: &Client) -> Result<Vec<ProposalRecord>, FleetError> {
        let answer = within(client.get_prefix(self.keys.proposals(), false)).await?;
        Ok(answer.kvs.iter().filter_map(decode).collect())
    }

    /// Adds the proposal `make` builds from a fresh id, while fewer than
    /// `OPEN_LIMIT` are open; the oldest closed ones beyond
    /// `CLOSED_LIMIT` go in the same transaction.
    pub async fn add_proposal(
        &self,
        make: impl Fn(String) -> ProposalRecord,
    ) -> Result<ProposalRecord, ProposalError> {
        let client = self.client().await?;
        let counter = self.keys.proposal_counter();
        for _ in 0..ATTEMPTS {
            let answer = within(client.get(counter.clone())).await?;
            let (last, revision) = match answer.kvs.first() {
                None => (0, 0),
                Some(kv) => {
                    let last = std::str::from_utf8(&kv.value)
                        .ok()
                        .and_then(|v| v.parse::<u64>().ok())
                        .ok_or_else(|| {
                            ProposalError::Unavailable(format!("{counter} is not a number"))
                        })?;
                    (last, kv.mod_revision)
                }
            };
            let kept = self.read_proposals(&client).await?;
            let open = kept
                .iter()
                .filter(|p| p.state == ProposalState::Open)
                .count();
            if open >= OPEN_LIMIT {
                return Err(ProposalError::TooMany(open));
            }
            let next = last + 1;
            let record = make(format!("p-{next:06}"));
            let mut success = vec![
                etcd::put_op(counter.clone(), next.to_string()),
                etcd::put_op(self.keys.proposal(&record.id), encode(&record)?),
            ];
            let done: Vec<&ProposalRecord> = kept.iter().filter(|p| closed(p)).collect();
            let surplus = done.len().saturating_sub(CLOSED_LIMIT);
            success.extend(
                done.iter()
                    .take(surplus)
                    .map(|p| etcd::delete_op(self.keys.proposal(&p.id))),
            );
            // The counter moves only here, so comparing it orders every
            // addition (and with it the count of open ones).
            let txn = etcd::wire::TxnRequest {
                compare: vec![etcd::modified_at(counter.clone(), revision)],
                success,
                failure: Vec::new(),
            };
            if within(client.txn(txn)).await?.succeeded {
                return Ok(record);
            }
        }
        Err(ProposalError::Unavailable(format!(
            "other instances added proposals {ATTEMPTS} times while this one tried"
        )))
    }

    /// Runs `change` on proposal `id` as stored now and writes what it
    /// made, if no other instance changed it since the read; otherwise
    /// reads it again and runs `change` again (which sees their change).
    pub async fn change_proposal<T>(
        &self,
        id: &str,
        mut change: impl FnMut(&mut ProposalRecord) -> Result<T, ProposalError>,
    ) -> Result<(ProposalRecord, T), ProposalError> {
        let client = self.client().await?;
        let key = self.keys.proposal(id);
        for _ in 0..ATTEMPTS {
            let answer = within(client.get(key.clone())).await?;
            let Some((kv, mut record)) = answer
                .kvs
                .first()
                .and_then(|kv| decode(kv).map(|record| (kv, record)))
            else {
                return Err(ProposalError::NotFound(id.to_owned()));
            };
            let out = change(&mut record)?;
            let txn = etcd::wire::TxnRequest {
                compare: vec![etcd::modified_at(key.clone(), kv.mod_revision)],
                success: vec![etcd::put_op(key.clone(), encode(&record)?)],
                failure: Vec::new(),
            };
            if within(client.txn(txn)).await?.succeeded {
                return Ok((record, out));
            }
        }
        Err(ProposalError::Unavailable(format!(
            "other instances changed proposal {id} {ATTEMPTS} times while this one tried"
        )))
    }

    /// The fleet's active generation as etcd has it now (`0`: none yet):
    /// what a proposed activation or rollback is planned against.
    pub async fn active_generation(&self) -> Result<GenerationId, ProposalError> {
        let client = self.client().await?;
        let (active, _) = self.read_active(&client).await?;
        Ok(active.map_or(GenerationId::NONE, |a| a.generation))
    }
}
