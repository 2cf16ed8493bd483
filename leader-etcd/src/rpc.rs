//! The etcd v3 gRPC calls the store makes, over one tonic channel: KV `Range` and `Txn`, Lease
//! `LeaseGrant`, `LeaseRevoke` and `LeaseKeepAlive`, `Watch`, and Auth `Authenticate`.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use http::uri::PathAndQuery;
use tokio_stream::StreamExt;
use tonic::client::Grpc;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::Channel;
use tonic::{Request, Status, Streaming};
use tonic_prost::ProstCodec;

use crate::wire;

const RANGE: &str = "/etcdserverpb.KV/Range";
const TXN: &str = "/etcdserverpb.KV/Txn";
const LEASE_GRANT: &str = "/etcdserverpb.Lease/LeaseGrant";
const LEASE_REVOKE: &str = "/etcdserverpb.Lease/LeaseRevoke";
const LEASE_KEEP_ALIVE: &str = "/etcdserverpb.Lease/LeaseKeepAlive";
const WATCH: &str = "/etcdserverpb.Watch/Watch";
const AUTHENTICATE: &str = "/etcdserverpb.Auth/Authenticate";
const STATUS: &str = "/etcdserverpb.Maintenance/Status";

/// A user name and password, and the token etcd gave for them.
pub(crate) struct Auth {
    pub(crate) user: String,
    pub(crate) password: String,
    token: RwLock<Option<AsciiMetadataValue>>,
}

impl Auth {
    pub(crate) fn new(user: String, password: String) -> Self {
        Self {
            user,
            password,
            token: RwLock::new(None),
        }
    }
}

/// The gRPC client: cheap to clone (the channel is shared).
#[derive(Clone)]
pub(crate) struct Rpc {
    grpc: Grpc<Channel>,
    auth: Option<Arc<Auth>>,
}

impl Rpc {
    pub(crate) fn new(channel: Channel, auth: Option<Auth>) -> Self {
        Self {
            grpc: Grpc::new(channel),
            auth: auth.map(Arc::new),
        }
    }

    /// A request with the auth token (authenticating first if there is none yet) and a
    /// deadline the server also sees (`grpc-timeout`).
    async fn request<T>(&self, message: T, left: Duration) -> Result<Request<T>, Status> {
        let mut request = Request::new(message);
        request.set_timeout(left);
        require_leader(&mut request);
        if let Some(auth) = &self.auth {
            let cached = auth.token.read().ok().and_then(|t| t.clone());
            let token = match cached {
                Some(token) => token,
                None => self.authenticate(auth, left).await?,
            };
            request.metadata_mut().insert("token", token);
        }
        Ok(request)
    }

    async fn authenticate(
        &self,
        auth: &Auth,
        left: Duration,
    ) -> Result<AsciiMetadataValue, Status> {
        let mut request = Request::new(wire::AuthenticateRequest {
            name: auth.user.clone(),
            password: auth.password.clone(),
        });
        request.set_timeout(left);
        // etcd reads linearizably before it checks the password: on a member without a leader
        // that would take the whole budget.
        require_leader(&mut request);
        let answer: wire::AuthenticateResponse = self.call(AUTHENTICATE, request).await?;
        let token = AsciiMetadataValue::try_from(answer.token.as_str())
            .map_err(|_| Status::internal("etcd returned an auth token that is not ASCII"))?;
        if let Ok(mut slot) = auth.token.write() {
            *slot = Some(token.clone());
        }
        Ok(token)
    }

    /// Forgets the auth token after etcd refused it, so that the next request authenticates.
    fn on_error(&self, status: &Status) {
        if let Some(auth) = &self.auth
            && crate::error::is_stale_token(status)
            && let Ok(mut slot) = auth.token.write()
        {
            *slot = None;
        }
    }

    /// `result`, after forgetting a token that etcd refused.
    fn noted<T>(&self, result: Result<T, Status>) -> Result<T, Status> {
        if let Err(status) = &result {
            self.on_error(status);
        }
        result
    }

    /// The client, once the channel has a connection to send on.
    async fn connected(&self) -> Result<Grpc<Channel>, Status> {
        let mut grpc = self.grpc.clone();
        grpc.ready()
            .await
            .map_err(|e| Status::unavailable(format!("error trying to connect: {e}")))?;
        Ok(grpc)
    }

    async fn call<Req, Resp>(
        &self,
        path: &'static str,
        request: Request<Req>,
    ) -> Result<Resp, Status>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let answer = self
            .connected()
            .await?
            .unary(
                request,
                PathAndQuery::from_static(path),
                ProstCodec::default(),
            )
            .await;
        self.noted(answer.map(tonic::Response::into_inner))
    }

    /// Opens a bidirectional stream on `path` with `request`'s messages.
    async fn open<S, Req, Resp>(
        &self,
        path: &'static str,
        request: Request<S>,
    ) -> Result<Streaming<Resp>, Status>
    where
        S: tokio_stream::Stream<Item = Req> + Send + 'static,
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let answer = self
            .connected()
            .await?
            .streaming(
                request,
                PathAndQuery::from_static(path),
                ProstCodec::default(),
            )
            .await;
        self.noted(answer.map(tonic::Response::into_inner))
    }

    async fn unary<Req, Resp>(
        &self,
        path: &'static str,
        message: Req,
        left: Duration,
    ) -> Result<Resp, Status>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let request = self.request(message, left).await?;
        self.call(path, request).await
    }

    /// Reads one key: linearizable, or `serializable` (served by the member asked, may lag).
    pub(crate) async fn get(
        &self,
        key: &[u8],
        serializable: bool,
        left: Duration,
    ) -> Result<(Option<wire::KeyValue>, i64), Status> {
        let request = wire::RangeRequest {
            key: key.to_vec(),
            serializable,
            ..wire::RangeRequest::default()
        };
        let answer: wire::RangeResponse = self.unary(RANGE, request, left).await?;
        let revision = answer.header.as_ref().map_or(0, |h| h.revision);
        Ok((answer.kvs.into_iter().next(), revision))
    }

    /// Counts the keys from `key` to the end of its prefix range: a cheap request that proves
    /// the cluster answers and the user may read there.
    pub(crate) async fn probe(&self, key: &[u8], left: Duration) -> Result<(), Status> {
        let request = wire::RangeRequest {
            key: key.to_vec(),
            count_only: true,
            ..wire::RangeRequest::default()
        };
        let _: wire::RangeResponse = self.unary(RANGE, request, left).await?;
        Ok(())
    }

    /// The version of the member that answers; asked without [`require_leader`], so that a
    /// member without a leader still tells it (the version warning of `build`).
    pub(crate) async fn version(&self, left: Duration) -> Result<String, Status> {
        let mut request = self.request(wire::StatusRequest {}, left).await?;
        request.metadata_mut().remove("hasleader");
        let answer: wire::StatusResponse = self.call(STATUS, request).await?;
        Ok(answer.version)
    }

    pub(crate) async fn txn(
        &self,
        txn: wire::TxnRequest,
        left: Duration,
    ) -> Result<wire::TxnResponse, Status> {
        self.unary(TXN, txn, left).await
    }

    /// Grants lease `id` for `ttl_secs`; returns the ttl granted.
    pub(crate) async fn grant(
        &self,
        id: i64,
        ttl_secs: i64,
        left: Duration,
    ) -> Result<i64, Status> {
        let request = wire::LeaseGrantRequest { ttl: ttl_secs, id };
        let answer: wire::LeaseGrantResponse = self.unary(LEASE_GRANT, request, left).await?;
        if !answer.error.is_empty() {
            return Err(Status::failed_precondition(answer.error));
        }
        Ok(answer.ttl)
    }

    /// Revokes lease `id`, deleting the keys attached to it.
    pub(crate) async fn revoke(&self, id: i64, left: Duration) -> Result<(), Status> {
        let _: wire::LeaseRevokeResponse = self
            .unary(LEASE_REVOKE, wire::LeaseRevokeRequest { id }, left)
            .await?;
        Ok(())
    }

    /// Refreshes lease `id` once; returns its new ttl in seconds (0 or less: it is gone).
    pub(crate) async fn keep_alive(&self, id: i64, left: Duration) -> Result<i64, Status> {
        let request = self
            .request(tokio_stream::once(wire::LeaseKeepAliveRequest { id }), left)
            .await?;
        let mut stream: Streaming<wire::LeaseKeepAliveResponse> =
            self.open(LEASE_KEEP_ALIVE, request).await?;
        match self.noted(stream.message().await)? {
            Some(answer) => Ok(answer.ttl),
            None => Err(Status::unknown(
                "etcd closed the keep-alive stream without an answer",
            )),
        }
    }

    /// Watches `key`: a stream of responses, one per batch of changes, until it fails.
    pub(crate) async fn watch(
        &self,
        key: &[u8],
        connect: Duration,
    ) -> Result<Streaming<wire::WatchResponse>, Status> {
        let create = wire::WatchRequest {
            request_union: Some(wire::WatchRequestUnion::CreateRequest(
                wire::WatchCreateRequest { key: key.to_vec() },
            )),
        };
        // The request stream stays open: closing it would end the watch.
        let requests = tokio_stream::once(create).chain(tokio_stream::pending());
        let mut request = self.request(requests, connect).await?;
        // The watch itself has no deadline; only the token lookup above had one.
        request.metadata_mut().remove("grpc-timeout");
        self.open(WATCH, request).await
    }
}

/// Asks the member to refuse the request with "no leader" if it has lost the cluster's leader
/// (cut off from the majority) rather than hold it until it times out (clientv3's
/// `WithRequireLeader`). etcd says so after its own check (about an election timeout, 1 to
/// 2 s by default); the refusal is never applied, and the call is retried on the balanced
/// channel. A watch on such a member is cancelled by etcd, and the store opens it again.
fn require_leader<T>(request: &mut Request<T>) {
    request
        .metadata_mut()
        .insert("hasleader", AsciiMetadataValue::from_static("true"));
}
