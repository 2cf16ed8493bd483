//! Typed errors: what went wrong, with its cause, and what to do about it.

use std::time::Duration;

use crate::token::FencingToken;

/// A boxed error from a backend's SDK or the operating system.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An error from a lease store or from the lease logic on top of it.
///
/// A conflicting conditional write is not an error: backends report it as
/// [`WriteOutcome::Conflict`](crate::backend::WriteOutcome::Conflict).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The container, table, bucket or folder that holds the leases does not exist.
    #[error("{what} does not exist; create it, or opt in to creating it when missing")]
    NotFound {
        /// What is missing, named as the user configured it.
        what: String,
        /// The store's own error.
        #[source]
        source: Option<BoxError>,
    },
    /// The store did not accept the credentials.
    #[error(
        "the store rejected the credentials ({message}); check the configured identity and keys"
    )]
    Unauthenticated {
        /// What the store said.
        message: String,
        /// The store's own error.
        #[source]
        source: Option<BoxError>,
    },
    /// The credentials are valid but may not do this.
    #[error("permission denied ({message}); grant the identity read and write access to the lease")]
    PermissionDenied {
        /// What the store said.
        message: String,
        /// The store's own error.
        #[source]
        source: Option<BoxError>,
    },
    /// The store could not be reached or answered with a server error; retried with backoff.
    #[error("the store is unavailable ({message}); retrying")]
    Unavailable {
        /// What failed.
        message: String,
        /// The underlying error.
        #[source]
        source: Option<BoxError>,
    },
    /// The store asked us to slow down; retried with backoff.
    #[error("the store is throttling requests ({message}); retrying with backoff")]
    Throttled {
        /// What the store said.
        message: String,
        /// The store's own error.
        #[source]
        source: Option<BoxError>,
    },
    /// A request that changes nothing (a read) did not finish within the request timeout.
    #[error("{operation} did not finish within {after:?}; retrying")]
    Timeout {
        /// The operation that timed out.
        operation: &'static str,
        /// The request timeout.
        after: Duration,
    },
    /// A conditional write may or may not have been applied (it timed out, or its response was
    /// lost). The lease logic re-reads the record to decide; it never repeats the write blindly.
    #[error("the outcome of a write is unknown ({message}); re-reading the record to decide")]
    Indeterminate {
        /// Why the outcome is unknown.
        message: String,
        /// The underlying error.
        #[source]
        source: Option<BoxError>,
    },
    /// The store's configuration is wrong (a bad endpoint, an unsupported lease duration).
    #[error("invalid store configuration: {message}")]
    InvalidConfig {
        /// What is wrong and how to fix it.
        message: String,
        /// The underlying error.
        #[source]
        source: Option<BoxError>,
    },
    /// The stored record cannot be parsed. It is never overwritten by a normal campaign: an
    /// operator must fix or delete it.
    #[error(
        "the lease record for {key:?} is malformed: {detail}; it will not be overwritten, fix or delete it"
    )]
    MalformedRecord {
        /// The lease key (or object name) whose record is bad.
        key: String,
        /// What is wrong with it.
        detail: String,
    },
    /// A fenced write was rejected because a newer term has written (or holds the lease): the
    /// writer is a deposed leader and must stop.
    #[error(
        "fenced write to {object:?} rejected: token {presented} is stale{}; this instance is no longer leader and must stop",
        .highest.map(|h| format!(" (the object was written with token {h})")).unwrap_or_default()
    )]
    Fenced {
        /// The protected object (or lease) that rejected the write.
        object: String,
        /// The token the writer presented.
        presented: FencingToken,
        /// The highest token the object has accepted, when the store tells.
        highest: Option<FencingToken>,
    },
    /// Any other failure of the backend; retried with backoff.
    #[error("store error: {message}")]
    Backend {
        /// What failed.
        message: String,
        /// The underlying error.
        #[source]
        source: Option<BoxError>,
    },
}

/// The kind of an [`Error`], as a plain value (for `Leadership`, metrics and exit codes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[allow(missing_docs)]
pub enum ErrorKind {
    NotFound,
    Unauthenticated,
    PermissionDenied,
    Unavailable,
    Throttled,
    Timeout,
    Indeterminate,
    InvalidConfig,
    MalformedRecord,
    Fenced,
    Backend,
}

impl Error {
    /// The kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::NotFound { .. } => ErrorKind::NotFound,
            Error::Unauthenticated { .. } => ErrorKind::Unauthenticated,
            Error::PermissionDenied { .. } => ErrorKind::PermissionDenied,
            Error::Unavailable { .. } => ErrorKind::Unavailable,
            Error::Throttled { .. } => ErrorKind::Throttled,
            Error::Timeout { .. } => ErrorKind::Timeout,
            Error::Indeterminate { .. } => ErrorKind::Indeterminate,
            Error::InvalidConfig { .. } => ErrorKind::InvalidConfig,
            Error::MalformedRecord { .. } => ErrorKind::MalformedRecord,
            Error::Fenced { .. } => ErrorKind::Fenced,
            Error::Backend { .. } => ErrorKind::Backend,
        }
    }

    /// Whether waiting and trying again may help: unavailable, throttled, timed out,
    /// indeterminate, or an unclassified backend error. Credentials, permissions, missing
    /// containers, bad configuration, malformed records and fencing need a person.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind(),
            ErrorKind::Unavailable
                | ErrorKind::Throttled
                | ErrorKind::Timeout
                | ErrorKind::Indeterminate
                | ErrorKind::Backend
        )
    }

    /// Shorthand for [`Error::Unavailable`] without a source.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Error::Unavailable {
            message: message.into(),
            source: None,
        }
    }

    /// Shorthand for [`Error::Indeterminate`] without a source.
    pub fn indeterminate(message: impl Into<String>) -> Self {
        Error::Indeterminate {
            message: message.into(),
            source: None,
        }
    }

    /// Shorthand for [`Error::Backend`] with a source.
    pub fn backend(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Error::Backend {
            message: message.into(),
            source: Some(source.into()),
        }
    }
}

/// A configuration error: one variant per rule, each saying how to fix it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A name (lease key, object name, holder id) is not valid.
    #[error("invalid {what} {name:?}: {reason}")]
    InvalidName {
        /// Which kind of name.
        what: &'static str,
        /// The name as given.
        name: String,
        /// Why it was rejected.
        reason: String,
    },
    /// Metadata is not valid.
    #[error("invalid metadata: {0}")]
    InvalidMetadata(String),
    /// A duration that must be positive is zero.
    #[error("{field} must be greater than zero")]
    ZeroDuration {
        /// The setting.
        field: &'static str,
    },
    /// `margin` must be at least twice the request timeout, so that a renew in flight at the
    /// deadline cannot outlive the lease.
    #[error(
        "margin {margin:?} must be at least 2 x request_timeout ({request_timeout:?}); raise margin or lower request_timeout"
    )]
    MarginTooSmall {
        /// The configured margin.
        margin: Duration,
        /// The configured request timeout.
        request_timeout: Duration,
    },
    /// `renew_every + request_timeout + margin` must be below `ttl`, or the leader cannot renew
    /// before its own deadline.
    #[error(
        "renew_every {renew_every:?} + request_timeout {request_timeout:?} + margin {margin:?} must be less than ttl {ttl:?}; raise ttl or renew more often"
    )]
    NoTimeToRenew {
        /// The lease duration.
        ttl: Duration,
        /// The renew period.
        renew_every: Duration,
        /// The request timeout.
        request_timeout: Duration,
        /// The safety margin.
        margin: Duration,
    },
    /// A sharded election's shard count is out of range.
    #[error("invalid shard count: {0}")]
    InvalidShards(String),
    /// An election over several stores is set up wrong (an even number of members, a member
    /// named twice).
    #[error("invalid quorum: {0}")]
    InvalidQuorum(String),
    /// The backend does not support these settings (Azure: lease 15 to 60 s; GCS: at most one
    /// write per second to an object).
    #[error("{backend} does not support this setting: {reason}")]
    Unsupported {
        /// The backend that refused.
        backend: &'static str,
        /// What it needs.
        reason: String,
    },
}
