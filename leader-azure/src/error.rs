//! What an Azure Storage failure means for the lease protocol, decided in one place.
//!
//! [`classify`] reads the HTTP status and the `x-ms-error-code` of a failed request (or the
//! transport failure) and names what happened; [`to_error`] turns that into the semantic
//! [`leader_core::Error`]. Azurite answers 409 in some places where Azure answers 412 (and the
//! other way round), so the lease codes are recognised by their code whatever the status.

use azure_core::error::ErrorKind as AzureKind;
use leader_core::Error;

/// Errors of this crate's own making (configuration, signing).
#[derive(Debug, thiserror::Error)]
pub(crate) enum AzureError {
    /// A setting is missing or malformed.
    #[error("{0}")]
    Config(String),
    /// The account key is not base64.
    #[error("the account key is not valid base64 ({0}); copy it again from the portal")]
    BadKey(base64::DecodeError),
}

impl From<AzureError> for Error {
    fn from(e: AzureError) -> Self {
        Error::InvalidConfig {
            message: e.to_string(),
            source: Some(Box::new(e)),
        }
    }
}

/// What a failed Blob request means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    /// 409 `LeaseAlreadyPresent` (or a lease that is breaking): another holder's lease is live.
    HeldByOther,
    /// The caller's lease is gone: expired and taken, broken, or never held (409
    /// `LeaseIdMismatchWithLeaseOperation`, `LeaseIsBrokenAndCannotBeRenewed`, 412 `LeaseLost`,
    /// `LeaseIdMissing`, `LeaseIdMismatchWithBlobOperation`, `LeaseNotPresentWithBlobOperation`).
    Lost,
    /// 412 `ConditionNotMet`, or 409 `BlobAlreadyExists` for a create-only write.
    ConditionFailed,
    /// 404 `BlobNotFound`.
    BlobMissing,
    /// 404 `ContainerNotFound`.
    ContainerMissing,
    /// 400: a bad lease duration, lease id or header; the configuration is wrong.
    BadRequest,
    /// 401, 403 `AuthenticationFailed`, or no token could be had.
    Unauthenticated,
    /// 403 with an authorization code: valid identity, no permission.
    PermissionDenied,
    /// 503 `ServerBusy` or 429.
    Throttled,
    /// Any other 5xx: the service failed, perhaps after applying the request.
    ServerError,
    /// The connection could not be made: the request was never sent.
    NotSent,
    /// Sent, but no (complete) answer came back: a timeout or a lost connection.
    NoAnswer,
    /// Another 4xx: the service refused the request, so it was not applied.
    Refused,
    /// Anything else (an answer the SDK could not read, an unexpected status).
    Other,
}

impl Class {
    /// Whether a write that failed this way is a conflict: nothing of ours was applied and
    /// someone else's state is (or was) in the way.
    pub(crate) fn is_conflict(self) -> bool {
        matches!(
            self,
            Class::HeldByOther | Class::Lost | Class::ConditionFailed | Class::BlobMissing
        )
    }
}

const HELD_BY_OTHER: &[&str] = &[
    "LeaseAlreadyPresent",
    "LeaseIsBreakingAndCannotBeAcquired",
    "LeaseIsBreakingAndCannotBeChanged",
    "LeaseAlreadyBroken",
];

const LOST: &[&str] = &[
    "LeaseIdMismatchWithLeaseOperation",
    "LeaseIsBrokenAndCannotBeRenewed",
    "LeaseLost",
    "LeaseIdMissing",
    "LeaseIdMismatchWithBlobOperation",
    "LeaseNotPresentWithBlobOperation",
    "LeaseNotPresentWithLeaseOperation",
];

// Not `AuthorizationFailure`: Azurite answers a wrong Shared Key signature with it (Azure says
// `AuthenticationFailed`), and on Azure it also means a SAS or network rule that refuses.
const PERMISSION: &[&str] = &[
    "AuthorizationPermissionMismatch",
    "AuthorizationSourceIPMismatch",
    "AuthorizationProtocolMismatch",
    "AuthorizationResourceTypeMismatch",
    "AuthorizationServiceMismatch",
    "InsufficientAccountPermissions",
];

/// Names what a failed request means, from its status and error code or its transport failure.
pub(crate) fn classify(err: &azure_core::Error) -> Class {
    match err.kind() {
        AzureKind::HttpResponse {
            status, error_code, ..
        } => classify_status(u16::from(*status), error_code.as_deref()),
        AzureKind::Connection => Class::NotSent,
        AzureKind::Io => Class::NoAnswer,
        AzureKind::Credential => Class::Unauthenticated,
        AzureKind::DataConversion | AzureKind::Other => Class::Other,
        #[allow(unreachable_patterns)] // the SDK may add kinds
        _ => Class::Other,
    }
}

/// The status-and-code half of [`classify`].
pub(crate) fn classify_status(status: u16, code: Option<&str>) -> Class {
    let code = code.unwrap_or("");
    if HELD_BY_OTHER.contains(&code) {
        return Class::HeldByOther;
    }
    if LOST.contains(&code) {
        return Class::Lost;
    }
    match (status, code) {
        (412, _) | (409, "BlobAlreadyExists") | (304, _) => Class::ConditionFailed,
        (404, "ContainerNotFound") => Class::ContainerMissing,
        (404, _) => Class::BlobMissing,
        (400, _) => Class::BadRequest,
        (401, _) => Class::Unauthenticated,
        (403, c) if PERMISSION.contains(&c) => Class::PermissionDenied,
        (403, _) => Class::Unauthenticated,
        (429, _) | (503, _) => Class::Throttled,
        (500..=599, _) => Class::ServerError,
        (400..=499, _) => Class::Refused,
        _ => Class::Other,
    }
}

/// Whether a failed request changed nothing (`Settled`) or may have been applied (`Unknown`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Effect {
    /// A read, or a write the service answered with a refusal.
    Settled,
    /// A write that may have been applied.
    Unknown,
}

/// The semantic error for a failure of `what` (e.g. "renewing the lease on blob c/leases/k"),
/// in container `container`. A write whose outcome is unknown (no answer, or a 5xx after
/// sending) is [`Error::Indeterminate`]; `effect` says whether the request was a write.
pub(crate) fn to_error(
    err: azure_core::Error,
    what: &str,
    container: &str,
    effect: Effect,
) -> Error {
    if let Some(untrusted) = leader_core::tls::untrusted_certificate(&err, what) {
        return untrusted;
    }
    let class = classify(&err);
    let message = format!("{what}: {}", summary(&err));
    let source: Option<leader_core::BoxError> = Some(Box::new(err));
    // A write is settled only by a refusal the service stated or a request never sent; a
    // 5xx (503 throttling included: a gateway may answer it after the write), no answer, or
    // an answer the SDK could not read may hide an applied write.
    if effect == Effect::Unknown
        && matches!(
            class,
            Class::NoAnswer | Class::ServerError | Class::Throttled | Class::Other
        )
    {
        return Error::Indeterminate { message, source };
    }
    match class {
        Class::ContainerMissing => Error::NotFound {
            what: format!("the Azure blob container {container:?}"),
            source,
        },
        Class::Unauthenticated => Error::Unauthenticated { message, source },
        Class::PermissionDenied => Error::PermissionDenied { message, source },
        Class::Throttled => Error::Throttled { message, source },
        Class::NotSent | Class::NoAnswer | Class::ServerError => {
            Error::Unavailable { message, source }
        }
        Class::BadRequest => Error::InvalidConfig {
            message: format!(
                "{message}; the service rejected the request (a lease duration outside 15-60 s or a malformed lease id?)"
            ),
            source,
        },
        Class::HeldByOther
        | Class::Lost
        | Class::ConditionFailed
        | Class::BlobMissing
        | Class::Refused
        | Class::Other => Error::Backend { message, source },
    }
}

/// A short description without the response body (which may echo request details).
fn summary(err: &azure_core::Error) -> String {
    match err.kind() {
        AzureKind::HttpResponse {
            status, error_code, ..
        } => format!(
            "HTTP {} {}",
            u16::from(*status),
            error_code.as_deref().unwrap_or("(no error code)")
        ),
        // The SDK's texts may span lines (the credential's troubleshooting link): one line.
        other => format!("{other}: {err}")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use azure_core::http::StatusCode;
    use leader_core::ErrorKind;

    fn http(status: u16, code: Option<&str>) -> azure_core::Error {
        azure_core::Error::with_message(
            AzureKind::HttpResponse {
                status: StatusCode::from(status),
                error_code: code.map(str::to_owned),
                raw_response: None,
            },
            "test",
        )
    }

    #[test]
    fn lease_held_by_another() {
        assert_eq!(
            classify(&http(409, Some("LeaseAlreadyPresent"))),
            Class::HeldByOther
        );
        assert!(Class::HeldByOther.is_conflict());
    }

    #[test]
    fn lost_lease_codes_under_409_and_412() {
        for code in [
            "LeaseIdMismatchWithLeaseOperation",
            "LeaseIsBrokenAndCannotBeRenewed",
            "LeaseLost",
            "LeaseIdMissing",
            "LeaseIdMismatchWithBlobOperation",
            "LeaseNotPresentWithBlobOperation",
        ] {
            // Azure and Azurite disagree on 409 vs 412 for some of these: both are "lost".
            for status in [409, 412] {
                assert_eq!(
                    classify(&http(status, Some(code))),
                    Class::Lost,
                    "{status} {code}"
                );
            }
        }
    }

    #[test]
    fn condition_not_met_is_a_conflict() {
        assert_eq!(
            classify(&http(412, Some("ConditionNotMet"))),
            Class::ConditionFailed
        );
        assert_eq!(
            classify(&http(409, Some("BlobAlreadyExists"))),
            Class::ConditionFailed
        );
        assert!(Class::ConditionFailed.is_conflict());
    }

    #[test]
    fn bad_request_is_configuration() {
        let e = to_error(
            http(400, Some("InvalidHeaderValue")),
            "acquiring",
            "c",
            Effect::Settled,
        );
        assert_eq!(e.kind(), ErrorKind::InvalidConfig);
        assert!(e.to_string().contains("15-60 s"), "{e}");
    }

    #[test]
    fn forbidden_is_authentication_unless_authorization() {
        let e = to_error(
            http(403, Some("AuthenticationFailed")),
            "reading",
            "c",
            Effect::Settled,
        );
        assert_eq!(e.kind(), ErrorKind::Unauthenticated);
        let e = to_error(
            http(403, Some("AuthorizationPermissionMismatch")),
            "reading",
            "c",
            Effect::Settled,
        );
        assert_eq!(e.kind(), ErrorKind::PermissionDenied);
        // Azurite's answer to a wrong key.
        let e = to_error(
            http(403, Some("AuthorizationFailure")),
            "reading",
            "c",
            Effect::Settled,
        );
        assert_eq!(e.kind(), ErrorKind::Unauthenticated);
        let e = to_error(
            azure_core::Error::with_message(AzureKind::Credential, "no token"),
            "reading",
            "c",
            Effect::Settled,
        );
        assert_eq!(e.kind(), ErrorKind::Unauthenticated);
    }

    #[test]
    fn missing_container_names_it() {
        let e = to_error(
            http(404, Some("ContainerNotFound")),
            "reading",
            "leases",
            Effect::Settled,
        );
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert!(e.to_string().contains("\"leases\""), "{e}");
        assert_eq!(
            classify(&http(404, Some("BlobNotFound"))),
            Class::BlobMissing
        );
    }

    #[test]
    fn throttling_and_server_errors() {
        let e = to_error(
            http(503, Some("ServerBusy")),
            "reading",
            "c",
            Effect::Settled,
        );
        assert_eq!(e.kind(), ErrorKind::Throttled);
        let e = to_error(
            http(500, Some("InternalError")),
            "reading",
            "c",
            Effect::Settled,
        );
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        let e = to_error(
            http(500, Some("InternalError")),
            "writing",
            "c",
            Effect::Unknown,
        );
        assert_eq!(e.kind(), ErrorKind::Indeterminate);
        let e = to_error(
            http(503, Some("ServerBusy")),
            "writing",
            "c",
            Effect::Unknown,
        );
        assert_eq!(e.kind(), ErrorKind::Indeterminate);
        // A response the SDK could not read, after a write: it may have been applied.
        let unread = azure_core::Error::with_message(AzureKind::DataConversion, "bad header");
        assert_eq!(
            to_error(unread, "writing", "c", Effect::Unknown).kind(),
            ErrorKind::Indeterminate
        );
        // A refusal the service stated is settled, even for a write.
        let e = to_error(
            http(409, Some("SomethingNew")),
            "writing",
            "c",
            Effect::Unknown,
        );
        assert_eq!(e.kind(), ErrorKind::Backend);
    }

    #[test]
    fn sdk_messages_become_one_line() {
        let e = azure_core::Error::with_message(
            AzureKind::Credential,
            "ManagedIdentityCredential authentication failed.\nTo troubleshoot, visit https://x",
        );
        let text = to_error(e, "checking the container", "c", Effect::Settled).to_string();
        assert!(!text.contains('\n'), "{text}");
        assert!(text.contains("failed. To troubleshoot"), "{text}");
    }

    #[test]
    fn transport_failures_split_on_whether_the_request_was_sent() {
        let never_sent = azure_core::Error::with_message(AzureKind::Connection, "refused");
        assert_eq!(
            to_error(never_sent, "writing", "c", Effect::Unknown).kind(),
            ErrorKind::Unavailable
        );
        let lost = azure_core::Error::with_message(AzureKind::Io, "reset");
        assert_eq!(
            to_error(lost, "writing", "c", Effect::Unknown).kind(),
            ErrorKind::Indeterminate
        );
        let lost = azure_core::Error::with_message(AzureKind::Io, "reset");
        assert_eq!(
            to_error(lost, "reading", "c", Effect::Settled).kind(),
            ErrorKind::Unavailable
        );
    }
}
