//! Every S3 failure becomes a [`leader_core::Error`] here, in one place.
//!
//! The SDK's error is first reduced to a [`Failure`] (what happened, as plain data), then
//! [`map_failure`] decides the semantic variant. The reduction is mechanical; the decision is
//! unit-tested case by case. The answers that are not failures of a call (412: the condition
//! did not hold; 404 `NoSuchKey`: no object; 304: unchanged) are told apart by
//! [`Failure::answer`] before any mapping.

use aws_credential_types::provider::error::CredentialsError;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use leader_core::{BoxError, Error};

/// What the failed call was doing; decides whether an unknown outcome may have changed data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// A `GetObject` of a lease record, a token mark or a protected object.
    Read,
    /// A conditional `PutObject` of a lease record.
    Write,
    /// A conditional `PutObject` of a token high-water mark.
    MarkWrite,
    /// A conditional `PutObject` of a protected object.
    ObjectWrite,
}

impl Op {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::Read => "reading an S3 object",
            Op::Write => "a conditional write of a lease record to S3",
            Op::MarkWrite => "raising a token high-water mark in S3",
            Op::ObjectWrite => "a conditional write of a protected object to S3",
        }
    }

    /// Whether the call may have changed data if its outcome is unknown.
    fn mutates(self) -> bool {
        !matches!(self, Op::Read)
    }
}

/// A failed SDK call, as plain data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The request could not be built; nothing was sent.
    NotSent(String),
    /// The SDK's timeout fired; the request may have been sent.
    TimedOut,
    /// The connection failed; the request may have been sent before it broke.
    Dispatch(String),
    /// The credential chain gave no credentials, so nothing was sent. `permanent`: no
    /// provider had any, or the configuration is invalid.
    NoCredentials {
        /// What the chain said, on one line.
        message: String,
        /// Whether retrying cannot help.
        permanent: bool,
    },
    /// A response arrived but could not be read.
    BadResponse(String),
    /// S3 answered with an error status.
    Service {
        /// The error code (`PreconditionFailed`, `NoSuchBucket`, `SlowDown`, ...); empty when
        /// the answer had no body (a `HEAD`, a 304).
        code: String,
        /// The service's message.
        message: String,
        /// The HTTP status.
        status: u16,
        /// The bucket's region, when S3 named it (`x-amz-bucket-region`).
        region: Option<String>,
    },
}

/// An answer of S3 that is not a failure of the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// 412: the write's condition did not hold; nothing was written.
    PreconditionFailed,
    /// 404 `NoSuchKey`: the object does not exist (a read, or an `If-Match` write).
    NoSuchKey,
    /// 304: the object's ETag is still the one given in `If-None-Match`.
    NotModified,
}

impl Failure {
    /// Reduces an SDK error to what the mapping needs.
    pub(crate) fn of<E>(err: &SdkError<E, HttpResponse>) -> Self
    where
        E: ProvideErrorMetadata,
    {
        match err {
            SdkError::ConstructionFailure(_) => Failure::NotSent(text(err)),
            SdkError::TimeoutError(_) => Failure::TimedOut,
            SdkError::DispatchFailure(_) => match credentials_error(err) {
                Some(c) => Failure::NoCredentials {
                    message: chain(c),
                    permanent: matches!(
                        c,
                        CredentialsError::CredentialsNotLoaded(_)
                            | CredentialsError::InvalidConfiguration(_)
                    ),
                },
                None => Failure::Dispatch(text(err)),
            },
            SdkError::ResponseError(r) => {
                // A 304 has no body; some SDK versions fail to parse it rather than call it a
                // service error. The status is what counts.
                let status = r.raw().status().as_u16();
                if status == 304 {
                    Failure::service("", "", status, None)
                } else {
                    Failure::BadResponse(text(err))
                }
            }
            SdkError::ServiceError(s) => Failure::Service {
                code: s.err().code().unwrap_or("").to_owned(),
                message: s.err().message().unwrap_or("").to_owned(),
                status: s.raw().status().as_u16(),
                region: s
                    .raw()
                    .headers()
                    .get("x-amz-bucket-region")
                    .map(str::to_owned),
            },
            _ => Failure::BadResponse(text(err)),
        }
    }

    pub(crate) fn service(code: &str, message: &str, status: u16, region: Option<&str>) -> Self {
        Failure::Service {
            code: code.to_owned(),
            message: message.to_owned(),
            status,
            region: region.map(str::to_owned),
        }
    }

    /// The answer this is, if it is one rather than a failure.
    pub(crate) fn answer(&self) -> Option<Answer> {
        let Failure::Service { code, status, .. } = self else {
            return None;
        };
        match (*status, code.as_str()) {
            (412, _) | (_, "PreconditionFailed") => Some(Answer::PreconditionFailed),
            (304, _) | (_, "NotModified") => Some(Answer::NotModified),
            // Only S3's own code: a bare 404 (a wrong endpoint, a proxy) is not an absent object,
            // or a misconfigured store would read "absent" forever.
            (404, "NoSuchKey") => Some(Answer::NoSuchKey),
            _ => None,
        }
    }
}

/// The credential provider's error behind a dispatch failure, if that is what failed.
fn credentials_error<E>(err: &SdkError<E, HttpResponse>) -> Option<&CredentialsError> {
    let SdkError::DispatchFailure(d) = err else {
        return None;
    };
    let mut cur: Option<&(dyn std::error::Error + 'static)> =
        d.as_connector_error().map(|c| c as _);
    while let Some(e) = cur {
        if let Some(c) = e.downcast_ref::<CredentialsError>() {
            return Some(c);
        }
        cur = e.source();
    }
    None
}

/// An error and its sources, on one line.
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = error.to_string();
    let mut cur = error.source();
    while let Some(e) = cur {
        out.push_str(": ");
        out.push_str(&e.to_string());
        cur = e.source();
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn text<E>(err: &SdkError<E, HttpResponse>) -> String {
    // SDK errors carry no request (so no signature or credentials) to print.
    match err {
        SdkError::ConstructionFailure(_) => "request could not be built".to_owned(),
        SdkError::TimeoutError(_) => "timed out".to_owned(),
        SdkError::DispatchFailure(d) => match d.as_connector_error() {
            Some(connector) => format!("connection failed: {}", chain(connector)),
            None => "connection failed".to_owned(),
        },
        SdkError::ResponseError(_) => "unreadable response".to_owned(),
        _ => "error".to_owned(),
    }
}

/// What the mapping needs to name things.
#[derive(Clone, Debug)]
pub(crate) struct Context {
    /// The bucket, as configured.
    pub(crate) bucket: String,
}

/// S3's codes for "too many requests". S3 does not promise that such a write was not applied:
/// it is retried, and a write that was throttled ends indeterminate if it then fails (see
/// `S3Store::put`).
const THROTTLING: [&str; 4] = [
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
];

const BAD_CREDENTIALS: [&str; 6] = [
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
    "AccountProblem",
];

/// The one mapping from an S3 failure to a semantic [`Error`].
///
/// For writes, anything that may have reached S3 without a definite answer is
/// [`Error::Indeterminate`]: the core re-reads instead of repeating the write.
pub(crate) fn map_failure(
    op: Op,
    ctx: &Context,
    failure: Failure,
    source: Option<BoxError>,
) -> Error {
    match failure {
        Failure::NotSent(message) => Error::InvalidConfig {
            message: format!("{} could not be sent: {message}", op.name()),
            source,
        },
        Failure::TimedOut => unknown(
            op,
            format!(
                "{} did not answer within {:?}",
                op.name(),
                leader_core::backend::call_budget()
            ),
            source,
        ),
        Failure::Dispatch(message) => {
            unknown(op, format!("{} failed: {message}", op.name()), source)
        }
        Failure::NoCredentials {
            message,
            permanent: true,
        } => Error::Unauthenticated {
            message: format!(
                "{} needs AWS credentials and the chain found none ({message}); set \
                 AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or run with an \
                 instance profile, ECS task role or web identity (IRSA)",
                op.name()
            ),
            source,
        },
        Failure::NoCredentials {
            message,
            permanent: false,
        } => Error::Unavailable {
            message: format!("{}: loading AWS credentials failed: {message}", op.name()),
            source,
        },
        Failure::BadResponse(message) => unknown(
            op,
            format!("{}: the response was unreadable: {message}", op.name()),
            source,
        ),
        Failure::Service {
            code,
            message,
            status,
            region,
        } => service_error(op, ctx, &code, &message, status, region, source),
    }
}

/// A failure of unknown outcome: indeterminate for a write (it may have been applied),
/// unavailable for a read.
fn unknown(op: Op, message: String, source: Option<BoxError>) -> Error {
    if op.mutates() {
        Error::Indeterminate { message, source }
    } else {
        Error::Unavailable { message, source }
    }
}

/// A failure S3 answered with an error `code` and HTTP `status`.
fn service_error(
    op: Op,
    ctx: &Context,
    code: &str,
    message: &str,
    status: u16,
    region: Option<String>,
    source: Option<BoxError>,
) -> Error {
    let said = if message.is_empty() {
        format!("HTTP {status} {code}")
    } else {
        format!("HTTP {status} {code}: {message}")
    };
    let bucket = &ctx.bucket;
    if THROTTLING.contains(&code) || status == 429 {
        Error::Throttled {
            message: format!("{}: {said}", op.name()),
            source,
        }
    } else if matches!(code, "ConditionalRequestConflict" | "OperationAborted") {
        // S3: a conflicting request on the same object raced this conditional one, and this
        // one was not applied. Retrying with the same condition is safe.
        Error::Unavailable {
            message: format!(
                "{}: a concurrent request on the object won the race and this one was not \
                 applied ({said})",
                op.name()
            ),
            source,
        }
    } else if code == "NoSuchBucket" {
        Error::NotFound {
            what: format!("S3 bucket {bucket:?}"),
            source,
        }
    } else if let Some(message) = misconfigured(bucket, code, status, region, &said) {
        Error::InvalidConfig { message, source }
    } else if BAD_CREDENTIALS.contains(&code) {
        Error::Unauthenticated {
            message: format!("{}: the AWS credentials were refused ({said})", op.name()),
            source,
        }
    } else if code == "AccessDenied" || code == "AllAccessDisabled" || status == 403 {
        Error::PermissionDenied {
            message: format!(
                "{} in bucket {bucket:?} was denied ({said}); the identity needs \
                 s3:GetObject and s3:PutObject on the lease prefix, and s3:ListBucket on the \
                 bucket (without it S3 answers 403 instead of 404 for an absent object)",
                op.name()
            ),
            source,
        }
    } else if code == "TemporaryRedirect" || status == 307 {
        // A bucket created moments ago, whose DNS has not spread yet: it passes.
        Error::Unavailable {
            message: format!("{}: {said}", op.name()),
            source,
        }
    } else if status >= 500 {
        unknown(
            op,
            format!("{} failed on the server: {said}", op.name()),
            source,
        )
    } else {
        Error::Backend {
            message: format!("{} in bucket {bucket:?} failed: {said}", op.name()),
            source,
        }
    }
}

/// What to tell the user when an answer means the configuration is wrong (the bucket's
/// region, an endpoint without conditional writes, this machine's clock); `None` otherwise.
fn misconfigured(
    bucket: &str,
    code: &str,
    status: u16,
    region: Option<String>,
    said: &str,
) -> Option<String> {
    if matches!(
        code,
        "PermanentRedirect" | "AuthorizationHeaderMalformed" | "IllegalLocationConstraintException"
    ) || status == 301
    {
        let region =
            region.map_or_else(|| "another region".to_owned(), |r| format!("region {r:?}"));
        Some(format!(
            "S3 bucket {bucket:?} is in {region}, not the client's; set AWS_REGION (or the \
             profile's region) to the bucket's ({said})"
        ))
    } else if code == "NotImplemented" || status == 501 {
        Some(format!(
            "the S3 endpoint does not implement a request leader-s3 needs (conditional \
             writes: If-Match / If-None-Match: * on PutObject); use Amazon S3 or a compatible \
             store that supports them ({said})"
        ))
    } else if code == "RequestTimeTooSkewed" {
        Some(format!(
            "S3 refused the request because this machine's clock is more than 15 minutes off \
             (request signatures carry the time); synchronise the clock (NTP) ({said})"
        ))
    } else {
        None
    }
}

/// Maps an SDK error that is not an [`Answer`] (see [`map_failure`]).
pub(crate) fn map_sdk<E>(op: Op, ctx: &Context, err: SdkError<E, HttpResponse>) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    // The TLS client of `from_env` is ours (rustls); a client brought with `with_client` may
    // use another TLS stack, whose errors this does not know.
    #[cfg(feature = "from-env")]
    {
        let what = format!("{} (bucket {:?})", op.name(), ctx.bucket);
        if let Some(untrusted) = leader_core::tls::untrusted_certificate(&err, &what) {
            return untrusted;
        }
    }
    let failure = Failure::of(&err);
    map_failure(op, ctx, failure, Some(Box::new(err)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use super::*;
    use leader_core::ErrorKind;

    fn ctx() -> Context {
        Context {
            bucket: "leases".to_owned(),
        }
    }

    fn kind(op: Op, code: &str, status: u16) -> ErrorKind {
        map_failure(op, &ctx(), Failure::service(code, "m", status, None), None).kind()
    }

    #[test]
    fn answers_are_told_apart_from_failures() {
        let answer = |code: &str, status| Failure::service(code, "", status, None).answer();
        assert_eq!(
            answer("PreconditionFailed", 412),
            Some(Answer::PreconditionFailed)
        );
        assert_eq!(answer("", 412), Some(Answer::PreconditionFailed));
        assert_eq!(answer("NoSuchKey", 404), Some(Answer::NoSuchKey));
        assert_eq!(answer("", 304), Some(Answer::NotModified));
        // A missing bucket is not an absent object, nor is a bare 404 (a wrong endpoint).
        assert_eq!(answer("NoSuchBucket", 404), None);
        assert_eq!(answer("", 404), None);
        assert_eq!(answer("ConditionalRequestConflict", 409), None);
        assert_eq!(Failure::TimedOut.answer(), None);
    }

    #[test]
    fn throttling_and_races_were_not_applied_and_are_retried() {
        for (code, status) in [("SlowDown", 503), ("", 429), ("RequestLimitExceeded", 400)] {
            for op in [Op::Read, Op::Write, Op::MarkWrite, Op::ObjectWrite] {
                let e = map_failure(op, &ctx(), Failure::service(code, "", status, None), None);
                assert_eq!(e.kind(), ErrorKind::Throttled, "{code} {status}");
                assert!(leader_core::backend::may_retry(&e), "{code}");
            }
        }
        // 409: the write lost a race with a concurrent request and was not applied.
        for op in [Op::Write, Op::MarkWrite, Op::ObjectWrite] {
            let e = map_failure(
                op,
                &ctx(),
                Failure::service("ConditionalRequestConflict", "", 409, None),
                None,
            );
            assert_eq!(e.kind(), ErrorKind::Unavailable, "{op:?}");
            assert!(leader_core::backend::may_retry(&e));
        }
    }

    #[test]
    fn server_errors_and_lost_answers_are_indeterminate_for_writes_only() {
        for op in [Op::Write, Op::MarkWrite, Op::ObjectWrite] {
            assert_eq!(kind(op, "InternalError", 500), ErrorKind::Indeterminate);
            assert_eq!(
                kind(op, "ServiceUnavailable", 503),
                ErrorKind::Indeterminate
            );
            let e = map_failure(op, &ctx(), Failure::TimedOut, None);
            assert_eq!(e.kind(), ErrorKind::Indeterminate);
            let e = map_failure(op, &ctx(), Failure::Dispatch("reset".to_owned()), None);
            assert_eq!(e.kind(), ErrorKind::Indeterminate);
        }
        assert_eq!(kind(Op::Read, "InternalError", 500), ErrorKind::Unavailable);
        let e = map_failure(Op::Read, &ctx(), Failure::TimedOut, None);
        assert_eq!(e.kind(), ErrorKind::Unavailable);
    }

    #[test]
    fn permanent_failures_say_what_to_do() {
        let text = |code: &str, status, region: Option<&str>| {
            let e = map_failure(
                Op::Read,
                &ctx(),
                Failure::service(code, "x", status, region),
                None,
            );
            assert!(!e.is_retryable(), "{code}: {e}");
            (e.kind(), e.to_string())
        };
        let (k, t) = text("NoSuchBucket", 404, None);
        assert_eq!(k, ErrorKind::NotFound);
        assert!(t.contains("\"leases\""), "{t}");
        let (k, t) = text("PermanentRedirect", 301, Some("eu-west-1"));
        assert_eq!(k, ErrorKind::InvalidConfig);
        assert!(t.contains("eu-west-1") && t.contains("AWS_REGION"), "{t}");
        let (k, t) = text("AuthorizationHeaderMalformed", 400, None);
        assert_eq!(k, ErrorKind::InvalidConfig);
        assert!(t.contains("region"), "{t}");
        let (k, t) = text("NotImplemented", 501, None);
        assert_eq!(k, ErrorKind::InvalidConfig);
        assert!(t.contains("If-Match"), "{t}");
        let (k, t) = text("RequestTimeTooSkewed", 403, None);
        assert_eq!(k, ErrorKind::InvalidConfig);
        assert!(t.contains("clock"), "{t}");
        // A 409 other than a lost race is not retried.
        assert_eq!(kind(Op::Write, "BucketNotEmpty", 409), ErrorKind::Backend);
        let (k, t) = text("AccessDenied", 403, None);
        assert_eq!(k, ErrorKind::PermissionDenied);
        assert!(t.contains("s3:ListBucket"), "{t}");
        for code in BAD_CREDENTIALS {
            assert_eq!(
                text(code, 403, None).0,
                ErrorKind::Unauthenticated,
                "{code}"
            );
        }
        assert_eq!(kind(Op::Read, "InvalidArgument", 400), ErrorKind::Backend);
        let e = map_failure(
            Op::Write,
            &ctx(),
            Failure::NotSent("no region".to_owned()),
            None,
        );
        assert_eq!(e.kind(), ErrorKind::InvalidConfig);
    }

    #[test]
    fn a_credential_chain_without_credentials_is_permanent_and_one_line() {
        use aws_sdk_s3::operation::get_object::GetObjectError;
        use aws_smithy_runtime_api::client::result::ConnectorError;
        let dispatch = |c: CredentialsError| -> SdkError<GetObjectError, HttpResponse> {
            SdkError::dispatch_failure(ConnectorError::other(Box::new(c), None))
        };
        let none = Failure::of(&dispatch(CredentialsError::not_loaded(
            "no providers in chain provided credentials:\n  Environment: not set",
        )));
        let e = map_failure(Op::Write, &ctx(), none, None);
        assert_eq!(e.kind(), ErrorKind::Unauthenticated, "{e}");
        assert!(!e.to_string().contains('\n') && e.to_string().contains("AWS_PROFILE"));
        let flaky = Failure::of(&dispatch(CredentialsError::provider_timed_out(
            std::time::Duration::from_secs(1),
        )));
        // Nothing was sent: even a write is not indeterminate.
        assert_eq!(
            map_failure(Op::Write, &ctx(), flaky, None).kind(),
            ErrorKind::Unavailable
        );
    }

    #[test]
    fn sdk_errors_reduce_to_failures() {
        use aws_sdk_s3::error::ErrorMetadata;
        use aws_sdk_s3::operation::put_object::PutObjectError;
        use aws_smithy_types::body::SdkBody;

        let mut raw = HttpResponse::new(301.try_into().unwrap(), SdkBody::empty());
        raw.headers_mut()
            .insert("x-amz-bucket-region", "ap-south-1");
        let err: SdkError<PutObjectError, HttpResponse> = SdkError::service_error(
            PutObjectError::generic(
                ErrorMetadata::builder()
                    .code("PermanentRedirect")
                    .message("elsewhere")
                    .build(),
            ),
            raw,
        );
        assert_eq!(
            Failure::of(&err),
            Failure::service("PermanentRedirect", "elsewhere", 301, Some("ap-south-1"))
        );
        let e = map_sdk(Op::Write, &ctx(), err);
        assert!(e.to_string().contains("ap-south-1"), "{e}");
    }
}
