//! ACME across the fleet (DESIGN §21), over etcd, under the prefix:
//!
//! ```text
//! acme/locks/<id>             held (under a lease) while one instance orders
//! acme/certificates/<id>      the chain and key it got, for every instance
//! acme/answers/<kind>/<name>  challenge answers any instance gives (leased)
//! ```
//!
//! The lock's lease is kept alive while its holder orders; an instance
//! that dies mid-order frees it within the lease's TTL. The private key is
//! in etcd: the fleet's etcd must be as private as `state_dir` (TLS and
//! credentials, `docs/certificates.md`).

use std::time::Duration;

use futures_util::future::BoxFuture;

use super::etcd::wire::{PutRequest, Request, RequestOp, TxnRequest};
use super::etcd::{created_at, delete_op, Client};
use super::{within, Fleet};
use crate::acme::{Answer, OrderLock, Shared, SharedCert};

/// The order lock's lease: an instance gone mid-order frees it this late.
const LOCK_TTL: i64 = 30;
/// A published answer outlives an instance that died mid-order by this.
const ANSWER_TTL: i64 = 300;

fn put_leased(key: String, value: Vec<u8>, lease: i64) -> RequestOp {
    RequestOp {
        request: Some(Request::Put(PutRequest {
            key: key.into_bytes(),
            value,
            lease,
        })),
    }
}

/// The held lock: its lease kept alive until dropped, then revoked.
struct Held {
    keeper: tokio::task::JoinHandle<()>,
    client: Client,
    lease: i64,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.keeper.abort();
        let (client, lease) = (self.client.clone(), self.lease);
        tokio::spawn(async move {
            let _ = within(client.lease_revoke(lease)).await;
        });
    }
}

impl Fleet {
    async fn order_lock(&self, id: &str) -> Result<Option<OrderLock>, String> {
        let client = self.client().await.map_err(|e| e.to_string())?;
        let lease = within(client.lease_grant(LOCK_TTL))
            .await
            .map_err(|e| e.to_string())?;
        let key = self.keys.acme_lock(id);
        let taken = within(client.txn(TxnRequest {
            compare: vec![created_at(key.clone(), 0)],
            success: vec![put_leased(
                key,
                self.spec.instance.clone().into_bytes(),
                lease,
            )],
            failure: Vec::new(),
        }))
        .await
        .map_err(|e| e.to_string())?
        .succeeded;
        if !taken {
            let _ = within(client.lease_revoke(lease)).await;
            return Ok(None);
        }
        let mut keeper = within(client.lease_keep_alive(lease))
            .await
            .map_err(|e| e.to_string())?;
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(
                    u64::try_from(LOCK_TTL / 3).unwrap_or(10),
                ))
                .await;
                match within(keeper.keep_alive()).await {
                    Ok(Some(answer)) if answer.ttl > 0 => {}
                    _ => {
                        tracing::warn!(
                            "the ACME order lock's lease is lost; another instance may order too"
                        );
                        break;
                    }
                }
            }
        });
        Ok(Some(Box::new(Held {
            keeper: task,
            client,
            lease,
        })))
    }

    async fn load_certificate(&self, id: &str) -> Result<Option<SharedCert>, String> {
        let client = self.client().await.map_err(|e| e.to_string())?;
        let answer = within(client.get(self.keys.acme_certificate(id)))
            .await
            .map_err(|e| e.to_string())?;
        match answer.kvs.first() {
            Some(kv) => serde_json::from_slice(&kv.value)
                .map(Some)
                .map_err(|e| format!("the fleet's certificate record does not read: {e}")),
            None => Ok(None),
        }
    }

    async fn store_certificate(&self, id: &str, certificate: &SharedCert) -> Result<(), String> {
        let client = self.client().await.map_err(|e| e.to_string())?;
        let value = serde_json::to_vec(certificate).map_err(|e| e.to_string())?;
        within(client.put(self.keys.acme_certificate(id), value, 0))
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    async fn publish_answer(&self, answer: &Answer) -> Result<(), String> {
        let client = self.client().await.map_err(|e| e.to_string())?;
        let lease = within(client.lease_grant(ANSWER_TTL))
            .await
            .map_err(|e| e.to_string())?;
        let value = serde_json::to_vec(answer).map_err(|e| e.to_string())?;
        within(client.put(
            self.keys.acme_answer(&answer.challenge, &answer.name),
            value,
            lease,
        ))
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
    }

    async fn withdraw_answer(&self, answer: &Answer) -> Result<(), String> {
        let client = self.client().await.map_err(|e| e.to_string())?;
        within(client.txn(TxnRequest {
            compare: Vec::new(),
            success: vec![delete_op(
                self.keys.acme_answer(&answer.challenge, &answer.name),
            )],
            failure: Vec::new(),
        }))
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
    }

    async fn published_answers(&self) -> Result<Vec<Answer>, String> {
        let client = self.client().await.map_err(|e| e.to_string())?;
        let answer = within(client.get_prefix(self.keys.acme_answers(), false))
            .await
            .map_err(|e| e.to_string())?;
        Ok(answer
            .kvs
            .iter()
            .filter_map(|kv| serde_json::from_slice(&kv.value).ok())
            .collect())
    }
}

impl Shared for Fleet {
    fn lock(&self, id: String) -> BoxFuture<'_, Result<Option<OrderLock>, String>> {
        Box::pin(async move { self.order_lock(&id).await })
    }

    fn load(&self, id: String) -> BoxFuture<'_, Result<Option<SharedCert>, String>> {
        Box::pin(async move { self.load_certificate(&id).await })
    }

    fn store(&self, id: String, certificate: SharedCert) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move { self.store_certificate(&id, &certificate).await })
    }

    fn publish(&self, answer: Answer) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move { self.publish_answer(&answer).await })
    }

    fn withdraw(&self, answer: Answer) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move { self.withdraw_answer(&answer).await })
    }

    fn answers(&self) -> BoxFuture<'_, Result<Vec<Answer>, String>> {
        Box::pin(async move { self.published_answers().await })
    }
}
