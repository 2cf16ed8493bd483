//! Raw etcd access through its JSON gateway (`/v3/...`), for what a test does behind a store's
//! back: plant a value, delete a key, look at a key's revisions and lease.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};

/// A key as etcd reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawKey {
    /// The revision of the write that created it.
    pub create_revision: i64,
    /// The revision of its last write.
    pub mod_revision: i64,
    /// The lease it is attached to (0: none).
    pub lease: i64,
    /// Its value.
    pub value: Vec<u8>,
}

/// A client of etcd's JSON gateway at `http://host:port`.
///
/// Keys and values are base64 in the gateway's JSON; user and role names are plain strings.
#[derive(Clone, Debug)]
pub struct EtcdRaw {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl EtcdRaw {
    /// A client for the server at `endpoint` (`http://host:port`).
    pub fn new(endpoint: &str) -> Self {
        Self {
            http: reqwest::Client::new(),
            base: endpoint.trim_end_matches('/').to_owned(),
            token: None,
        }
    }

    /// A client of a server with auth enabled, authenticated as `user`.
    ///
    /// # Errors
    /// A message if etcd refused the credentials.
    pub async fn authenticated(endpoint: &str, user: &str, password: &str) -> Result<Self, String> {
        let mut raw = Self::new(endpoint);
        let answer = raw
            .post(
                "auth/authenticate",
                json!({"name": user, "password": password}),
            )
            .await?;
        let token = answer
            .get("token")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("no token in {answer}"))?;
        raw.token = Some(token.to_owned());
        Ok(raw)
    }

    /// POSTs `body` to `/v3/{path}` (e.g. `auth/user/add`) and returns etcd's answer.
    ///
    /// # Errors
    /// A message if etcd did not answer with success.
    pub async fn post(&self, path: &str, body: Value) -> Result<Value, String> {
        let mut request = self
            .http
            .post(format!("{}/v3/{path}", self.base))
            .json(&body);
        if let Some(token) = &self.token {
            request = request.header("Authorization", token);
        }
        let response = request.send().await.map_err(|e| format!("{path}: {e}"))?;
        if !response.status().is_success() {
            let status = response.status();
            let body = response.text().await.unwrap_or_default();
            return Err(format!("{path}: HTTP {status}: {body}"));
        }
        response.json().await.map_err(|e| format!("{path}: {e}"))
    }

    /// Writes `value` to `key`, without a lease.
    ///
    /// # Errors
    /// A message if etcd did not answer with success.
    pub async fn put(&self, key: &str, value: &[u8]) -> Result<(), String> {
        let body = json!({"key": B64.encode(key), "value": B64.encode(value)});
        self.post("kv/put", body).await.map(drop)
    }

    /// Deletes `key`.
    ///
    /// # Errors
    /// A message if etcd did not answer with success.
    pub async fn delete(&self, key: &str) -> Result<(), String> {
        self.post("kv/deleterange", json!({"key": B64.encode(key)}))
            .await
            .map(drop)
    }

    /// The key, if it exists.
    ///
    /// # Errors
    /// A message if etcd did not answer with success or the answer is not etcd's.
    pub async fn get(&self, key: &str) -> Result<Option<RawKey>, String> {
        let answer = self
            .post("kv/range", json!({"key": B64.encode(key)}))
            .await?;
        let Some(kv) = answer.get("kvs").and_then(|kvs| kvs.get(0)) else {
            return Ok(None);
        };
        // int64 fields come as strings, and are left out when 0.
        let num = |field: &str| -> Result<i64, String> {
            kv.get(field)
                .and_then(Value::as_str)
                .map_or(Ok(0), |s| s.parse().map_err(|e| format!("{field}: {e}")))
        };
        let value = kv
            .get("value")
            .and_then(Value::as_str)
            .map_or(Ok(Vec::new()), |v| B64.decode(v))
            .map_err(|e| format!("value: {e}"))?;
        Ok(Some(RawKey {
            create_revision: num("create_revision")?,
            mod_revision: num("mod_revision")?,
            lease: num("lease")?,
            value,
        }))
    }
}

/// A key (or prefix) as the gateway's JSON carries bytes.
pub fn b64(key: &str) -> String {
    B64.encode(key)
}
