//! The fleet's etcd v3 client: the calls it makes (range, put, txn,
//! watch, lease grant/keep-alive/revoke, authenticate) over tonic's gRPC
//! channel, with the messages of `wire.rs`.
//!
//! Takes the fleet's endpoints, TLS and credentials; returns plain
//! messages and one error type. The channel balances over the endpoints
//! and reconnects by itself; HTTP/2 keep-alive finds a dead etcd under an
//! idle watch. With credentials, every call carries etcd's auth token,
//! taken again when etcd says it expired.

pub mod wire;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::uri::PathAndQuery;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::client::Grpc;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Status, Streaming};
use tonic_prost::ProstCodec;

use crate::plan::FleetSpec;
use wire::*;

/// An etcd call that failed.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// etcd (or the gRPC layer) answered with an error status.
    #[error("{}: {}", .0.code(), .0.message())]
    Status(#[from] Status),
    /// An endpoint or TLS setting tonic cannot use.
    #[error("{0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("etcd's auth token is not a valid header value")]
    Token,
    /// A stream's sending side is gone (the stream ended).
    #[error("the {0} stream is closed")]
    Closed(&'static str),
}

/// Connected to one etcd cluster. Cheap to clone: clones share the channel
/// and the auth token.
#[derive(Clone)]
pub struct Client {
    channel: Channel,
    credentials: Option<Arc<(String, String)>>,
    token: Arc<Mutex<Option<MetadataValue<tonic::metadata::Ascii>>>>,
}

/// The key after every key that starts with `prefix`: a range's end.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte 0xff: etcd's "to the end of the keyspace".
    vec![0]
}

impl Client {
    /// A lazily connected client; with credentials, authenticates once now
    /// (so wrong credentials are an error here, not on every later call).
    pub async fn connect(spec: &FleetSpec) -> Result<Self, EtcdError> {
        let tls = spec.tls.as_ref().map(|tls| {
            let config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&tls.ca));
            match &tls.identity {
                Some((cert, key)) => config.identity(Identity::from_pem(cert, key)),
                None => config,
            }
        });
        let mut endpoints = Vec::with_capacity(spec.endpoints.len());
        for url in &spec.endpoints {
            let mut endpoint = Endpoint::from_shared(url.clone())?
                .connect_timeout(Duration::from_secs(2))
                .tcp_nodelay(true)
                // Finds a dead etcd under an idle watch.
                .http2_keep_alive_interval(Duration::from_secs(5))
                .keep_alive_timeout(Duration::from_secs(3))
                .keep_alive_while_idle(true);
            if let Some(tls) = &tls {
                endpoint = endpoint.tls_config(tls.clone())?;
            }
            endpoints.push(endpoint);
        }
        let client = Client {
            channel: Channel::balance_list(endpoints.into_iter()),
            credentials: spec.credentials.clone().map(Arc::new),
            token: Arc::new(Mutex::new(None)),
        };
        if client.credentials.is_some() {
            client.authenticate().await?;
        }
        Ok(client)
    }

    /// Takes a new auth token with the fleet's credentials.
    async fn authenticate(&self) -> Result<(), EtcdError> {
        let Some(credentials) = &self.credentials else {
            return Ok(());
        };
        let request = AuthenticateRequest {
            name: credentials.0.clone(),
            password: credentials.1.clone(),
        };
        let answer: AuthenticateResponse = self
            .unary_once(
                tonic::Request::new(request),
                "/etcdserverpb.Auth/Authenticate",
            )
            .await?;
        let token = MetadataValue::try_from(answer.token).map_err(|_| EtcdError::Token)?;
        *self.token.lock().unwrap_or_else(PoisonError::into_inner) = Some(token);
        Ok(())
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        let token = self
            .token
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(token) = token {
            request.metadata_mut().insert("token", token);
        }
        request
    }

    async fn unary_once<Q, A>(
        &self,
        request: tonic::Request<Q>,
        path: &'static str,
    ) -> Result<A, EtcdError>
    where
        Q: prost::Message + Send + Sync + 'static,
        A: prost::Message + Default + Send + Sync + 'static,
    {
        let answer = self
            .grpc()
            .await?
            .unary(
                request,
                PathAndQuery::from_static(path),
                ProstCodec::<Q, A>::default(),
            )
            .await?;
        Ok(answer.into_inner())
    }

    /// A gRPC client on the channel, once the channel can take a call.
    async fn grpc(&self) -> Result<Grpc<Channel>, EtcdError> {
        let mut grpc = Grpc::new(self.channel.clone());
        grpc.ready()
            .await
            .map_err(|e| Status::unavailable(format!("etcd: {e}")))?;
        Ok(grpc)
    }

    /// One call; an expired token is taken again and the call repeated once.
    async fn unary<Q, A>(&self, message: Q, path: &'static str) -> Result<A, EtcdError>
    where
        Q: prost::Message + Clone + Send + Sync + 'static,
        A: prost::Message + Default + Send + Sync + 'static,
    {
        match self.unary_once(self.request(message.clone()), path).await {
            Err(EtcdError::Status(status)) if self.token_expired(&status) => {
                self.authenticate().await?;
                self.unary_once(self.request(message), path).await
            }
            other => other,
        }
    }

    fn token_expired(&self, status: &Status) -> bool {
        // etcd answers Unauthenticated ("invalid auth token") for an
        // expired simple token.
        self.credentials.is_some() && status.code() == Code::Unauthenticated
    }

    /// A bidirectional stream whose first message is `first`; the sender
    /// stays open as long as the caller holds it (etcd ends a watch whose
    /// client half-closes).
    async fn stream<Q, A>(
        &self,
        first: Q,
        path: &'static str,
    ) -> Result<(mpsc::Sender<Q>, Streaming<A>), EtcdError>
    where
        Q: prost::Message + Clone + Send + Sync + 'static,
        A: prost::Message + Default + Send + Sync + 'static,
    {
        let mut attempt = 0;
        loop {
            let (sender, receiver) = mpsc::channel(4);
            sender
                .send(first.clone())
                .await
                .map_err(|_| EtcdError::Closed(path))?;
            let request = self.request(ReceiverStream::new(receiver));
            let codec = ProstCodec::<Q, A>::default();
            match self
                .grpc()
                .await?
                .streaming(request, PathAndQuery::from_static(path), codec)
                .await
            {
                Ok(answer) => return Ok((sender, answer.into_inner())),
                Err(status) if attempt == 0 && self.token_expired(&status) => {
                    attempt += 1;
                    self.authenticate().await?;
                }
                Err(status) => return Err(status.into()),
            }
        }
    }

    /// The keys `request` asks for.
    pub async fn range(&self, request: RangeRequest) -> Result<RangeResponse, EtcdError> {
        self.unary(request, "/etcdserverpb.KV/Range").await
    }

    pub async fn get(&self, key: impl Into<Vec<u8>>) -> Result<RangeResponse, EtcdError> {
        self.range(RangeRequest {
            key: key.into(),
            ..RangeRequest::default()
        })
        .await
    }

    /// Every key under `prefix`, in key order.
    pub async fn get_prefix(
        &self,
        prefix: impl Into<Vec<u8>>,
        keys_only: bool,
    ) -> Result<RangeResponse, EtcdError> {
        let key = prefix.into();
        self.range(RangeRequest {
            range_end: prefix_end(&key),
            key,
            keys_only,
            ..RangeRequest::default()
        })
        .await
    }

    /// `lease` 0: none.
    pub async fn put(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        lease: i64,
    ) -> Result<PutResponse, EtcdError> {
        let request = PutRequest {
            key: key.into(),
            value: value.into(),
            lease,
        };
        self.unary(request, "/etcdserverpb.KV/Put").await
    }

    pub async fn txn(&self, request: TxnRequest) -> Result<TxnResponse, EtcdError> {
        self.unary(request, "/etcdserverpb.KV/Txn").await
    }

    /// Watches `key` from `start_revision` on.
    pub async fn watch(
        &self,
        key: impl Into<Vec<u8>>,
        start_revision: i64,
    ) -> Result<Watch, EtcdError> {
        let create = WatchRequest {
            request_union: Some(WatchRequestUnion::Create(WatchCreateRequest {
                key: key.into(),
                range_end: Vec::new(),
                start_revision,
            })),
        };
        let (sender, stream) = self.stream(create, "/etcdserverpb.Watch/Watch").await?;
        Ok(Watch {
            _sender: sender,
            stream,
        })
    }

    /// A lease that lives `ttl` seconds unless kept alive.
    pub async fn lease_grant(&self, ttl: i64) -> Result<i64, EtcdError> {
        let answer: LeaseGrantResponse = self
            .unary(LeaseGrantRequest { ttl }, "/etcdserverpb.Lease/LeaseGrant")
            .await?;
        if answer.error.is_empty() {
            Ok(answer.id)
        } else {
            Err(Status::failed_precondition(answer.error).into())
        }
    }

    pub async fn lease_revoke(&self, id: i64) -> Result<(), EtcdError> {
        let _: LeaseRevokeResponse = self
            .unary(LeaseRevokeRequest { id }, "/etcdserverpb.Lease/LeaseRevoke")
            .await?;
        Ok(())
    }

    /// A keep-alive stream for lease `id`, which it renews once now.
    pub async fn lease_keep_alive(&self, id: i64) -> Result<Keeper, EtcdError> {
        let request = LeaseKeepAliveRequest { id };
        let (sender, mut stream): (_, Streaming<LeaseKeepAliveResponse>) = self
            .stream(request, "/etcdserverpb.Lease/LeaseKeepAlive")
            .await?;
        match stream.message().await? {
            Some(answer) if answer.ttl > 0 => Ok(Keeper { id, sender, stream }),
            _ => Err(Status::not_found(format!("lease {id:x} is gone")).into()),
        }
    }
}

/// One watch; ends when dropped.
pub struct Watch {
    _sender: mpsc::Sender<WatchRequest>,
    stream: Streaming<WatchResponse>,
}

impl Watch {
    /// The next answer; `None` when etcd closed the stream.
    pub async fn message(&mut self) -> Result<Option<WatchResponse>, EtcdError> {
        Ok(self.stream.message().await?)
    }
}

/// Keeps one lease alive.
pub struct Keeper {
    id: i64,
    sender: mpsc::Sender<LeaseKeepAliveRequest>,
    stream: Streaming<LeaseKeepAliveResponse>,
}

impl Keeper {
    /// Renews the lease; its answer's `ttl` is 0 when the lease is gone.
    pub async fn keep_alive(&mut self) -> Result<Option<LeaseKeepAliveResponse>, EtcdError> {
        self.sender
            .send(LeaseKeepAliveRequest { id: self.id })
            .await
            .map_err(|_| EtcdError::Closed("lease keep-alive"))?;
        Ok(self.stream.message().await?)
    }
}

/// `key`'s create revision compared with `revision` (0: the key is absent).
pub fn created_at(key: impl Into<Vec<u8>>, revision: i64) -> Compare {
    Compare {
        result: CompareResult::Equal as i32,
        target: CompareTarget::Create as i32,
        key: key.into(),
        target_union: Some(TargetUnion::CreateRevision(revision)),
    }
}

/// `key` was last modified at `revision`.
pub fn modified_at(key: impl Into<Vec<u8>>, revision: i64) -> Compare {
    Compare {
        result: CompareResult::Equal as i32,
        target: CompareTarget::Mod as i32,
        key: key.into(),
        target_union: Some(TargetUnion::ModRevision(revision)),
    }
}

pub fn put_op(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> RequestOp {
    RequestOp {
        request: Some(Request::Put(PutRequest {
            key: key.into(),
            value: value.into(),
            lease: 0,
        })),
    }
}

pub fn get_op(key: impl Into<Vec<u8>>) -> RequestOp {
    RequestOp {
        request: Some(Request::Range(RangeRequest {
            key: key.into(),
            ..RangeRequest::default()
        })),
    }
}

pub fn delete_op(key: impl Into<Vec<u8>>) -> RequestOp {
    RequestOp {
        request: Some(Request::DeleteRange(DeleteRangeRequest {
            key: key.into(),
            range_end: Vec::new(),
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::prefix_end;

    #[test]
    fn a_prefix_ends_at_its_successor() {
        assert_eq!(prefix_end(b"/cutover/instances/"), b"/cutover/instances0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }
}
