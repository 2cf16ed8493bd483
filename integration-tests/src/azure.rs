//! A minimal Azure Blob client for the emulator tests: the few operations the canaries need
//! (create container, Put Blob with conditions, Get Blob), signed with leader-azure's Shared
//! Key signer (its `test-util` feature).
//!
//! Azurite checks Shared Key signatures like the real service, so every request is signed.

use std::time::{Duration, UNIX_EPOCH};

use leader_azure::SharedKeySigner;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, Request, StatusCode};

/// Azurite's development account name.
pub const DEV_ACCOUNT: &str = "devstoreaccount1";
/// Azurite's well-known development account key (public, not a secret).
pub const DEV_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
/// The REST API version sent in `x-ms-version`.
pub const API_VERSION: &str = "2025-01-05";

/// Errors of the Blob helpers.
#[derive(Debug)]
pub enum AzureError {
    /// The account key is not valid base64 (or is empty).
    BadKey(leader_core::Error),
    /// A header value could not be built.
    BadHeader(String),
    /// The HTTP request failed (connection refused, timeout, ...).
    Http(reqwest::Error),
    /// The service answered with an unexpected status.
    Status {
        /// What was attempted.
        operation: String,
        /// The status.
        status: StatusCode,
        /// The response body (Azure's XML error).
        body: String,
    },
}

impl std::fmt::Display for AzureError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AzureError::BadKey(e) => write!(f, "bad account key: {e}"),
            AzureError::BadHeader(h) => write!(f, "invalid header value: {h}"),
            AzureError::Http(e) => write!(f, "HTTP request failed: {e}"),
            AzureError::Status {
                operation,
                status,
                body,
            } => write!(f, "{operation}: unexpected {status}: {body}"),
        }
    }
}

impl std::error::Error for AzureError {}

impl From<reqwest::Error> for AzureError {
    fn from(e: reqwest::Error) -> Self {
        AzureError::Http(e)
    }
}

/// Signs a reqwest request with leader-azure's Shared Key signer: adds `x-ms-date`,
/// `x-ms-version` (unless present) and `Authorization`.
fn sign(signer: &SharedKeySigner, request: &mut Request) -> Result<(), AzureError> {
    let now = UNIX_EPOCH + Duration::from_millis(leader_core::wall_clock_unix_ms());
    insert(
        request.headers_mut(),
        "x-ms-date",
        &httpdate::fmt_http_date(now),
    )?;
    if !request.headers().contains_key("x-ms-version") {
        insert(request.headers_mut(), "x-ms-version", API_VERSION)?;
    }
    let authorization = signer.authorization(&string_to_sign(signer, request));
    insert(request.headers_mut(), "authorization", &authorization)
}

/// The string to sign of a reqwest request: reqwest adds Content-Length when sending, so the
/// body's length is signed.
fn string_to_sign(signer: &SharedKeySigner, request: &Request) -> String {
    let body_len = request
        .body()
        .and_then(|b| b.as_bytes())
        .map_or(0, <[u8]>::len);
    let headers = request
        .headers()
        .iter()
        .filter_map(|(name, value)| Some((name.as_str(), value.to_str().ok()?)));
    signer.string_to_sign(request.method().as_str(), request.url(), headers, body_len)
}

fn insert(headers: &mut HeaderMap, name: &'static str, value: &str) -> Result<(), AzureError> {
    let value =
        HeaderValue::from_str(value).map_err(|_| AzureError::BadHeader(value.to_owned()))?;
    headers.insert(HeaderName::from_static(name), value);
    Ok(())
}

/// A precondition on Put Blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    /// Unconditional.
    None,
    /// Create only: `If-None-Match: *`.
    Absent,
    /// Overwrite only this version: `If-Match: <etag>`.
    Matches(String),
}

/// The outcome of a conditional write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutOutcome {
    /// Written; the blob's new ETag.
    Written(String),
    /// The precondition failed (409 BlobAlreadyExists for a create, 412 for If-Match).
    ConditionFailed(StatusCode),
}

/// A tiny Blob client on one account endpoint (e.g. `http://127.0.0.1:P/devstoreaccount1`).
#[derive(Debug, Clone)]
pub struct BlobClient {
    http: reqwest::Client,
    base: String,
    signer: SharedKeySigner,
}

impl BlobClient {
    /// A client for the Azurite development account at `endpoint_url`.
    pub fn dev(endpoint_url: &str) -> Result<Self, AzureError> {
        Self::new(endpoint_url, DEV_ACCOUNT, DEV_KEY)
    }

    /// A client for `account` at `endpoint_url` (the URL includes the account path).
    pub fn new(endpoint_url: &str, account: &str, base64_key: &str) -> Result<Self, AzureError> {
        Ok(BlobClient {
            http: reqwest::Client::new(),
            base: endpoint_url.trim_end_matches('/').to_owned(),
            signer: SharedKeySigner::new(account, base64_key).map_err(AzureError::BadKey)?,
        })
    }

    async fn send(&self, mut request: Request) -> Result<reqwest::Response, AzureError> {
        sign(&self.signer, &mut request)?;
        Ok(self.http.execute(request).await?)
    }

    /// Creates a container (`PUT ?restype=container`).
    pub async fn create_container(&self, container: &str) -> Result<(), AzureError> {
        let request = self
            .http
            .put(format!("{}/{container}?restype=container", self.base))
            .build()?;
        let response = self.send(request).await?;
        expect(response, "create container", StatusCode::CREATED).await
    }

    /// Put Blob (block blob) with a precondition.
    pub async fn put_blob(
        &self,
        container: &str,
        blob: &str,
        body: Vec<u8>,
        condition: &Condition,
    ) -> Result<PutOutcome, AzureError> {
        let mut builder = self
            .http
            .request(Method::PUT, format!("{}/{container}/{blob}", self.base))
            .header("x-ms-blob-type", "BlockBlob")
            .header("content-type", "application/octet-stream")
            .body(body);
        builder = match condition {
            Condition::None => builder,
            Condition::Absent => builder.header("if-none-match", "*"),
            Condition::Matches(etag) => builder.header("if-match", etag.as_str()),
        };
        let response = self.send(builder.build()?).await?;
        match response.status() {
            StatusCode::CREATED => Ok(PutOutcome::Written(etag_of(&response))),
            status @ (StatusCode::CONFLICT | StatusCode::PRECONDITION_FAILED) => {
                Ok(PutOutcome::ConditionFailed(status))
            }
            status => Err(AzureError::Status {
                operation: format!("put blob {container}/{blob}"),
                status,
                body: response.text().await.unwrap_or_default(),
            }),
        }
    }

    /// Get Blob: its content and ETag.
    pub async fn get_blob(
        &self,
        container: &str,
        blob: &str,
    ) -> Result<(Vec<u8>, String), AzureError> {
        let request = self
            .http
            .get(format!("{}/{container}/{blob}", self.base))
            .build()?;
        let response = self.send(request).await?;
        if response.status() != StatusCode::OK {
            return Err(AzureError::Status {
                operation: format!("get blob {container}/{blob}"),
                status: response.status(),
                body: response.text().await.unwrap_or_default(),
            });
        }
        let etag = etag_of(&response);
        Ok((response.bytes().await?.to_vec(), etag))
    }
}

fn etag_of(response: &reqwest::Response) -> String {
    response
        .headers()
        .get("etag")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

async fn expect(
    response: reqwest::Response,
    operation: &str,
    want: StatusCode,
) -> Result<(), AzureError> {
    if response.status() == want {
        return Ok(());
    }
    Err(AzureError::Status {
        operation: operation.to_owned(),
        status: response.status(),
        body: response.text().await.unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_to_sign_layout() {
        let signer = SharedKeySigner::new(DEV_ACCOUNT, DEV_KEY).unwrap();
        let client = reqwest::Client::new();
        let request = client
            .put("http://127.0.0.1:1/devstoreaccount1/c/b?comp=lease&Timeout=5")
            .header("x-ms-version", "2025-01-05")
            .header("x-ms-date", "Sun, 29 Nov 2026 09:00:00 GMT")
            .header("x-ms-lease-action", "  acquire ")
            .header("if-match", "\"0x1\"")
            .header("content-type", "text/plain")
            .body("abc")
            .build()
            .unwrap();
        let got = string_to_sign(&signer, &request);
        let want = "PUT\n\n\n3\n\ntext/plain\n\n\n\"0x1\"\n\n\n\n\
                    x-ms-date:Sun, 29 Nov 2026 09:00:00 GMT\nx-ms-lease-action:acquire\n\
                    x-ms-version:2025-01-05\n\
                    /devstoreaccount1/devstoreaccount1/c/b\ncomp:lease\ntimeout:5";
        assert_eq!(got, want);
    }

    #[test]
    fn sign_adds_authorization() {
        let signer = SharedKeySigner::new(DEV_ACCOUNT, DEV_KEY).unwrap();
        let mut request = reqwest::Client::new()
            .get("http://127.0.0.1:1/devstoreaccount1/c")
            .build()
            .unwrap();
        sign(&signer, &mut request).unwrap();
        let auth = request.headers()["authorization"].to_str().unwrap();
        assert!(auth.starts_with("SharedKey devstoreaccount1:"), "{auth}");
        assert!(request.headers().contains_key("x-ms-date"));
    }
}
