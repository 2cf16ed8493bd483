//! A plain `aws-sdk-s3` client for the S3 emulators (moto, LocalStack), for what an operator
//! does by hand: the S3 store never creates its bucket, so the tests create it first.

use aws_sdk_s3::Client;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_s3::error::DisplayErrorContext;

/// A client for the emulator at `url`: path-style addressing, credentials `test`/`test`,
/// region `us-east-1`, plain HTTP, and no automatic retries.
pub fn client(url: &str) -> Client {
    let config = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(url)
        .region(Region::new("us-east-1"))
        .force_path_style(true)
        .credentials_provider(Credentials::new(
            "test",
            "test",
            None,
            None,
            "leader-lease-emulator",
        ))
        .retry_config(RetryConfig::disabled())
        .http_client(aws_smithy_http_client::Builder::new().build_http())
        .build();
    Client::from_conf(config)
}

/// Creates `bucket` on the emulator at `url`; one that this account owns already is fine.
///
/// # Errors
/// The SDK's error, in words.
pub async fn create_bucket(url: &str, bucket: &str) -> Result<(), String> {
    match client(url).create_bucket().bucket(bucket).send().await {
        Ok(_) => Ok(()),
        Err(e)
            if e.as_service_error()
                .is_some_and(|e| e.is_bucket_already_owned_by_you()) =>
        {
            Ok(())
        }
        Err(e) => Err(format!(
            "creating bucket {bucket}: {}",
            DisplayErrorContext(e)
        )),
    }
}
