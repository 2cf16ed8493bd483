//! The etcd v3 messages this crate sends and reads, declared by hand from etcd's
//! `etcdserverpb/rpc.proto` and `mvccpb/kv.proto` (the field numbers are the wire contract).
//!
//! Only the fields the store uses are declared; protobuf skips the others when decoding.
//! Declaring them here instead of generating them keeps `protoc` out of the build.

// The messages mirror the protocol; their fields are documented there.
#![allow(missing_docs, unreachable_pub)]

use prost::Message;

#[derive(Clone, PartialEq, Message)]
pub struct ResponseHeader {
    /// The store's revision when the request was applied (for a write: the write's revision).
    #[prost(int64, tag = "3")]
    pub revision: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct KeyValue {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(int64, tag = "2")]
    pub create_revision: i64,
    #[prost(int64, tag = "3")]
    pub mod_revision: i64,
    #[prost(int64, tag = "4")]
    pub version: i64,
    #[prost(bytes = "vec", tag = "5")]
    pub value: Vec<u8>,
    #[prost(int64, tag = "6")]
    pub lease: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct RangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub limit: i64,
    /// Served by the member asked, without a quorum round (may lag).
    #[prost(bool, tag = "7")]
    pub serializable: bool,
    #[prost(bool, tag = "9")]
    pub count_only: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct RangeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(message, repeated, tag = "2")]
    pub kvs: Vec<KeyValue>,
}

#[derive(Clone, PartialEq, Message)]
pub struct PutRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub lease: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct PutResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
}

#[derive(Clone, PartialEq, Message)]
pub struct DeleteRangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
}

#[derive(Clone, PartialEq, Message)]
pub struct DeleteRangeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub deleted: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct RequestOp {
    #[prost(oneof = "Request", tags = "1, 2, 3")]
    pub request: Option<Request>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Request {
    #[prost(message, tag = "1")]
    Range(RangeRequest),
    #[prost(message, tag = "2")]
    Put(PutRequest),
    #[prost(message, tag = "3")]
    DeleteRange(DeleteRangeRequest),
}

#[derive(Clone, PartialEq, Message)]
pub struct ResponseOp {
    #[prost(oneof = "Response", tags = "1, 2, 3")]
    pub response: Option<Response>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Response {
    #[prost(message, tag = "1")]
    Range(RangeResponse),
    #[prost(message, tag = "2")]
    Put(PutResponse),
    #[prost(message, tag = "3")]
    DeleteRange(DeleteRangeResponse),
}

/// `Compare.result` values.
pub const COMPARE_EQUAL: i32 = 0;
pub const COMPARE_NOT_EQUAL: i32 = 3;
/// `Compare.target` values.
pub const TARGET_CREATE: i32 = 1;
pub const TARGET_MOD: i32 = 2;
pub const TARGET_LEASE: i32 = 4;

#[derive(Clone, PartialEq, Message)]
pub struct Compare {
    #[prost(int32, tag = "1")]
    pub result: i32,
    #[prost(int32, tag = "2")]
    pub target: i32,
    #[prost(bytes = "vec", tag = "3")]
    pub key: Vec<u8>,
    #[prost(oneof = "TargetUnion", tags = "5, 6, 8")]
    pub target_union: Option<TargetUnion>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum TargetUnion {
    #[prost(int64, tag = "5")]
    CreateRevision(i64),
    #[prost(int64, tag = "6")]
    ModRevision(i64),
    #[prost(int64, tag = "8")]
    Lease(i64),
}

#[derive(Clone, PartialEq, Message)]
pub struct TxnRequest {
    #[prost(message, repeated, tag = "1")]
    pub compare: Vec<Compare>,
    #[prost(message, repeated, tag = "2")]
    pub success: Vec<RequestOp>,
    #[prost(message, repeated, tag = "3")]
    pub failure: Vec<RequestOp>,
}

#[derive(Clone, PartialEq, Message)]
pub struct TxnResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(bool, tag = "2")]
    pub succeeded: bool,
    #[prost(message, repeated, tag = "3")]
    pub responses: Vec<ResponseOp>,
}

#[derive(Clone, PartialEq, Message)]
pub struct LeaseGrantRequest {
    #[prost(int64, tag = "1")]
    pub ttl: i64,
    #[prost(int64, tag = "2")]
    pub id: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct LeaseGrantResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub id: i64,
    #[prost(int64, tag = "3")]
    pub ttl: i64,
    #[prost(string, tag = "4")]
    pub error: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct LeaseRevokeRequest {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct LeaseRevokeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
}

#[derive(Clone, PartialEq, Message)]
pub struct LeaseKeepAliveRequest {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct LeaseKeepAliveResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub id: i64,
    /// The lease's new ttl in seconds; 0 or less if the lease no longer exists.
    #[prost(int64, tag = "3")]
    pub ttl: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct WatchCreateRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
}

#[derive(Clone, PartialEq, Message)]
pub struct WatchRequest {
    #[prost(oneof = "WatchRequestUnion", tags = "1")]
    pub request_union: Option<WatchRequestUnion>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum WatchRequestUnion {
    #[prost(message, tag = "1")]
    CreateRequest(WatchCreateRequest),
}

#[derive(Clone, PartialEq, Message)]
pub struct Event {
    #[prost(int32, tag = "1")]
    pub r#type: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct WatchResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(bool, tag = "3")]
    pub created: bool,
    #[prost(bool, tag = "4")]
    pub canceled: bool,
    #[prost(string, tag = "6")]
    pub cancel_reason: String,
    #[prost(message, repeated, tag = "11")]
    pub events: Vec<Event>,
}

#[derive(Clone, PartialEq, Message)]
pub struct AuthenticateRequest {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub password: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct AuthenticateResponse {
    #[prost(string, tag = "2")]
    pub token: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct StatusRequest {}

#[derive(Clone, PartialEq, Message)]
pub struct StatusResponse {
    /// The member's server version, such as `3.5.17`.
    #[prost(string, tag = "2")]
    pub version: String,
}

impl Compare {
    /// `create_revision(key) == revision`; 0 means the key does not exist.
    pub fn created_at(key: &[u8], revision: i64) -> Self {
        Self {
            result: COMPARE_EQUAL,
            target: TARGET_CREATE,
            key: key.to_vec(),
            target_union: Some(TargetUnion::CreateRevision(revision)),
        }
    }

    /// The key is attached to a lease (etcd 3.3 and later): `lease(key) != 0`.
    pub fn leased(key: &[u8]) -> Self {
        Self {
            result: COMPARE_NOT_EQUAL,
            target: TARGET_LEASE,
            key: key.to_vec(),
            target_union: Some(TargetUnion::Lease(0)),
        }
    }

    /// `mod_revision(key) == revision`.
    pub fn modified_at(key: &[u8], revision: i64) -> Self {
        Self {
            result: COMPARE_EQUAL,
            target: TARGET_MOD,
            key: key.to_vec(),
            target_union: Some(TargetUnion::ModRevision(revision)),
        }
    }
}

impl RequestOp {
    /// Read one key.
    pub fn get(key: &[u8]) -> Self {
        Self {
            request: Some(Request::Range(RangeRequest {
                key: key.to_vec(),
                ..RangeRequest::default()
            })),
        }
    }

    /// Write one key, attached to `lease` (0: none).
    pub fn put(key: &[u8], value: Vec<u8>, lease: i64) -> Self {
        Self {
            request: Some(Request::Put(PutRequest {
                key: key.to_vec(),
                value,
                lease,
            })),
        }
    }

    /// Delete one key.
    pub fn delete(key: &[u8]) -> Self {
        Self {
            request: Some(Request::DeleteRange(DeleteRangeRequest {
                key: key.to_vec(),
            })),
        }
    }
}

impl TxnResponse {
    /// The key-values of the `index`-th response, if it was a range.
    pub fn range(&self, index: usize) -> Option<&KeyValue> {
        match self.responses.get(index)?.response.as_ref()? {
            Response::Range(r) => r.kvs.first(),
            _ => None,
        }
    }

    /// The revision the transaction was applied at (the store's revision after it).
    pub fn revision(&self) -> i64 {
        self.header.as_ref().map_or(0, |h| h.revision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compare_on_revision_zero_is_still_sent() {
        // proto3 skips default scalars, but a oneof member is always encoded: "the key does
        // not exist" (create_revision == 0) must reach the server.
        let bytes = Compare::created_at(b"k", 0).encode_to_vec();
        // field 3 (key) and field 5 (create_revision = 0): 0x28 0x00.
        assert!(bytes.windows(2).any(|w| w == [0x28, 0x00]), "{bytes:?}");
    }

    #[test]
    fn unknown_fields_are_skipped() {
        // A KeyValue from a newer server with fields this crate does not declare.
        let mut bytes = KeyValue {
            key: b"k".to_vec(),
            create_revision: 5,
            mod_revision: 7,
            version: 2,
            value: b"v".to_vec(),
            lease: 9,
        }
        .encode_to_vec();
        bytes.extend_from_slice(&[0xf8, 0x01, 0x01]); // field 31, varint 1
        let kv = KeyValue::decode(bytes.as_slice()).unwrap();
        assert_eq!((kv.create_revision, kv.mod_revision, kv.lease), (5, 7, 9));
    }
}
