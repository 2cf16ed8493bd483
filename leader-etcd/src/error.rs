//! The one place where etcd's gRPC errors become [`leader_core::Error`]s.

use leader_core::Error;
use tonic::{Code, Status};

/// Whether the failed request could have changed the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Effect {
    /// A read, or a write that the server is known not to have applied.
    None,
    /// A write: unless the error says it was refused before it was applied, its outcome is
    /// unknown.
    MayHaveApplied,
}

/// Whether the request was refused before anything was sent or proposed: the connection was
/// never made, or etcd had no leader to propose it to.
fn never_applied(status: &Status) -> bool {
    let m = status.message();
    m.contains("no leader")
        || m.contains("error trying to connect")
        || m.contains("tcp connect error")
        || m.contains("Connection refused")
        || m.contains("connection refused")
}

/// Whether etcd refused the auth token before applying anything, in a way that a fresh token
/// cures: the token expired (simple tokens expire after 5 min of disuse), or an operator
/// changed users or roles since it was issued ("revision of auth store is old"). The client
/// authenticates again and the call is retried.
pub(crate) fn is_stale_token(status: &Status) -> bool {
    let m = status.message();
    match status.code() {
        Code::Unauthenticated => m.contains("invalid auth token"),
        Code::InvalidArgument => m.contains("auth store is old"),
        _ => false,
    }
}

/// Whether etcd said that a lease does not exist (expired, revoked, or never granted).
pub(crate) fn is_lease_not_found(status: &Status) -> bool {
    status.code() == Code::NotFound && status.message().contains("lease not found")
}

/// Whether etcd said that a lease with the proposed id exists already.
pub(crate) fn is_lease_exists(status: &Status) -> bool {
    status.code() == Code::FailedPrecondition && status.message().contains("lease already exists")
}

/// Maps a failed request (`what`: "reading the lease key") to the suite's error.
pub(crate) fn to_error(status: Status, what: &str, effect: Effect) -> Error {
    let message = format!(
        "{what}: etcd said {}: {}",
        code_name(status.code()),
        status.message()
    );
    let unknown_outcome = effect == Effect::MayHaveApplied && !never_applied(&status);
    match status.code() {
        _ if is_stale_token(&status) => Error::Unavailable {
            message: format!("{message} (authenticating again)"),
            source: Some(Box::new(status)),
        },
        Code::Unauthenticated => Error::Unauthenticated {
            message: format!("{message}; check the user name and password"),
            source: Some(Box::new(status)),
        },
        Code::InvalidArgument if status.message().contains("user name is empty") => {
            Error::Unauthenticated {
                message: format!(
                    "{message}: the cluster has auth enabled; give a user (with_user, or \
                     LEADER_ETCD_USER and LEADER_ETCD_PASSWORD)"
                ),
                source: Some(Box::new(status)),
            }
        }
        Code::InvalidArgument if status.message().contains("authentication failed") => {
            Error::Unauthenticated {
                message: format!("{message}; check the user name and password"),
                source: Some(Box::new(status)),
            }
        }
        Code::PermissionDenied => Error::PermissionDenied {
            message: format!(
                "{message}; the user needs a role with readwrite permission on the key prefix"
            ),
            source: Some(Box::new(status)),
        },
        Code::ResourceExhausted => Error::Throttled {
            message,
            source: Some(Box::new(status)),
        },
        Code::InvalidArgument | Code::OutOfRange | Code::Unimplemented => Error::InvalidConfig {
            message,
            source: Some(Box::new(status)),
        },
        _ if unknown_outcome => Error::Indeterminate {
            message,
            source: Some(Box::new(status)),
        },
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::Cancelled
        | Code::Unknown
        | Code::Aborted => Error::Unavailable {
            message,
            source: Some(Box::new(status)),
        },
        _ => Error::Backend {
            message,
            source: Some(Box::new(status)),
        },
    }
}

fn code_name(code: Code) -> &'static str {
    match code {
        Code::Unavailable => "unavailable",
        Code::DeadlineExceeded => "deadline exceeded",
        Code::Unauthenticated => "unauthenticated",
        Code::PermissionDenied => "permission denied",
        Code::ResourceExhausted => "resource exhausted",
        Code::InvalidArgument => "invalid argument",
        Code::NotFound => "not found",
        Code::FailedPrecondition => "failed precondition",
        _ => "error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leader_core::ErrorKind;

    #[test]
    fn writes_are_indeterminate_unless_refused_before_applying() {
        let lost = Status::unavailable("transport error: connection reset");
        assert_eq!(
            to_error(lost.clone(), "w", Effect::MayHaveApplied).kind(),
            ErrorKind::Indeterminate
        );
        assert_eq!(
            to_error(lost, "r", Effect::None).kind(),
            ErrorKind::Unavailable
        );
        let timeout = Status::deadline_exceeded("etcdserver: request timed out");
        assert_eq!(
            to_error(timeout, "w", Effect::MayHaveApplied).kind(),
            ErrorKind::Indeterminate
        );
        for refused in [
            Status::unavailable("etcdserver: no leader"),
            Status::unavailable("error trying to connect: tcp connect error: Connection refused"),
        ] {
            assert_eq!(
                to_error(refused, "w", Effect::MayHaveApplied).kind(),
                ErrorKind::Unavailable
            );
        }
        let busy = Status::resource_exhausted("etcdserver: too many requests");
        assert_eq!(
            to_error(busy, "w", Effect::MayHaveApplied).kind(),
            ErrorKind::Throttled
        );
    }

    #[test]
    fn credentials_and_permissions_say_what_to_do() {
        let denied = to_error(
            Status::permission_denied("etcdserver: permission denied"),
            "writing",
            Effect::MayHaveApplied,
        );
        assert_eq!(denied.kind(), ErrorKind::PermissionDenied);
        assert!(denied.to_string().contains("readwrite"), "{denied}");
        let bad = to_error(
            Status::invalid_argument(
                "etcdserver: authentication failed, invalid user ID or password",
            ),
            "authenticating",
            Effect::None,
        );
        assert_eq!(bad.kind(), ErrorKind::Unauthenticated);
        for stale in [
            Status::unauthenticated("etcdserver: invalid auth token"),
            Status::invalid_argument("etcdserver: revision of auth store is old"),
        ] {
            assert!(is_stale_token(&stale));
            // Refused before anything was applied: a write may be retried with a new token.
            assert_eq!(
                to_error(stale, "w", Effect::MayHaveApplied).kind(),
                ErrorKind::Unavailable
            );
        }
    }
}
