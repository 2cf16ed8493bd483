//! Shared Key signing, as a per-try policy of the SDK's pipeline.
//!
//! The new SDK authenticates with Entra ID tokens or SAS only; an account key (Azurite,
//! `UseDevelopmentStorage=true`, development accounts) needs the `SharedKey` scheme. The policy
//! runs on every try, after every other policy has set its headers and just before the
//! transport, so that the signature covers the request as sent. The signer itself is
//! public with the `test-util` feature.
// `SharedKeySigner` is reachable from outside with the `test-util` feature only.
#![cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use azure_core::http::policies::{Policy, PolicyResult};
use azure_core::http::{Body, Context, Request, Url};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::error::AzureError;

/// Shared Key signing of Blob service requests (service version 2015-02-21 and later) with
/// an account key: the string to sign, its HMAC-SHA256 and the `Authorization` value.
///
/// The store signs with it internally; the `test-util` feature makes it public so that test
/// tools (a plain HTTP client of Azurite, say) sign the same way instead of keeping a copy.
#[derive(Clone)]
pub struct SharedKeySigner {
    account: String,
    key: Vec<u8>,
}

impl std::fmt::Debug for SharedKeySigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("SharedKeySigner")
            .field("account", &self.account)
            .finish_non_exhaustive()
    }
}

impl SharedKeySigner {
    /// A signer for `account` with its base64 key.
    ///
    /// # Errors
    /// An invalid-configuration error if the key is not base64 or is empty.
    #[cfg_attr(not(feature = "test-util"), allow(dead_code))]
    pub fn new(account: &str, base64_key: &str) -> Result<Self, leader_core::Error> {
        Ok(Self::with_key(account, base64_key)?)
    }

    fn with_key(account: &str, base64_key: &str) -> Result<Self, AzureError> {
        let key = BASE64
            .decode(base64_key.trim())
            .map_err(AzureError::BadKey)?;
        if key.is_empty() {
            return Err(AzureError::Config("the account key is empty".to_owned()));
        }
        Ok(Self {
            account: account.to_owned(),
            key,
        })
    }

    /// The string to sign of a request: its method, URL, headers (names in any case) and the
    /// length of its body (signed where no `Content-Length` header says it; zero is signed as
    /// empty).
    pub fn string_to_sign<'a>(
        &self,
        method: &str,
        url: &Url,
        headers: impl IntoIterator<Item = (&'a str, &'a str)>,
        body_len: usize,
    ) -> String {
        let mut headers: Vec<(String, &str)> = headers
            .into_iter()
            .map(|(name, value)| (name.to_ascii_lowercase(), value))
            .collect();
        headers.sort_by(|a, b| a.0.cmp(&b.0));
        let get = |name: &str| -> &str {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| *v)
                .unwrap_or("")
        };
        let content_length = match get("content-length") {
            "" | "0" if body_len == 0 => String::new(),
            "" | "0" => body_len.to_string(),
            declared => declared.to_owned(),
        };
        let mut out = String::with_capacity(256);
        out.push_str(method);
        out.push('\n');
        for value in [
            get("content-encoding"),
            get("content-language"),
            &content_length,
            get("content-md5"),
            get("content-type"),
            get("date"),
            get("if-modified-since"),
            get("if-match"),
            get("if-none-match"),
            get("if-unmodified-since"),
            get("range"),
        ] {
            out.push_str(value);
            out.push('\n');
        }
        for (name, value) in headers.iter().filter(|(n, _)| n.starts_with("x-ms-")) {
            out.push_str(name);
            out.push(':');
            // Unfolded: runs of whitespace become one space, ends trimmed.
            out.push_str(&value.split_whitespace().collect::<Vec<_>>().join(" "));
            out.push('\n');
        }
        out.push_str(&self.canonical_resource(url));
        out
    }

    /// Path-style URLs (the emulator's) carry the account in the path too, so it appears
    /// twice: `/devstoreaccount1/devstoreaccount1/container`.
    fn canonical_resource(&self, url: &Url) -> String {
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

    /// The base64 HMAC-SHA256 of `string_to_sign` under the account key.
    pub fn signature(&self, string_to_sign: &str) -> String {
        // HMAC takes keys of any length, so this never fails; an empty key is refused in new().
        match Hmac::<Sha256>::new_from_slice(&self.key) {
            Ok(mut mac) => {
                mac.update(string_to_sign.as_bytes());
                BASE64.encode(mac.finalize().into_bytes())
            }
            Err(_) => String::new(),
        }
    }

    /// The `Authorization` header's value for `string_to_sign`.
    pub fn authorization(&self, string_to_sign: &str) -> String {
        format!(
            "SharedKey {}:{}",
            self.account,
            self.signature(string_to_sign)
        )
    }
}

/// Signs Blob requests with an account key.
#[derive(Clone, Debug)]
pub(crate) struct SharedKeyPolicy {
    signer: SharedKeySigner,
}

impl SharedKeyPolicy {
    /// A signer for `account` with its base64 key.
    pub(crate) fn new(account: &str, base64_key: &str) -> Result<Self, AzureError> {
        Ok(Self {
            signer: SharedKeySigner::with_key(account, base64_key)?,
        })
    }

    /// The string to sign of an SDK request.
    pub(crate) fn string_to_sign(&self, request: &Request) -> String {
        let body_len = match request.body() {
            Body::Bytes(bytes) => bytes.len(),
            #[allow(unreachable_patterns)]
            _ => 0,
        };
        self.signer.string_to_sign(
            request.method().as_ref(),
            request.url(),
            request
                .headers()
                .iter()
                .map(|(name, value)| (name.as_str(), value.as_str())),
            body_len,
        )
    }

    /// Adds `x-ms-date` and `Authorization` to `request`.
    pub(crate) fn sign(&self, request: &mut Request) {
        let now = UNIX_EPOCH + Duration::from_millis(leader_core::wall_clock_unix_ms());
        request.insert_header("x-ms-date", httpdate::fmt_http_date(now));
        let authorization = self.signer.authorization(&self.string_to_sign(request));
        request.insert_header("authorization", authorization);
    }
}

#[async_trait]
impl Policy for SharedKeyPolicy {
    async fn send(
        &self,
        ctx: &Context,
        request: &mut Request,
        next: &[Arc<dyn Policy>],
    ) -> PolicyResult {
        self.sign(request);
        match next.split_first() {
            Some((policy, rest)) => policy.send(ctx, request, rest).await,
            None => Err(azure_core::Error::with_message(
                azure_core::error::ErrorKind::Other,
                "the shared key policy must not be the last policy of the pipeline",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use azure_core::http::{Method, Url};

    /// Azurite's published development key (not a secret).
    const DEV_KEY: &str =
        "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

    fn lease_request() -> Request {
        let url = Url::parse(
            "http://127.0.0.1:10000/devstoreaccount1/leases/lease.scheduler?comp=lease&timeout=5",
        )
        .unwrap();
        let mut request = Request::new(url, Method::Put);
        request.insert_header("x-ms-version", "2026-04-06");
        request.insert_header("x-ms-date", "Sun, 29 Nov 2026 09:00:00 GMT");
        request.insert_header("x-ms-lease-action", "acquire");
        request.insert_header("x-ms-lease-duration", "15");
        request.insert_header(
            "x-ms-proposed-lease-id",
            "01234567-89ab-cdef-0123-456789abcdef",
        );
        request.insert_header("if-match", "\"0x8DC0000000000001\"");
        request
    }

    #[test]
    fn string_to_sign_follows_the_blob_layout() {
        let signer = SharedKeyPolicy::new("devstoreaccount1", DEV_KEY).unwrap();
        let want = "PUT\n\n\n\n\n\n\n\n\"0x8DC0000000000001\"\n\n\n\n\
            x-ms-date:Sun, 29 Nov 2026 09:00:00 GMT\n\
            x-ms-lease-action:acquire\n\
            x-ms-lease-duration:15\n\
            x-ms-proposed-lease-id:01234567-89ab-cdef-0123-456789abcdef\n\
            x-ms-version:2026-04-06\n\
            /devstoreaccount1/devstoreaccount1/leases/lease.scheduler\ncomp:lease\ntimeout:5";
        assert_eq!(signer.string_to_sign(&lease_request()), want);
    }

    #[test]
    fn known_request_gives_known_signature() {
        // Computed independently (Python hmac/base64) from the string to sign above.
        let signer = SharedKeyPolicy::new("devstoreaccount1", DEV_KEY).unwrap();
        let got = signer
            .signer
            .signature(&signer.string_to_sign(&lease_request()));
        assert_eq!(got, KNOWN_SIGNATURE);
    }

    const KNOWN_SIGNATURE: &str = "yFdHJuhhJfs2MBW/h2TiWBHfUcZ3tu9guPL/n2xEB9U=";

    #[test]
    fn content_length_and_metadata_headers_are_signed() {
        let signer = SharedKeyPolicy::new("acct", DEV_KEY).unwrap();
        let url = Url::parse("https://acct.blob.core.windows.net/c/b").unwrap();
        let mut request = Request::new(url, Method::Put);
        request.insert_header("x-ms-meta-leadertoken", "7");
        request.insert_header("x-ms-blob-type", "BlockBlob");
        request.insert_header("content-type", "application/json");
        request.set_body(b"{}".to_vec());
        let s = signer.string_to_sign(&request);
        assert!(s.starts_with("PUT\n\n\n2\n\napplication/json\n"), "{s}");
        assert!(s.contains("x-ms-blob-type:BlockBlob\nx-ms-meta-leadertoken:7\n"));
        assert!(s.ends_with("\n/acct/c/b"), "{s}");
    }

    #[test]
    fn debug_never_shows_the_key() {
        let signer = SharedKeyPolicy::new("acct", DEV_KEY).unwrap();
        let shown = format!("{signer:?}");
        assert!(!shown.contains("Eby8"), "{shown}");
        assert!(SharedKeyPolicy::new("acct", "not base64!").is_err());
        assert!(SharedKeySigner::new("acct", "").is_err());
    }
}
