//! Raw GCS JSON API calls for the emulator: create a bucket, multipart upload with a generation
//! precondition, read an object.
//!
//! fake-gcs-server enforces `ifGenerationMatch` only on multipart uploads (not on simple media
//! uploads), so writes that must be conditional go through [`GcsClient::upload`].

use reqwest::StatusCode;

/// Errors of the GCS helpers.
#[derive(Debug)]
pub enum GcsError {
    /// The HTTP request failed.
    Http(reqwest::Error),
    /// The service answered with an unexpected status.
    Status {
        /// What was attempted.
        operation: String,
        /// The status.
        status: StatusCode,
        /// The response body.
        body: String,
    },
    /// A response lacked an expected field.
    Malformed(String),
}

impl std::fmt::Display for GcsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GcsError::Http(e) => write!(f, "HTTP request failed: {e}"),
            GcsError::Status {
                operation,
                status,
                body,
            } => write!(f, "{operation}: unexpected {status}: {body}"),
            GcsError::Malformed(what) => write!(f, "malformed response: {what}"),
        }
    }
}

impl std::error::Error for GcsError {}

impl From<reqwest::Error> for GcsError {
    fn from(e: reqwest::Error) -> Self {
        GcsError::Http(e)
    }
}

/// The outcome of a conditional upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UploadOutcome {
    /// Written; the object's new generation.
    Written(i64),
    /// The generation precondition failed (412).
    ConditionFailed,
}

/// A tiny client for the JSON API at `http://host:port` (no credentials: the emulator takes any).
#[derive(Debug, Clone)]
pub struct GcsClient {
    http: reqwest::Client,
    base: String,
}

const BOUNDARY: &str = "leader-lease-part-boundary-7c1f";

fn encode_path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl GcsClient {
    /// A client for the emulator at `endpoint_url` (e.g. `http://127.0.0.1:4443`).
    pub fn new(endpoint_url: &str) -> Self {
        GcsClient {
            http: reqwest::Client::new(),
            base: endpoint_url.trim_end_matches('/').to_owned(),
        }
    }

    /// Creates a bucket.
    pub async fn create_bucket(&self, bucket: &str) -> Result<(), GcsError> {
        let response = self
            .http
            .post(format!(
                "{}/storage/v1/b?project=leader-lease-test",
                self.base
            ))
            .json(&serde_json::json!({ "name": bucket }))
            .send()
            .await?;
        if response.status().is_success() {
            return Ok(());
        }
        Err(GcsError::Status {
            operation: format!("create bucket {bucket}"),
            status: response.status(),
            body: response.text().await.unwrap_or_default(),
        })
    }

    /// Multipart upload of `object` with `ifGenerationMatch=if_generation` (`Some(0)`: create
    /// only; `None`: unconditional).
    pub async fn upload(
        &self,
        bucket: &str,
        object: &str,
        data: &[u8],
        if_generation: Option<i64>,
    ) -> Result<UploadOutcome, GcsError> {
        let mut url = format!(
            "{}/upload/storage/v1/b/{}/o?uploadType=multipart",
            self.base,
            encode_path_segment(bucket)
        );
        if let Some(generation) = if_generation {
            url.push_str(&format!("&ifGenerationMatch={generation}"));
        }
        let metadata =
            serde_json::json!({ "name": object, "contentType": "application/octet-stream" });
        let mut body = Vec::with_capacity(data.len() + 256);
        body.extend_from_slice(
            format!(
                "--{BOUNDARY}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{metadata}\r\n\
                 --{BOUNDARY}\r\nContent-Type: application/octet-stream\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(data);
        body.extend_from_slice(format!("\r\n--{BOUNDARY}--\r\n").as_bytes());
        let response = self
            .http
            .post(url)
            .header(
                "content-type",
                format!("multipart/related; boundary={BOUNDARY}"),
            )
            .body(body)
            .send()
            .await?;
        match response.status() {
            StatusCode::PRECONDITION_FAILED => Ok(UploadOutcome::ConditionFailed),
            status if status.is_success() => {
                let json: serde_json::Value = response.json().await?;
                Ok(UploadOutcome::Written(generation_of(&json)?))
            }
            status => Err(GcsError::Status {
                operation: format!("upload {bucket}/{object}"),
                status,
                body: response.text().await.unwrap_or_default(),
            }),
        }
    }

    /// Deletes the object (its live generation), as an operator would.
    pub async fn delete(&self, bucket: &str, object: &str) -> Result<(), GcsError> {
        let url = format!(
            "{}/storage/v1/b/{}/o/{}",
            self.base,
            encode_path_segment(bucket),
            encode_path_segment(object)
        );
        let response = self.http.delete(&url).send().await?;
        if !response.status().is_success() {
            return Err(GcsError::Status {
                operation: format!("delete {bucket}/{object}"),
                status: response.status(),
                body: response.text().await.unwrap_or_default(),
            });
        }
        Ok(())
    }

    /// The object's content and generation.
    pub async fn read(&self, bucket: &str, object: &str) -> Result<(Vec<u8>, i64), GcsError> {
        let url = format!(
            "{}/storage/v1/b/{}/o/{}",
            self.base,
            encode_path_segment(bucket),
            encode_path_segment(object)
        );
        let response = self.http.get(&url).send().await?;
        if !response.status().is_success() {
            return Err(GcsError::Status {
                operation: format!("stat {bucket}/{object}"),
                status: response.status(),
                body: response.text().await.unwrap_or_default(),
            });
        }
        let json: serde_json::Value = response.json().await?;
        let generation = generation_of(&json)?;
        let response = self
            .http
            .get(format!("{url}?alt=media&generation={generation}"))
            .send()
            .await?;
        if !response.status().is_success() {
            return Err(GcsError::Status {
                operation: format!("read {bucket}/{object}"),
                status: response.status(),
                body: response.text().await.unwrap_or_default(),
            });
        }
        Ok((response.bytes().await?.to_vec(), generation))
    }
}

fn generation_of(json: &serde_json::Value) -> Result<i64, GcsError> {
    let value = &json["generation"];
    value
        .as_str()
        .and_then(|s| s.parse().ok())
        .or_else(|| value.as_i64())
        .ok_or_else(|| GcsError::Malformed(format!("no generation in {json}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_parses_string_or_number() {
        assert_eq!(
            generation_of(&serde_json::json!({"generation": "17"})).unwrap(),
            17
        );
        assert_eq!(
            generation_of(&serde_json::json!({"generation": 18})).unwrap(),
            18
        );
        assert!(generation_of(&serde_json::json!({})).is_err());
    }

    #[test]
    fn path_segments_are_encoded() {
        assert_eq!(encode_path_segment("a/b c"), "a%2Fb%20c");
    }
}
