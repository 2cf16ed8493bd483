//! The one place where ZooKeeper's errors become [`leader_core::Error`]s.
//!
//! `client.rs` first handles the answers that are outcomes of the protocol, not failures
//! (`NoNode` on a read, `NodeExists` and `BadVersion` on a conditional write, `NoAuth` on a
//! write to another term's node); whatever is left comes here. A request's kind decides what a
//! lost answer means: a read may be asked again, a write may have been applied.

use leader_core::{BoxError, Error};
use zookeeper_client::Error as ZkError;

/// A request to ZooKeeper: what it did, and to which node.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Request<'a> {
    /// `true` if the request changes data (a lost answer then leaves its outcome unknown).
    pub(crate) write: bool,
    /// What the request did, for messages ("reading the lease node").
    pub(crate) what: &'static str,
    /// The node it addressed.
    pub(crate) path: &'a str,
}

impl<'a> Request<'a> {
    /// A request that changes nothing.
    pub(crate) fn read(what: &'static str, path: &'a str) -> Self {
        Self {
            write: false,
            what,
            path,
        }
    }

    /// A request that changes data.
    pub(crate) fn write(what: &'static str, path: &'a str) -> Self {
        Self {
            write: true,
            what,
            path,
        }
    }
}

/// What a failed request means for the lease protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    /// The node (or, for a create, its parent) does not exist.
    NoNode,
    /// The node's ACL (or its parent's, for a create or delete) does not allow this session.
    NoAuth,
    /// The server refused the session's credentials.
    AuthFailed,
    /// The server is overloaded and shed the request before applying it.
    Throttled,
    /// The request never reached a server that could apply it (no server answered, the client
    /// is connected to a read-only server, the session moved).
    NotSent,
    /// The connection broke (or the client gave it up for silence) with the request sent or
    /// queued: a write may have been applied.
    Lost,
    /// The session ended (expired or closed): it can do nothing more.
    SessionEnded,
    /// A condition of the request did not hold (`NodeExists`, `BadVersion`, `NotEmpty`).
    Condition,
    /// The request was malformed or is not supported (a bad path, an old server).
    Rejected,
    /// Anything else.
    Other,
}

impl Class {
    /// Classifies one failure.
    pub(crate) fn of(error: &ZkError) -> Class {
        match error {
            ZkError::NoNode => Class::NoNode,
            ZkError::NoAuth => Class::NoAuth,
            ZkError::AuthFailed => Class::AuthFailed,
            ZkError::Throttled => Class::Throttled,
            ZkError::NoHosts | ZkError::NotReadOnly | ZkError::SessionMoved => Class::NotSent,
            // The client reports a broken connection (reset, no answer in time) as a custom
            // error with the I/O error inside.
            ZkError::ConnectionLoss | ZkError::Timeout | ZkError::Custom(_) => Class::Lost,
            // The client fails every request in flight with the error of a reply it could not
            // read, or an answer it did not expect: a write among them may have been applied.
            ZkError::UnmarshalError { .. }
            | ZkError::UnexpectedError(_)
            | ZkError::UnexpectedErrorCode(_)
            | ZkError::RuntimeInconsistent => Class::Lost,
            ZkError::SessionExpired | ZkError::ClientClosed => Class::SessionEnded,
            ZkError::NodeExists | ZkError::BadVersion | ZkError::NotEmpty => Class::Condition,
            ZkError::BadArguments(_)
            | ZkError::InvalidAcl
            | ZkError::NoChildrenForEphemerals
            | ZkError::Unimplemented
            | ZkError::MarshallingError
            | ZkError::ReconfigDisabled => Class::Rejected,
            _ => Class::Other,
        }
    }
}

/// Maps a failed request to the core's error. This is the only such mapping of the crate.
///
/// A `NoNode` that reaches this function is a missing parent (reads handle a missing lease
/// node themselves). A session that ended is `Unavailable` for a read (the next attempt opens
/// a new session) and `Indeterminate` for a write (a request in flight when the session ended
/// may have been applied).
pub(crate) fn map_error(error: ZkError, request: Request<'_>) -> Error {
    let class = Class::of(&error);
    let message = format!("{} {}: {error}", request.what, request.path);
    let source = Some(Box::new(error) as BoxError);
    match class {
        Class::NoNode => Error::NotFound {
            what: format!("the ZooKeeper node {} (or its parent)", request.path),
            source,
        },
        Class::NoAuth => Error::PermissionDenied {
            message: format!(
                "{message}; the ACL of {} or of its parent does not allow this to an \
                 unauthenticated client (the lease nodes' parent needs READ, CREATE and DELETE \
                 for world:anyone or the candidates' ip)",
                request.path
            ),
            source,
        },
        Class::AuthFailed => Error::Unauthenticated { message, source },
        Class::Throttled => Error::Throttled { message, source },
        Class::NotSent => Error::Unavailable { message, source },
        Class::Lost | Class::SessionEnded if request.write => {
            Error::Indeterminate { message, source }
        }
        Class::Lost | Class::SessionEnded => Error::Unavailable { message, source },
        Class::Rejected => Error::InvalidConfig { message, source },
        Class::Condition | Class::Other => Error::Backend { message, source },
    }
}

/// The error for a missing parent of the lease nodes.
pub(crate) fn parent_missing(parent: &str, source: Option<ZkError>) -> Error {
    Error::NotFound {
        what: format!(
            "the ZooKeeper node {parent} (the parent of the lease nodes; create it, e.g. \
             `create {parent}` in zkCli.sh, or build the store with with_create_path(true))"
        ),
        source: source.map(|e| Box::new(e) as BoxError),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leader_core::ErrorKind;

    const READ: Request<'static> = Request {
        write: false,
        what: "reading the lease node",
        path: "/leader-lease/jobs",
    };
    const WRITE: Request<'static> = Request {
        write: true,
        ..READ
    };

    #[test]
    fn each_failure_maps_to_its_core_error() {
        let cases = [
            (ZkError::NoNode, ErrorKind::NotFound, ErrorKind::NotFound),
            (
                ZkError::NoAuth,
                ErrorKind::PermissionDenied,
                ErrorKind::PermissionDenied,
            ),
            (
                ZkError::AuthFailed,
                ErrorKind::Unauthenticated,
                ErrorKind::Unauthenticated,
            ),
            (
                ZkError::Throttled,
                ErrorKind::Throttled,
                ErrorKind::Throttled,
            ),
            (
                ZkError::NoHosts,
                ErrorKind::Unavailable,
                ErrorKind::Unavailable,
            ),
            (
                ZkError::NotReadOnly,
                ErrorKind::Unavailable,
                ErrorKind::Unavailable,
            ),
            (
                ZkError::ConnectionLoss,
                ErrorKind::Unavailable,
                ErrorKind::Indeterminate,
            ),
            (
                ZkError::Timeout,
                ErrorKind::Unavailable,
                ErrorKind::Indeterminate,
            ),
            (
                ZkError::UnexpectedErrorCode(-999),
                ErrorKind::Unavailable,
                ErrorKind::Indeterminate,
            ),
            (
                ZkError::RuntimeInconsistent,
                ErrorKind::Unavailable,
                ErrorKind::Indeterminate,
            ),
            (
                ZkError::SessionExpired,
                ErrorKind::Unavailable,
                ErrorKind::Indeterminate,
            ),
            (
                ZkError::ClientClosed,
                ErrorKind::Unavailable,
                ErrorKind::Indeterminate,
            ),
            (
                ZkError::BadArguments(&"bad path"),
                ErrorKind::InvalidConfig,
                ErrorKind::InvalidConfig,
            ),
            (
                ZkError::Unimplemented,
                ErrorKind::InvalidConfig,
                ErrorKind::InvalidConfig,
            ),
            (ZkError::BadVersion, ErrorKind::Backend, ErrorKind::Backend),
            (
                ZkError::QuotaExceeded,
                ErrorKind::Backend,
                ErrorKind::Backend,
            ),
        ];
        for (error, read, write) in cases {
            assert_eq!(
                map_error(error.clone(), READ).kind(),
                read,
                "{error} (read)"
            );
            assert_eq!(
                map_error(error.clone(), WRITE).kind(),
                write,
                "{error} (write)"
            );
        }
    }

    #[test]
    fn messages_name_the_node_and_what_to_do() {
        let denied = map_error(ZkError::NoAuth, WRITE).to_string();
        assert!(denied.contains("/leader-lease/jobs"), "{denied}");
        assert!(denied.contains("CREATE and DELETE"), "{denied}");
        let lost = map_error(ZkError::ConnectionLoss, WRITE).to_string();
        assert!(
            lost.contains("reading the lease node /leader-lease/jobs"),
            "{lost}"
        );
        let missing = parent_missing("/leases", None).to_string();
        assert!(missing.contains("/leases"), "{missing}");
        assert!(missing.contains("with_create_path"), "{missing}");
    }
}
