//! The S3 emulators of the `s3://` tests (moto's S3 and LocalStack's S3, through
//! `integration_tests::require`), and a fresh bucket on one: `leader` never creates a bucket,
//! so each test creates its own first, as an operator would.
#![allow(dead_code, unreachable_pub, clippy::panic)]

use integration_tests::{Emulator, require, unique_name};

/// The endpoint URL of `emulator` (`Emulator::MotoS3` or `Emulator::LocalStackS3`), or `None`
/// when the test skips; fails the test when it is missing (see `integration_tests::require`).
pub async fn url(emulator: Emulator) -> Option<String> {
    let endpoint = require(emulator).await?;
    Some(endpoint.url.trim_end_matches('/').to_owned())
}

/// A plain client of the emulator at `url` (path-style, dummy keys, no retries), to look at
/// what `leader` wrote.
pub fn client(url: &str) -> aws_sdk_s3::Client {
    integration_tests::s3::client(url)
}

/// Creates a bucket with a fresh name (from `prefix`) on the emulator at `url`; returns it.
pub async fn new_bucket(url: &str, prefix: &str) -> String {
    let bucket = unique_name(prefix);
    integration_tests::s3::create_bucket(url, &bucket)
        .await
        .unwrap_or_else(|e| panic!("at {url}: {e}"));
    bucket
}
