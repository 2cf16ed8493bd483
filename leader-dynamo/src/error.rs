//! Every DynamoDB failure becomes a [`leader_core::Error`] here, in one place.
//!
//! The SDK's error is first reduced to a [`Failure`] (what happened, as plain data), then
//! [`map_failure`] decides the semantic variant. The reduction is mechanical; the decision is
//! unit-tested case by case.

use aws_credential_types::provider::error::CredentialsError;
use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use leader_core::{BoxError, Error};

/// What the failed call was doing; decides whether an unknown outcome may have changed data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// A consistent read of a lease or protected object.
    Read,
    /// A conditional write of a lease record.
    Write,
    /// A `TransactWriteItems` of a fenced write.
    FencedWrite,
    /// A conditional `UpdateItem` of a protected object, without the lease check.
    ObjectWrite,
    /// `DescribeTable` / `CreateTable`.
    Table,
}

impl Op {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::Read => "reading from DynamoDB",
            Op::Write => "a conditional write to DynamoDB",
            Op::FencedWrite => "a fenced transaction on DynamoDB",
            Op::ObjectWrite => "a conditional write of a protected object to DynamoDB",
            Op::Table => "checking the DynamoDB table",
        }
    }

    /// Whether the call may have changed data if its outcome is unknown.
    pub(crate) fn mutates(self) -> bool {
        matches!(self, Op::Write | Op::FencedWrite | Op::ObjectWrite)
    }
}

/// A failed SDK call, as plain data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The request could not be built; nothing was sent.
    NotSent(String),
    /// The SDK's operation timeout fired; the request may have been sent.
    TimedOut,
    /// The connection failed (`timeout`: the connector's own timeout). The request may have
    /// been sent before the connection broke.
    Dispatch {
        /// What the connector said.
        message: String,
        /// A connector timeout.
        timeout: bool,
    },
    /// The credential chain gave no credentials, so nothing was sent. `permanent`: no
    /// provider had any, or the configuration is invalid (retrying cannot help); otherwise a
    /// provider failed (an instance metadata service that did not answer) and may recover.
    NoCredentials {
        /// What the chain said, on one line.
        message: String,
        /// Whether retrying can help.
        permanent: bool,
    },
    /// A response arrived but could not be read.
    BadResponse(String),
    /// DynamoDB answered with an error.
    Service {
        /// The error code (`ConditionalCheckFailedException`, `ThrottlingException`, ...).
        code: String,
        /// The service's message.
        message: String,
        /// The HTTP status.
        status: u16,
    },
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
            SdkError::DispatchFailure(d) => match credentials_error(err) {
                Some(c) => Failure::NoCredentials {
                    message: chain(c),
                    permanent: matches!(
                        c,
                        CredentialsError::CredentialsNotLoaded(_)
                            | CredentialsError::InvalidConfiguration(_)
                    ),
                },
                None => Failure::Dispatch {
                    message: text(err),
                    timeout: d.is_timeout(),
                },
            },
            SdkError::ResponseError(_) => Failure::BadResponse(text(err)),
            SdkError::ServiceError(s) => Failure::Service {
                code: s.err().code().unwrap_or("unknown").to_owned(),
                message: s.err().message().unwrap_or("").to_owned(),
                status: s.raw().status().as_u16(),
            },
            _ => Failure::BadResponse(text(err)),
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
    let mut out = one_line(&error.to_string());
    let mut cur = error.source();
    while let Some(e) = cur {
        out.push_str(": ");
        out.push_str(&one_line(&e.to_string()));
        cur = e.source();
    }
    out
}

/// The SDK's multi-line texts (the credential chain lists every provider it tried) as one
/// log line.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn text<E>(err: &SdkError<E, HttpResponse>) -> String {
    // What failed, with the connector's error chain; SDK errors carry no request (so no
    // signature or credentials) to print.
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

/// What the mapping needs to name things and report timeouts.
#[derive(Clone, Debug)]
pub(crate) struct Context {
    /// The table, as configured.
    pub(crate) table: String,
}

const THROTTLING: [&str; 4] = [
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "RequestLimitExceeded",
    "LimitExceededException",
];

const BAD_CREDENTIALS: [&str; 6] = [
    "UnrecognizedClientException",
    "InvalidSignatureException",
    "ExpiredTokenException",
    "MissingAuthenticationTokenException",
    "IncompleteSignatureException",
    "InvalidClientTokenId",
];

/// The one mapping from a DynamoDB failure to a semantic [`Error`].
///
/// For writes, anything that may have reached DynamoDB without a definite answer is
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
        Failure::TimedOut if op.mutates() => Error::Indeterminate {
            message: format!(
                "{} did not answer within {:?}",
                op.name(),
                leader_core::backend::call_budget()
            ),
            source,
        },
        Failure::TimedOut => Error::Timeout {
            operation: op.name(),
            after: leader_core::backend::call_budget(),
        },
        Failure::Dispatch { message, timeout } => {
            let what = if timeout { "timed out" } else { "failed" };
            unknown(op, format!("{} {what}: {message}", op.name()), source)
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
        } => service_error(op, ctx, &code, &message, status, source),
    }
}

/// What a failure of unknown outcome is: indeterminate for a write (it may have been
/// applied), unavailable for a read.
fn unknown(op: Op, message: String, source: Option<BoxError>) -> Error {
    if op.mutates() {
        Error::Indeterminate { message, source }
    } else {
        Error::Unavailable { message, source }
    }
}

/// A failure DynamoDB answered with an error `code` (and HTTP `status`).
fn service_error(
    op: Op,
    ctx: &Context,
    code: &str,
    message: &str,
    status: u16,
    source: Option<BoxError>,
) -> Error {
    let said = format!("{code}: {message}");
    if THROTTLING.contains(&code) {
        Error::Throttled {
            message: said,
            source,
        }
    } else if code == "ResourceNotFoundException" {
        Error::NotFound {
            what: format!("DynamoDB table {:?}", ctx.table),
            source,
        }
    } else if code == "AccessDeniedException" {
        Error::PermissionDenied {
            message: said,
            source,
        }
    } else if BAD_CREDENTIALS.contains(&code) {
        Error::Unauthenticated {
            message: said,
            source,
        }
    } else if code == "ValidationException"
        && (message.contains("key element does not match the schema")
            || message.contains("Missing the key"))
    {
        Error::InvalidConfig {
            message: format!(
                "the key schema of DynamoDB table {:?} does not match the configured \
                 partition key ({said})",
                ctx.table
            ),
            source,
        }
    } else if code == "TransactionConflictException" || code == "TransactionInProgressException" {
        // Rejected before it was applied: a concurrent transaction held the item.
        Error::Unavailable {
            message: said,
            source,
        }
    } else if status >= 500 || code == "InternalServerError" {
        unknown(
            op,
            format!("{} failed on the server: {said}", op.name()),
            source,
        )
    } else {
        Error::Backend {
            message: format!("{} failed: {said}", op.name()),
            source,
        }
    }
}

/// Maps an SDK error (see [`map_failure`]).
pub(crate) fn map_sdk<E>(op: Op, ctx: &Context, err: SdkError<E, HttpResponse>) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    // The TLS client of `from_env` is ours (rustls); a client brought with `with_client` may
    // use another TLS stack, whose errors this does not know.
    #[cfg(feature = "from-env")]
    {
        let what = format!("{} (table {:?})", op.name(), ctx.table);
        if let Some(untrusted) = leader_core::tls::untrusted_certificate(&err, &what) {
            return untrusted;
        }
    }
    let failure = Failure::of(&err);
    map_failure(op, ctx, failure, Some(Box::new(err)))
}

/// One item's reason in a cancelled transaction, as plain data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Reason {
    /// `None`, `ConditionalCheckFailed`, `TransactionConflict`, `ThrottlingError`, ...
    pub(crate) code: String,
    /// The service's message.
    pub(crate) message: String,
}

/// Joins the reasons of a cancelled transaction for a message.
fn summary(reasons: &[Reason]) -> String {
    reasons
        .iter()
        .enumerate()
        .map(|(i, r)| format!("item {i}: {} {}", r.code, r.message))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The error of a transaction that DynamoDB cancelled for a reason other than a failed
/// condition (`what` names the transaction). Nothing of it was applied.
fn cancelled_otherwise(what: &str, ctx: &Context, reasons: &[Reason]) -> Error {
    let summary = summary(reasons);
    let has = |code: &str| reasons.iter().any(|r| r.code == code);
    if has("ThrottlingError") || has("ProvisionedThroughputExceeded") {
        Error::Throttled {
            message: format!("{what} throttled ({summary})"),
            source: None,
        }
    } else if has("TransactionConflict") {
        Error::Unavailable {
            message: format!("{what} conflicted with another one ({summary})"),
            source: None,
        }
    } else {
        Error::Backend {
            message: format!("{what} on table {:?} was cancelled ({summary})", ctx.table),
            source: None,
        }
    }
}

const CONDITION_FAILED: &str = "ConditionalCheckFailed";

/// Which item of a cancelled transaction failed its condition (the first, in the order of the
/// transaction's items), or, if none did, the error of a transaction cancelled for another
/// reason (`what` names the transaction: throttling, a concurrent transaction, ...). Nothing
/// of a cancelled transaction was applied.
pub(crate) fn failed_condition(
    what: &str,
    ctx: &Context,
    reasons: &[Reason],
) -> Result<usize, Error> {
    reasons
        .iter()
        .position(|r| r.code == CONDITION_FAILED)
        .ok_or_else(|| cancelled_otherwise(what, ctx, reasons))
}

/// Errors of this crate that are not the SDK's, kept as the `source` of a core [`Error`].
#[derive(Debug, thiserror::Error)]
pub(crate) enum DynamoError {
    /// The table exists but its key schema is not the one this crate needs.
    #[error(
        "table {table:?} has key schema {found}; it needs a single string partition key named {expected:?}"
    )]
    KeySchema {
        table: String,
        found: String,
        expected: String,
    },
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use super::*;
    use leader_core::ErrorKind;

    fn ctx() -> Context {
        Context {
            table: "leases".to_owned(),
        }
    }

    fn service(code: &str, message: &str, status: u16) -> Failure {
        Failure::Service {
            code: code.to_owned(),
            message: message.to_owned(),
            status,
        }
    }

    fn kind(op: Op, f: Failure) -> ErrorKind {
        map_failure(op, &ctx(), f, None).kind()
    }

    #[test]
    fn throttling_codes_are_throttled_and_retryable() {
        for code in THROTTLING {
            for op in [Op::Read, Op::Write, Op::FencedWrite, Op::ObjectWrite] {
                let e = map_failure(op, &ctx(), service(code, "slow down", 400), None);
                assert_eq!(e.kind(), ErrorKind::Throttled, "{code}");
                assert!(e.is_retryable());
            }
        }
    }

    #[test]
    fn a_credential_chain_without_credentials_is_permanent_and_one_line() {
        use aws_sdk_dynamodb::operation::get_item::GetItemError;
        use aws_smithy_runtime_api::client::result::ConnectorError;
        let dispatch = |c: CredentialsError| -> SdkError<GetItemError, HttpResponse> {
            SdkError::dispatch_failure(ConnectorError::other(Box::new(c), None))
        };
        let none = dispatch(CredentialsError::not_loaded(
            "no providers in chain provided credentials:\n  Environment: not set\n  Profile: none",
        ));
        let failure = Failure::of(&none);
        assert!(
            matches!(
                failure,
                Failure::NoCredentials {
                    permanent: true,
                    ..
                }
            ),
            "{failure:?}"
        );
        for op in [Op::Read, Op::Write, Op::Table] {
            let e = map_failure(op, &ctx(), failure.clone(), None);
            assert_eq!(e.kind(), ErrorKind::Unauthenticated, "{op:?}: {e}");
            assert!(!e.is_retryable());
            let text = e.to_string();
            assert!(
                !text.contains('\n') && text.contains("AWS_PROFILE"),
                "{text}"
            );
        }
        let flaky = Failure::of(&dispatch(CredentialsError::provider_timed_out(
            std::time::Duration::from_secs(1),
        )));
        assert!(matches!(
            flaky,
            Failure::NoCredentials {
                permanent: false,
                ..
            }
        ));
        // Nothing was sent: even a write is not indeterminate.
        assert_eq!(kind(Op::Write, flaky), ErrorKind::Unavailable);
    }

    #[test]
    fn missing_table_names_the_table() {
        let e = map_failure(
            Op::Read,
            &ctx(),
            service(
                "ResourceNotFoundException",
                "Requested resource not found",
                400,
            ),
            None,
        );
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert!(e.to_string().contains("\"leases\""), "{e}");
        assert!(!e.is_retryable());
    }

    #[test]
    fn credentials_and_permissions() {
        assert_eq!(
            kind(Op::Write, service("AccessDeniedException", "no", 400)),
            ErrorKind::PermissionDenied
        );
        for code in BAD_CREDENTIALS {
            assert_eq!(
                kind(Op::Read, service(code, "bad", 400)),
                ErrorKind::Unauthenticated,
                "{code}"
            );
        }
    }

    #[test]
    fn wrong_key_schema_is_a_config_error() {
        let e = map_failure(
            Op::Read,
            &ctx(),
            service(
                "ValidationException",
                "The provided key element does not match the schema",
                400,
            ),
            None,
        );
        assert_eq!(e.kind(), ErrorKind::InvalidConfig);
        assert!(e.to_string().contains("key schema"), "{e}");
        // Other validation errors are plain backend errors.
        assert_eq!(
            kind(Op::Read, service("ValidationException", "something", 400)),
            ErrorKind::Backend
        );
    }

    #[test]
    fn timeouts_are_indeterminate_for_writes_only() {
        assert_eq!(kind(Op::Write, Failure::TimedOut), ErrorKind::Indeterminate);
        for op in [Op::FencedWrite, Op::ObjectWrite] {
            assert_eq!(
                kind(op, Failure::TimedOut),
                ErrorKind::Indeterminate,
                "{op:?}"
            );
        }
        assert_eq!(kind(Op::Read, Failure::TimedOut), ErrorKind::Timeout);
        let dispatch = || Failure::Dispatch {
            message: "reset".to_owned(),
            timeout: false,
        };
        assert_eq!(kind(Op::Write, dispatch()), ErrorKind::Indeterminate);
        assert_eq!(kind(Op::Read, dispatch()), ErrorKind::Unavailable);
        assert_eq!(
            kind(Op::Write, Failure::BadResponse("eof".to_owned())),
            ErrorKind::Indeterminate
        );
        assert_eq!(
            kind(Op::Read, Failure::BadResponse("eof".to_owned())),
            ErrorKind::Unavailable
        );
    }

    #[test]
    fn server_errors_are_indeterminate_for_writes() {
        let f = || service("InternalServerError", "oops", 500);
        assert_eq!(kind(Op::Write, f()), ErrorKind::Indeterminate);
        assert_eq!(kind(Op::Read, f()), ErrorKind::Unavailable);
        assert_eq!(
            kind(Op::Write, service("ServiceUnavailable", "", 503)),
            ErrorKind::Indeterminate
        );
    }

    #[test]
    fn not_sent_is_config_and_conflicts_are_unavailable() {
        assert_eq!(
            kind(Op::Write, Failure::NotSent("no region".to_owned())),
            ErrorKind::InvalidConfig
        );
        assert_eq!(
            kind(
                Op::FencedWrite,
                service("TransactionConflictException", "busy", 400)
            ),
            ErrorKind::Unavailable
        );
        assert_eq!(
            kind(Op::Write, service("SomethingNew", "?", 400)),
            ErrorKind::Backend
        );
    }

    #[test]
    fn sdk_errors_reduce_to_failures() {
        use aws_sdk_dynamodb::error::ErrorMetadata;
        use aws_sdk_dynamodb::operation::get_item::GetItemError;
        use aws_smithy_types::body::SdkBody;

        let raw = HttpResponse::new(400.try_into().unwrap(), SdkBody::empty());
        let err: SdkError<GetItemError, HttpResponse> = SdkError::service_error(
            GetItemError::generic(
                ErrorMetadata::builder()
                    .code("ThrottlingException")
                    .message("Rate exceeded")
                    .build(),
            ),
            raw,
        );
        assert_eq!(
            Failure::of(&err),
            service("ThrottlingException", "Rate exceeded", 400)
        );
        assert_eq!(map_sdk(Op::Read, &ctx(), err).kind(), ErrorKind::Throttled);

        let err: SdkError<GetItemError, HttpResponse> = SdkError::timeout_error("slow");
        assert_eq!(Failure::of(&err), Failure::TimedOut);
        assert_eq!(
            map_sdk(Op::Write, &ctx(), err).kind(),
            ErrorKind::Indeterminate
        );
    }

    #[test]
    fn cancelled_transactions_name_the_first_failed_condition() {
        let decide = |codes: &[&str]| {
            let reasons: Vec<Reason> = codes
                .iter()
                .map(|c| Reason {
                    code: (*c).to_owned(),
                    message: String::new(),
                })
                .collect();
            failed_condition("acquiring transaction", &ctx(), &reasons)
        };
        // The first item's failed condition wins, whatever happened to the second.
        for second in ["None", "ConditionalCheckFailed", "TransactionConflict"] {
            assert_eq!(
                decide(&["ConditionalCheckFailed", second]).ok(),
                Some(0),
                "{second}"
            );
        }
        assert_eq!(decide(&["None", "ConditionalCheckFailed"]).ok(), Some(1));
        let kind = |codes: &[&str]| decide(codes).err().map(|e| e.kind());
        assert_eq!(
            kind(&["None", "ThrottlingError"]),
            Some(ErrorKind::Throttled)
        );
        assert_eq!(
            kind(&["TransactionConflict", "None"]),
            Some(ErrorKind::Unavailable)
        );
        let e = decide(&["ValidationError", "None"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Backend);
        assert!(e.to_string().contains("acquiring transaction"), "{e}");
    }
}
