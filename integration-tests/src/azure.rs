//! A minimal Azure Blob client for the emulator tests: Shared Key signing and the few
//! operations the canaries need (create container, Put Blob with conditions, Get Blob).
//!
//! Azurite checks Shared Key signatures like the real service, so every request is signed.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, KeyInit, Mac};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, Request, StatusCode};
use sha2::Sha256;

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
    /// The account key is not valid base64.
    BadKey(base64::DecodeError),
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
            AzureError::BadKey(e) => write!(f, "account key is not base64: {e}"),
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

/// Signs requests with Shared Key (the `Authorization: SharedKey account:signature` scheme).
#[derive(Clone)]
pub struct SharedKeySigner {
    account: String,
    key: Vec<u8>,
}

impl std::fmt::Debug for SharedKeySigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedKeySigner")
            .field("account", &self.account)
            .finish_non_exhaustive()
    }
}

impl SharedKeySigner {
    /// A signer for `account` with its base64 key.
    pub fn new(account: &str, base64_key: &str) -> Result<Self, AzureError> {
        Ok(SharedKeySigner {
            account: account.to_owned(),
            key: BASE64.decode(base64_key).map_err(AzureError::BadKey)?,
        })
    }

    /// The string to sign for a Blob service request (API versions 2015-02-21 and later), built
    /// from the method, the standard headers, the `x-ms-*` headers and the resource.
    pub fn string_to_sign(&self, request: &Request) -> String {
        let headers = request.headers();
        let get = |name: &str| -> String {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned()
        };
        // reqwest adds Content-Length when sending; sign what it will send. Zero is signed
        // as empty.
        let content_length = match request.body().and_then(|b| b.as_bytes()) {
            Some(bytes) if !bytes.is_empty() => bytes.len().to_string(),
            _ => String::new(),
        };
        let mut out = String::new();
        out.push_str(request.method().as_str());
        out.push('\n');
        for value in [
            get("content-encoding"),
            get("content-language"),
            content_length,
            get("content-md5"),
            get("content-type"),
            get("date"),
            get("if-modified-since"),
            get("if-match"),
            get("if-none-match"),
            get("if-unmodified-since"),
            get("range"),
        ] {
            out.push_str(&value);
            out.push('\n');
        }
        out.push_str(&canonical_headers(headers));
        out.push_str(&self.canonical_resource(request.url()));
        out
    }

    fn canonical_resource(&self, url: &reqwest::Url) -> String {
        // Path-style URLs (the emulator's) carry the account in the path too, so it appears
        // twice: "/devstoreaccount1/devstoreaccount1/container".
        let mut out = format!("/{}{}", self.account, url.path());
        let mut params: Vec<(String, Vec<String>)> = Vec::new();
        for (name, value) in url.query_pairs() {
            let name = name.to_lowercase();
            match params.iter_mut().find(|(n, _)| *n == name) {
                Some((_, values)) => values.push(value.into_owned()),
                None => params.push((name, vec![value.into_owned()])),
            }
        }
        params.sort();
        for (name, mut values) in params {
            values.sort();
            out.push('\n');
            out.push_str(&name);
            out.push(':');
            out.push_str(&values.join(","));
        }
        out
    }

    /// Adds `x-ms-date`, `x-ms-version` (unless present) and `Authorization` to the request.
    pub fn sign(&self, request: &mut Request) -> Result<(), AzureError> {
        let date = now_http_date();
        insert(request.headers_mut(), "x-ms-date", &date)?;
        if !request.headers().contains_key("x-ms-version") {
            insert(request.headers_mut(), "x-ms-version", API_VERSION)?;
        }
        let to_sign = self.string_to_sign(request);
        // HMAC accepts keys of any length: this cannot fail.
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key)
            .map_err(|e| AzureError::BadHeader(e.to_string()))?;
        mac.update(to_sign.as_bytes());
        let signature = BASE64.encode(mac.finalize().into_bytes());
        let value = format!("SharedKey {}:{signature}", self.account);
        insert(request.headers_mut(), "authorization", &value)
    }
}

#[allow(
    clippy::disallowed_methods,
    reason = "x-ms-date must be the wall-clock time of the request"
)]
fn now_http_date() -> String {
    httpdate::fmt_http_date(std::time::SystemTime::now())
}

fn insert(headers: &mut HeaderMap, name: &'static str, value: &str) -> Result<(), AzureError> {
    let value =
        HeaderValue::from_str(value).map_err(|_| AzureError::BadHeader(value.to_owned()))?;
    headers.insert(HeaderName::from_static(name), value);
    Ok(())
}

fn canonical_headers(headers: &HeaderMap) -> String {
    let mut ms: Vec<(String, String)> = headers
        .iter()
        .filter(|(name, _)| name.as_str().starts_with("x-ms-"))
        .map(|(name, value)| {
            let value = String::from_utf8_lossy(value.as_bytes());
            // Unfold: runs of whitespace become one space, ends trimmed.
            let value = value.split_whitespace().collect::<Vec<_>>().join(" ");
            (name.as_str().to_owned(), value)
        })
        .collect();
    ms.sort();
    let mut out = String::new();
    for (name, value) in ms {
        out.push_str(&name);
        out.push(':');
        out.push_str(&value);
        out.push('\n');
    }
    out
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
            signer: SharedKeySigner::new(account, base64_key)?,
        })
    }

    async fn send(&self, mut request: Request) -> Result<reqwest::Response, AzureError> {
        self.signer.sign(&mut request)?;
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
        let got = signer.string_to_sign(&request);
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
        signer.sign(&mut request).unwrap();
        let auth = request.headers()["authorization"].to_str().unwrap();
        assert!(auth.starts_with("SharedKey devstoreaccount1:"), "{auth}");
        assert!(request.headers().contains_key("x-ms-date"));
    }
}
