//! The one place where the SDK's errors become [`leader_core::Error`]s.
//!
//! A failed request is first classified ([`Class::of`]); `client.rs` tells a precondition
//! failure (a conflict) and a missing object from the rest, and [`map_error`] makes the core
//! error, whose kind decides whether the core's call loop may try again.

use google_cloud_storage::Error as SdkError;
use leader_core::Error;

/// What a failed request means for the lease protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    /// HTTP 412: the generation precondition did not hold; nothing was written.
    PreconditionFailed,
    /// HTTP 404: the object (on a read) or the bucket does not exist.
    NotFound,
    /// HTTP 429: rate-limited before anything was applied; retry with backoff.
    Throttled,
    /// Failed before the request left (connect error, transient credential failure); retry.
    NotSent,
    /// The request may have reached the service (5xx, 408, a broken connection, an SDK
    /// timeout): retry a read; a write's outcome becomes unknown.
    MaybeApplied,
    /// HTTP 401, or credentials that cannot produce a token.
    Unauthenticated,
    /// HTTP 403.
    PermissionDenied,
    /// Anything else (400, a response the SDK cannot parse): retrying will not help.
    Rejected,
}

impl Class {
    /// Classifies one failed request.
    pub(crate) fn of(error: &SdkError) -> Class {
        if let Some(status) = error.http_status_code() {
            return match status {
                412 => Class::PreconditionFailed,
                404 => Class::NotFound,
                429 => Class::Throttled,
                401 => Class::Unauthenticated,
                403 => Class::PermissionDenied,
                408 | 500..=599 => Class::MaybeApplied,
                _ => Class::Rejected,
            };
        }
        if error.is_transient_and_before_rpc() {
            Class::NotSent
        } else if error.is_authentication() {
            Class::Unauthenticated
        } else if error.is_timeout() || error.is_io() || error.is_transport() {
            Class::MaybeApplied
        } else {
            Class::Rejected
        }
    }
}

/// Whether a 404 says that the bucket, not the object, is missing.
///
/// GCS answers `The specified bucket does not exist.`; fake-gcs-server answers a bare
/// `Not Found` for both, so there a missing bucket shows up on the first write instead.
pub(crate) fn bucket_missing(error: &SdkError) -> bool {
    error.http_payload().is_some_and(|body| {
        String::from_utf8_lossy(body)
            .to_ascii_lowercase()
            .contains("bucket does not exist")
    })
}

/// A request: what it did, and to which object.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Request<'a> {
    /// `true` for a write (an ambiguous failure is then indeterminate).
    pub(crate) write: bool,
    /// The bucket.
    pub(crate) bucket: &'a str,
    /// The object.
    pub(crate) object: &'a str,
}

impl Request<'_> {
    fn describe(&self) -> String {
        let verb = if self.write { "writing" } else { "reading" };
        format!("{verb} gs://{}/{}", self.bucket, self.object)
    }
}

/// Maps a failed request to the core's error. This is the only such mapping of the crate.
pub(crate) fn map_error(error: SdkError, request: Request<'_>) -> Error {
    if let Some(untrusted) = leader_core::tls::untrusted_certificate(&error, &request.describe()) {
        return untrusted;
    }
    let class = Class::of(&error);
    let message = format!("{}: {error}", request.describe());
    let source = Some(Box::new(error) as leader_core::BoxError);
    match class {
        Class::NotFound => Error::NotFound {
            what: format!("GCS bucket {:?}", request.bucket),
            source,
        },
        Class::Unauthenticated => Error::Unauthenticated { message, source },
        Class::PermissionDenied => Error::PermissionDenied { message, source },
        Class::Throttled => Error::Throttled { message, source },
        Class::NotSent => Error::Unavailable { message, source },
        Class::MaybeApplied if request.write => Error::Indeterminate { message, source },
        Class::MaybeApplied => Error::Unavailable { message, source },
        Class::PreconditionFailed | Class::Rejected => Error::Backend { message, source },
    }
}

/// A write may have landed and a later attempt failed in another way: the outcome is unknown.
pub(crate) fn after_ambiguous(error: Error, request: Request<'_>) -> Error {
    if error.kind() == leader_core::ErrorKind::Indeterminate {
        return error;
    }
    Error::Indeterminate {
        message: format!(
            "{}: an earlier attempt may have landed, then: {error}",
            request.describe()
        ),
        source: Some(Box::new(error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use google_cloud_gax::error::CredentialsError;
    use leader_core::ErrorKind;

    fn http(status: u16, body: &str) -> SdkError {
        SdkError::http(
            status,
            http::HeaderMap::new(),
            bytes::Bytes::from(body.to_owned()),
        )
    }

    const WRITE: Request<'static> = Request {
        write: true,
        bucket: "leases",
        object: "leader-lease/jobs",
    };
    const READ: Request<'static> = Request {
        write: false,
        ..WRITE
    };

    #[test]
    fn statuses_are_classified() {
        let cases = [
            (412, Class::PreconditionFailed),
            (404, Class::NotFound),
            (429, Class::Throttled),
            (401, Class::Unauthenticated),
            (403, Class::PermissionDenied),
            (408, Class::MaybeApplied),
            (500, Class::MaybeApplied),
            (503, Class::MaybeApplied),
            (400, Class::Rejected),
        ];
        for (status, class) in cases {
            assert_eq!(Class::of(&http(status, "")), class, "{status}");
        }
    }

    #[test]
    fn transport_failures_are_classified() {
        let refused = SdkError::connect(std::io::Error::other("refused"));
        assert_eq!(Class::of(&refused), Class::NotSent);
        let broken = SdkError::io(std::io::Error::other("connection reset"));
        assert_eq!(Class::of(&broken), Class::MaybeApplied);
        let slow = SdkError::timeout(std::io::Error::other("slow"));
        assert_eq!(Class::of(&slow), Class::MaybeApplied);
        let flaky = SdkError::authentication(CredentialsError::from_msg(true, "mds hiccup"));
        assert_eq!(Class::of(&flaky), Class::NotSent);
        let none = SdkError::authentication(CredentialsError::from_msg(false, "no creds"));
        assert_eq!(Class::of(&none), Class::Unauthenticated);
    }

    #[test]
    fn each_class_maps_to_its_core_error() {
        let cases = [
            (404, READ, ErrorKind::NotFound),
            (404, WRITE, ErrorKind::NotFound),
            (401, READ, ErrorKind::Unauthenticated),
            (403, WRITE, ErrorKind::PermissionDenied),
            (429, WRITE, ErrorKind::Throttled),
            (503, READ, ErrorKind::Unavailable),
            (503, WRITE, ErrorKind::Indeterminate),
            (400, WRITE, ErrorKind::Backend),
        ];
        for (status, request, kind) in cases {
            let error = map_error(http(status, "oops"), request);
            assert_eq!(error.kind(), kind, "{status} write={}", request.write);
        }
        let refused = map_error(SdkError::connect(std::io::Error::other("refused")), WRITE);
        assert_eq!(refused.kind(), ErrorKind::Unavailable);
    }

    #[test]
    fn messages_name_the_object_and_the_bucket() {
        let error = map_error(http(403, "denied"), WRITE);
        let text = error.to_string();
        assert!(text.contains("gs://leases/leader-lease/jobs"), "{text}");
        let missing = map_error(http(404, ""), READ).to_string();
        assert!(missing.contains("\"leases\""), "{missing}");
    }

    #[test]
    fn missing_bucket_is_told_from_missing_object() {
        let bucket = http(
            404,
            r#"{"error":{"code":404,"message":"The specified bucket does not exist."}}"#,
        );
        assert!(bucket_missing(&bucket));
        let object = http(
            404,
            r#"{"error":{"code":404,"message":"No such object: b/o"}}"#,
        );
        assert!(!bucket_missing(&object));
        assert!(!bucket_missing(&http(404, "Not Found")));
    }

    #[test]
    fn a_failure_after_a_landed_write_is_indeterminate() {
        let later = after_ambiguous(Error::unavailable("down"), WRITE);
        assert_eq!(later.kind(), ErrorKind::Indeterminate);
        assert!(later.to_string().contains("may have landed"), "{later}");
    }
}
