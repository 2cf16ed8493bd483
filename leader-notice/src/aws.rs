//! EC2 instance metadata (IMDSv2): Spot interruption and Auto Scaling target lifecycle state.

use std::time::Duration;

use async_trait::async_trait;
use aws_config::imds::client::Client;
use aws_config::imds::client::error::ImdsError;
use serde::Deserialize;
use tracing::{debug, info};

use crate::{Cloud, Notice, NoticeError, NoticeKind, Source};

const SERVICE: &str = "aws";

/// The Spot interruption notice: 404 until the instance is marked for interruption.
const SPOT: &str = "/latest/meta-data/spot/instance-action";
/// Where Auto Scaling is taking the instance: `Terminated` while a terminate hook holds it.
const LIFECYCLE: &str = "/latest/meta-data/autoscaling/target-lifecycle-state";
/// The rebalance recommendation: advisory, logged only.
const REBALANCE: &str = "/latest/meta-data/events/recommendations/rebalance";
const INSTANCE_ID: &str = "/latest/meta-data/instance-id";
const REGION: &str = "/latest/meta-data/placement/region";

/// AWS recommends a look every 5 s.
const PAUSE: Duration = Duration::from_secs(5);

/// The IMDSv2 client of this crate: the endpoint from `AWS_EC2_METADATA_SERVICE_ENDPOINT` or
/// the profile (read by `aws-config`), short timeouts and one retry, so that a metadata
/// service that hangs holds a look for seconds, not minutes.
pub(crate) fn imds_client() -> Client {
    imds_client_within(Duration::from_secs(2), 2)
}

fn imds_client_within(read: Duration, attempts: u32) -> Client {
    use aws_config::provider_config::ProviderConfig;
    use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};
    leader_core::tls::install_crypto_provider();
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::AwsLc))
        .build_https();
    Client::builder()
        .configure(&ProviderConfig::default().with_http_client(http))
        .max_attempts(attempts)
        .connect_timeout(crate::http::METADATA_CONNECT)
        .read_timeout(read)
        .operation_attempt_timeout(read + crate::http::METADATA_CONNECT)
        .operation_timeout((read + crate::http::METADATA_CONNECT) * attempts)
        .build()
}

/// This instance's id (`i-...`), from IMDS.
///
/// # Errors
/// The metadata service's error (not on EC2, IMDS disabled, hop limit too low).
pub(crate) async fn instance_id() -> Result<String, NoticeError> {
    let id = get(&imds_client(), INSTANCE_ID).await?;
    let id = id.trim();
    if id.starts_with("i-") {
        Ok(id.to_owned())
    } else {
        Err(crate::http::malformed(
            SERVICE,
            "GET instance-id",
            "not an instance id",
            id,
        ))
    }
}

/// The region to call Auto Scaling in: this instance's own (IMDS `placement/region`: its
/// group is there, whatever region `AWS_REGION` names for the lease store), else, off EC2,
/// `AWS_REGION`/`AWS_DEFAULT_REGION` or the profile's (as `aws-config` finds them).
///
/// # Errors
/// [`NoticeError::Config`] if there is no region anywhere; the metadata service's error.
pub(crate) async fn region() -> Result<String, NoticeError> {
    use aws_config::environment::region::EnvironmentVariableRegionProvider;
    use aws_config::meta::region::RegionProviderChain;
    use aws_config::profile::region::ProfileFileRegionProvider;
    let disabled = std::env::var("AWS_EC2_METADATA_DISABLED")
        .is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"));
    let no_imds = if disabled {
        "AWS_EC2_METADATA_DISABLED is set".to_owned()
    } else {
        match imds_client().get(REGION).await {
            Ok(region) => {
                let region = String::from(region);
                let region = region.trim();
                if region.is_empty() || region.contains(char::is_whitespace) {
                    return Err(crate::http::malformed(
                        SERVICE,
                        "GET placement/region",
                        "not a region",
                        region,
                    ));
                }
                debug!(region, "this instance's region (IMDS)");
                return Ok(region.to_owned());
            }
            // No IMDS at all (no token: not on EC2, or a hop limit of 1): off EC2, the
            // configured region is the only one there is.
            Err(e @ ImdsError::FailedToLoadToken(_)) => imds_error(REGION, &e).to_string(),
            // IMDS is there but failed: its answer is the right region, so this is an error
            // to retry, never a fallback to a region that may be another than the instance's.
            Err(e) => return Err(imds_error(REGION, &e)),
        }
    };
    let chain = RegionProviderChain::first_try(EnvironmentVariableRegionProvider::new())
        .or_else(ProfileFileRegionProvider::new());
    match chain.region().await {
        Some(region) => {
            debug!(region = %region, "the configured region (no instance metadata)");
            Ok(region.to_string())
        }
        None => Err(NoticeError::Config(format!(
            "no AWS region: run on EC2 with IMDS reachable, or set AWS_REGION ({no_imds})"
        ))),
    }
}

/// A GET on IMDS: the body, or the error (a 404 included, see [`is_not_found`]).
async fn get(client: &Client, path: &str) -> Result<String, NoticeError> {
    client
        .get(path)
        .await
        .map(String::from)
        .map_err(|e| imds_error(path, &e))
}

/// A GET that may answer 404 ("nothing here", the normal case for the notice paths).
async fn get_optional(client: &Client, path: &str) -> Result<Option<String>, NoticeError> {
    match client.get(path).await {
        Ok(body) => Ok(Some(String::from(body))),
        Err(ImdsError::ErrorResponse(r)) if r.response().status().as_u16() == 404 => Ok(None),
        Err(e) => Err(imds_error(path, &e)),
    }
}

/// What an IMDS failure means for the user. Never includes a token: the client keeps it to
/// itself, and only statuses and error chains are shown.
fn imds_error(path: &str, e: &ImdsError) -> NoticeError {
    let what = format!("IMDS GET {path}");
    match e {
        ImdsError::ErrorResponse(r) => {
            let status = r.response().status().as_u16();
            let body = r
                .response()
                .body()
                .bytes()
                .map(String::from_utf8_lossy)
                .unwrap_or_default();
            let status = reqwest::StatusCode::from_u16(status)
                .unwrap_or(reqwest::StatusCode::INTERNAL_SERVER_ERROR);
            crate::http::status_error(
                SERVICE,
                &what,
                status,
                &body,
                "the instance metadata service is disabled for this instance \
                 (HttpEndpoint=disabled) or refuses this request",
            )
        }
        ImdsError::FailedToLoadToken(_) => NoticeError::Unavailable {
            service: SERVICE,
            message: format!(
                "{what}: no IMDSv2 token ({}); off EC2 this is expected; in a container, \
                 the instance's HttpPutResponseHopLimit must be at least 2",
                crate::http::chain(e)
            ),
        },
        _ => NoticeError::Unavailable {
            service: SERVICE,
            message: format!("{what}: {}", crate::http::chain(e)),
        },
    }
}

/// The body of `spot/instance-action`.
#[derive(Debug, Deserialize)]
struct InstanceAction {
    action: String,
    time: String,
}

/// The notice a `spot/instance-action` body means.
///
/// # Errors
/// [`NoticeError::Malformed`] if it is not the JSON AWS documents.
fn spot_notice(body: &str) -> Result<Notice, NoticeError> {
    let action: InstanceAction =
        crate::http::parse_json(SERVICE, "IMDS GET spot/instance-action", body)?;
    Ok(Notice::new(
        Cloud::Aws,
        NoticeKind::SpotInterruption,
        format!("spot instance-action {} at {}", action.action, action.time),
    ))
}

/// The notice a `autoscaling/target-lifecycle-state` body means: only `Terminated`.
fn lifecycle_notice(body: &str) -> Option<Notice> {
    (body.trim() == "Terminated").then(|| {
        Notice::new(
            Cloud::Aws,
            NoticeKind::ScaleIn,
            "autoscaling target-lifecycle-state Terminated",
        )
    })
}

/// Watches this EC2 instance's metadata for a Spot interruption or an Auto Scaling
/// termination.
pub(crate) struct ImdsSource {
    client: Client,
    /// Whether a rebalance recommendation was logged already (once is enough).
    rebalance_logged: bool,
}

impl ImdsSource {
    /// The source, with the endpoint of `AWS_EC2_METADATA_SERVICE_ENDPOINT` (or the profile's).
    ///
    /// # Errors
    /// [`NoticeError::Config`] if `AWS_EC2_METADATA_SERVICE_ENDPOINT` is not a URL.
    pub(crate) fn from_env() -> Result<Self, NoticeError> {
        if let Ok(endpoint) = std::env::var("AWS_EC2_METADATA_SERVICE_ENDPOINT") {
            check_endpoint(&endpoint)?;
        }
        Ok(Self {
            client: imds_client(),
            rebalance_logged: false,
        })
    }

    /// Logs a rebalance recommendation once; it is advisory (often for a whole fleet) and
    /// never a notice. A failure here is only debug-logged.
    async fn note_rebalance(&mut self) {
        if self.rebalance_logged {
            return;
        }
        match get_optional(&self.client, REBALANCE).await {
            Ok(Some(body)) => {
                self.rebalance_logged = true;
                info!(cloud = "aws", recommendation = %crate::http::prefix(&body),
                    "EC2 rebalance recommendation: this Spot instance is at elevated risk of \
                     interruption (advisory; acting only on an interruption notice)");
            }
            Ok(None) => {}
            Err(e) => debug!(error = %e, "could not read the rebalance recommendation"),
        }
    }
}

/// An IMDS endpoint setting must be an absolute http(s) URL.
fn check_endpoint(endpoint: &str) -> Result<(), NoticeError> {
    match url::Url::parse(endpoint) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.has_host() => Ok(()),
        _ => Err(NoticeError::Config(format!(
            "AWS_EC2_METADATA_SERVICE_ENDPOINT={endpoint:?} is not an http(s) URL \
             (e.g. http://169.254.169.254)"
        ))),
    }
}

#[async_trait]
impl Source for ImdsSource {
    fn cloud(&self) -> Cloud {
        Cloud::Aws
    }

    async fn present(&self) -> bool {
        // One token request and one GET, each short, no retry: off EC2 the connect times out.
        let quick = imds_client_within(Duration::from_secs(1), 1);
        quick.get(INSTANCE_ID).await.is_ok()
    }

    /// Both paths at once, so that one that fails or hangs does not hide the other's notice:
    /// a notice of either, else the first error, else none.
    async fn look(&mut self) -> Result<Option<Notice>, NoticeError> {
        let (spot, lifecycle) = tokio::join!(
            get_optional(&self.client, SPOT),
            get_optional(&self.client, LIFECYCLE)
        );
        let spot = spot.and_then(|body| body.as_deref().map(spot_notice).transpose());
        let lifecycle = lifecycle.map(|body| body.as_deref().and_then(lifecycle_notice));
        match (spot, lifecycle) {
            (Ok(Some(n)), _) | (_, Ok(Some(n))) => Ok(Some(n)),
            (Err(e), _) | (_, Err(e)) => Err(e),
            (Ok(None), Ok(None)) => {
                self.note_rebalance().await;
                Ok(None)
            }
        }
    }

    fn pause(&self) -> Duration {
        PAUSE
    }

    async fn approve(&self, _notice: &Notice) -> Result<bool, NoticeError> {
        // EC2 has nothing to approve; completing a lifecycle hook is `AutoScaling`'s.
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_spot_action_is_an_interruption() {
        let n = spot_notice(r#"{"action":"terminate","time":"2026-04-24T17:19:32Z"}"#).unwrap();
        assert_eq!(n.kind, NoticeKind::SpotInterruption);
        assert_eq!(n.cloud, Cloud::Aws);
        assert!(n.detail.contains("terminate"), "{}", n.detail);
        assert!(n.detail.contains("2026-04-24T17:19:32Z"), "{}", n.detail);
        assert_eq!(n.event_id, None);
        let stop = spot_notice(r#"{"action":"stop","time":"2026-04-24T17:19:32Z"}"#).unwrap();
        assert!(stop.detail.contains("stop"));
    }

    #[test]
    fn a_spot_answer_that_does_not_parse_is_malformed_not_a_notice() {
        for body in ["<html>not json", "{}", r#"{"action":"terminate"}"#] {
            assert!(
                matches!(spot_notice(body), Err(NoticeError::Malformed { .. })),
                "{body}"
            );
        }
    }

    #[test]
    fn only_terminated_is_a_scale_in() {
        assert_eq!(
            lifecycle_notice("Terminated\n").map(|n| n.kind),
            Some(NoticeKind::ScaleIn)
        );
        for other in [
            "InService",
            "Standby",
            "Detached",
            "Warmed:Running",
            "<html>not json",
            "",
        ] {
            assert_eq!(lifecycle_notice(other), None, "{other}");
        }
    }

    #[test]
    fn an_endpoint_must_be_a_url() {
        assert!(check_endpoint("http://127.0.0.1:8080").is_ok());
        assert!(check_endpoint("http://[fd00:ec2::254]").is_ok());
        for bad in ["169.254.169.254", "not a url", "ftp://x"] {
            assert!(
                matches!(check_endpoint(bad), Err(NoticeError::Config(_))),
                "{bad}"
            );
        }
    }
}
