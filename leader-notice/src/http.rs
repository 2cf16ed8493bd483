//! The HTTP plumbing shared by the notice sources and the protectors: clients with the suite's
//! TLS provider and bounded timeouts, and one mapping of answers to [`NoticeError`].

use std::time::Duration;

use reqwest::StatusCode;
use serde::de::DeserializeOwned;

use crate::NoticeError;

/// How long a metadata service may take to accept a connection: it is on the link-local
/// network or nowhere.
pub(crate) const METADATA_CONNECT: Duration = Duration::from_secs(1);

/// How long a cloud API (Auto Scaling, ARM, Kubernetes) may take to accept a connection.
const API_CONNECT: Duration = Duration::from_secs(5);

/// How long a cloud API call may take in all.
pub(crate) const API_TIMEOUT: Duration = Duration::from_secs(30);

/// How much of an unexpected answer goes into an error message.
const PREFIX_CHARS: usize = 120;

/// A client for a metadata service: plain HTTP on the link-local network, never through a
/// proxy (a proxy would answer for the wrong machine, or not at all), each request bounded by
/// `timeout` (a request may set its own, longer one).
///
/// # Errors
/// [`NoticeError::Config`] if the client cannot be built (the TLS roots cannot be read).
pub(crate) fn metadata_client(timeout: Duration) -> Result<reqwest::Client, NoticeError> {
    leader_core::tls::install_crypto_provider();
    reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(METADATA_CONNECT)
        .timeout(timeout)
        .build()
        .map_err(|e| NoticeError::Config(format!("cannot build an HTTP client: {}", chain(&e))))
}

/// A client for a cloud API over HTTPS (proxies from the environment are honoured), with the
/// machine's roots (`SSL_CERT_FILE` replaces them) and, if given, one more root certificate in
/// PEM (a Kubernetes service account's `ca.crt`).
///
/// # Errors
/// [`NoticeError::Config`] if `extra_root_pem` holds no certificate or the client cannot be
/// built.
pub(crate) fn api_client(extra_root_pem: Option<&[u8]>) -> Result<reqwest::Client, NoticeError> {
    leader_core::tls::install_crypto_provider();
    let mut builder = reqwest::Client::builder()
        .connect_timeout(API_CONNECT)
        .timeout(API_TIMEOUT);
    if let Some(pem) = extra_root_pem {
        let certs = reqwest::Certificate::from_pem_bundle(pem).map_err(|e| {
            NoticeError::Config(format!("the CA certificate does not parse as PEM: {e}"))
        })?;
        if certs.is_empty() {
            return Err(NoticeError::Config(
                "the CA certificate file holds no PEM certificate".to_owned(),
            ));
        }
        builder = builder.tls_certs_merge(certs);
    }
    builder
        .build()
        .map_err(|e| NoticeError::Config(format!("cannot build an HTTPS client: {}", chain(&e))))
}

/// An answer, whatever its status, read in full.
#[derive(Debug)]
pub(crate) struct Reply {
    /// The HTTP status.
    pub(crate) status: StatusCode,
    /// The `ETag` header, if any (GCE's hanging GETs).
    pub(crate) etag: Option<String>,
    /// The `Metadata-Flavor` header, if any (GCE's detection).
    pub(crate) flavor: Option<String>,
    /// The body, as text (lossy).
    pub(crate) body: String,
}

impl Reply {
    /// This reply if its status is 2xx, else the error its status means; `needs` says what
    /// a 401 or 403 lacks (e.g. "the managed identity needs the role ... on the scale set").
    ///
    /// # Errors
    /// The error of [`status_error`].
    pub(crate) fn success(
        self,
        service: &'static str,
        what: &str,
        needs: &str,
    ) -> Result<Self, NoticeError> {
        if self.status.is_success() {
            Ok(self)
        } else {
            Err(status_error(service, what, self.status, &self.body, needs))
        }
    }
}

/// Sends `request` and reads the whole answer. Only a failure to get an answer is an error
/// here; the status is the caller's to judge ([`Reply::success`]).
///
/// # Errors
/// [`NoticeError::Unavailable`] if there was no answer (refused, timed out, reset);
/// [`NoticeError::Config`] if the server's TLS certificate is not trusted.
///
/// # Cancel safety
/// Cancel-safe (the request is abandoned).
pub(crate) async fn send(
    service: &'static str,
    what: &str,
    request: reqwest::RequestBuilder,
) -> Result<Reply, NoticeError> {
    let response = request
        .send()
        .await
        .map_err(|e| transport_error(service, what, &e))?;
    let status = response.status();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let etag = header("etag");
    let flavor = header("metadata-flavor");
    let body = response
        .text()
        .await
        .map_err(|e| transport_error(service, what, &e))?;
    Ok(Reply {
        status,
        etag,
        flavor,
        body,
    })
}

/// The error a failed request means: an untrusted certificate is a configuration error (no
/// retry helps), anything else (refused, timed out, reset) is unavailability.
pub(crate) fn transport_error(
    service: &'static str,
    what: &str,
    e: &reqwest::Error,
) -> NoticeError {
    if let Some(untrusted) = leader_core::tls::untrusted_certificate(e, what) {
        // Its message, without the "invalid store configuration" of a store's error.
        return NoticeError::Config(match untrusted {
            leader_core::Error::InvalidConfig { message, .. } => message,
            other => other.to_string(),
        });
    }
    let why = if e.is_timeout() {
        "no answer in time"
    } else if e.is_connect() {
        "cannot connect"
    } else {
        "the request failed"
    };
    NoticeError::Unavailable {
        service,
        message: format!("{what}: {why} ({})", chain(e)),
    }
}

/// The error an unsuccessful status means, for `what` (e.g. "GET scheduled events").
///
/// - 5xx, 429 (throttled), 408 and 409 (a conflicting operation in progress):
///   [`NoticeError::Unavailable`], worth a retry;
/// - 401, 403: [`NoticeError::Denied`], with `needs` (what permission or setting is missing);
/// - 404: [`NoticeError::Config`] (this machine, group or pod is not what the caller thinks);
/// - any other: [`NoticeError::Malformed`] (the request or the API is not what we expect).
///
/// Each message carries a short prefix of the body; never pass a body that may hold a secret.
pub(crate) fn status_error(
    service: &'static str,
    what: &str,
    status: StatusCode,
    body: &str,
    needs: &str,
) -> NoticeError {
    let body = prefix(body);
    let code = status.as_u16();
    if status.is_server_error() || matches!(code, 408 | 409 | 429) {
        NoticeError::Unavailable {
            service,
            message: format!("{what}: answered {status}, will retry: {body}"),
        }
    } else if matches!(code, 401 | 403) {
        NoticeError::Denied {
            service,
            message: format!("{what}: refused ({status}): {needs}; the answer: {body}"),
        }
    } else if code == 404 {
        NoticeError::Config(format!("{service}: {what}: not found (404): {body}"))
    } else {
        NoticeError::Malformed {
            service,
            message: format!("{what}: answered {status}: {body}"),
        }
    }
}

/// `body` as JSON of type `T`.
///
/// # Errors
/// [`NoticeError::Malformed`] with a prefix of the body.
pub(crate) fn parse_json<T: DeserializeOwned>(
    service: &'static str,
    what: &str,
    body: &str,
) -> Result<T, NoticeError> {
    serde_json::from_str(body).map_err(|e| malformed(service, what, &e.to_string(), body))
}

/// [`NoticeError::Malformed`]: `what` answered something that is not what we expect (`why`),
/// with a prefix of the body.
pub(crate) fn malformed(service: &'static str, what: &str, why: &str, body: &str) -> NoticeError {
    NoticeError::Malformed {
        service,
        message: format!("{what}: {why}; the answer began with {:?}", prefix(body)),
    }
}

/// The first characters of `body` (whitespace trimmed), for an error message.
pub(crate) fn prefix(body: &str) -> String {
    let body = body.trim();
    match body.char_indices().nth(PREFIX_CHARS) {
        Some((at, _)) => format!("{}...", &body[..at]),
        None => body.to_owned(),
    }
}

/// An error and its sources, joined with `: ` (each source once, as reqwest nests them).
pub(crate) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn statuses_map_to_what_the_caller_should_do() {
        let err = |code: u16| {
            status_error(
                "azure",
                "GET x",
                StatusCode::from_u16(code).unwrap(),
                "why",
                "grant it",
            )
        };
        for code in [500, 502, 503, 429, 408, 409] {
            assert!(
                matches!(
                    err(code),
                    NoticeError::Unavailable {
                        service: "azure",
                        ..
                    }
                ),
                "{code}"
            );
            assert!(err(code).is_retryable());
        }
        for code in [401, 403] {
            let e = err(code);
            assert!(matches!(e, NoticeError::Denied { .. }), "{code}");
            assert!(e.to_string().contains("grant it"), "{e}");
            assert!(!e.is_retryable());
        }
        assert!(matches!(err(404), NoticeError::Config(_)));
        assert!(matches!(err(400), NoticeError::Malformed { .. }));
        assert!(err(400).to_string().contains("why"));
    }

    #[test]
    fn a_prefix_is_short_and_cut_on_a_character() {
        assert_eq!(prefix("  short\n"), "short");
        let long = "é".repeat(500);
        let p = prefix(&long);
        assert_eq!(p.chars().count(), PREFIX_CHARS + 3);
        assert!(p.ends_with("..."));
    }

    #[test]
    fn garbage_is_malformed_with_the_start_of_the_body() {
        let e = parse_json::<serde_json::Value>("gcp", "GET y", "<html>not json").unwrap_err();
        assert!(matches!(e, NoticeError::Malformed { service: "gcp", .. }));
        assert!(e.to_string().contains("<html>not json"), "{e}");
    }

    #[test]
    fn a_bad_extra_root_is_a_configuration_error() {
        assert!(matches!(
            api_client(Some(b"not a certificate")),
            Err(NoticeError::Config(_))
        ));
        assert!(api_client(None).is_ok());
        assert!(metadata_client(Duration::from_secs(1)).is_ok());
    }
}
