//! The Google Compute Engine metadata server: preemption and terminating host maintenance,
//! through hanging GETs.

use std::time::Duration;

use async_trait::async_trait;
use tracing::debug;

use crate::http::{self, Reply};
use crate::{Cloud, Notice, NoticeError, NoticeKind, Source};

const SERVICE: &str = "gcp";

/// The setting that moves the metadata server (`host[:port]`), as Google's own libraries read it.
const HOST_VAR: &str = "GCE_METADATA_HOST";
const DEFAULT_HOST: &str = "169.254.169.254";

/// How long the server holds a hanging GET before it answers with the unchanged value.
const WAIT_SECS: u64 = 60;
/// A hanging GET's own timeout: a little above the server's.
const HANGING_TIMEOUT: Duration = Duration::from_secs(WAIT_SECS + 10);
/// A plain GET.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// `present()`: one quick call.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The two values watched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Value {
    Preempted,
    Maintenance,
}

impl Value {
    fn path(self) -> &'static str {
        match self {
            Value::Preempted => "/computeMetadata/v1/instance/preempted",
            Value::Maintenance => "/computeMetadata/v1/instance/maintenance-event",
        }
    }

    fn index(self) -> usize {
        match self {
            Value::Preempted => 0,
            Value::Maintenance => 1,
        }
    }

    /// The notice the value's text means.
    ///
    /// # Errors
    /// [`NoticeError::Malformed`] if the text is not such a value (a proxy's page).
    fn notice(self, text: &str) -> Result<Option<Notice>, NoticeError> {
        let text = text.trim();
        let what = format!("GET {}", self.path());
        match self {
            Value::Preempted => match text {
                "TRUE" => Ok(Some(Notice::new(
                    Cloud::Gcp,
                    NoticeKind::Preempted,
                    "instance/preempted TRUE",
                ))),
                "FALSE" => Ok(None),
                _ => Err(http::malformed(
                    SERVICE,
                    &what,
                    "expected TRUE or FALSE",
                    text,
                )),
            },
            Value::Maintenance => {
                if text.is_empty() || !text.bytes().all(|b| b.is_ascii_uppercase() || b == b'_') {
                    return Err(http::malformed(
                        SERVICE,
                        &what,
                        "expected a maintenance event",
                        text,
                    ));
                }
                if text == "TERMINATE_ON_HOST_MAINTENANCE" {
                    return Ok(Some(Notice::new(
                        Cloud::Gcp,
                        NoticeKind::HostMaintenance,
                        "instance/maintenance-event TERMINATE_ON_HOST_MAINTENANCE",
                    )));
                }
                // NONE, MIGRATE_ON_HOST_MAINTENANCE (a live migration: the machine stays), or
                // a value added later.
                if text != "NONE" {
                    debug!(
                        event = text,
                        "GCE maintenance event that is not a termination"
                    );
                }
                Ok(None)
            }
        }
    }
}

/// The metadata server's base URL from `GCE_METADATA_HOST` (`host[:port]`), plain HTTP.
fn base_url(host: &str) -> Result<String, NoticeError> {
    let bad = || {
        NoticeError::Config(format!(
            "{HOST_VAR}={host:?} is not a host[:port] (e.g. {DEFAULT_HOST} or metadata.google.internal)"
        ))
    };
    if host.is_empty() || host.contains(['/', '?', '#', '@', ' ']) {
        return Err(bad());
    }
    let base = format!("http://{host}");
    match url::Url::parse(&base) {
        Ok(u) if u.has_host() => Ok(base),
        _ => Err(bad()),
    }
}

/// What is known of a value since its last read.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seen {
    /// Never read, or the last read failed: the next look reads it with a plain GET.
    Not,
    /// Read; the next look hangs until the value's `ETag` differs from this one.
    Etag(String),
    /// Read, but the server sent no `ETag`: the next look hangs until the next change.
    NoEtag,
}

/// Watches this GCE instance's preemption and maintenance values.
pub(crate) struct GceMetadata {
    client: reqwest::Client,
    base: String,
    /// What is known of each value (by [`Value::index`]).
    seen: [Seen; 2],
}

impl GceMetadata {
    /// The source, at `GCE_METADATA_HOST` (default `169.254.169.254`).
    ///
    /// # Errors
    /// [`NoticeError::Config`] if the setting is not a `host[:port]`.
    pub(crate) fn from_env() -> Result<Self, NoticeError> {
        let host = std::env::var(HOST_VAR).unwrap_or_else(|_| DEFAULT_HOST.to_owned());
        Ok(Self {
            client: http::metadata_client(CALL_TIMEOUT)?,
            base: base_url(host.trim())?,
            seen: [Seen::Not, Seen::Not],
        })
    }

    /// One GET of `value`: plain if nothing is known of it, else a hanging one.
    async fn get(
        client: &reqwest::Client,
        base: &str,
        value: Value,
        seen: &Seen,
    ) -> Result<Reply, NoticeError> {
        let mut url = url::Url::parse(&format!("{base}{}", value.path()))
            .map_err(|e| NoticeError::Config(format!("{HOST_VAR}: {e}")))?;
        let timeout = if *seen == Seen::Not {
            CALL_TIMEOUT
        } else {
            let mut query = url.query_pairs_mut();
            query.append_pair("wait_for_change", "true");
            if let Seen::Etag(etag) = seen {
                query.append_pair("last_etag", etag);
            }
            query.append_pair("timeout_sec", &WAIT_SECS.to_string());
            drop(query);
            HANGING_TIMEOUT
        };
        let what = format!("GET {}", value.path());
        let request = client
            .get(url)
            .header("Metadata-Flavor", "Google")
            .timeout(timeout);
        http::send(SERVICE, &what, request).await?.success(
            SERVICE,
            &what,
            "the metadata server refused the request",
        )
    }

    /// Takes in one answer: remembers its `ETag` (forgets what was known after a failure) and
    /// says what it means.
    fn take(
        &mut self,
        value: Value,
        answer: Result<Reply, NoticeError>,
    ) -> Result<Option<Notice>, NoticeError> {
        let slot = &mut self.seen[value.index()];
        let notice = answer.and_then(|reply| {
            let notice = value.notice(&reply.body)?;
            *slot = reply.etag.map_or(Seen::NoEtag, Seen::Etag);
            Ok(notice)
        });
        if notice.is_err() {
            *slot = Seen::Not;
        }
        notice
    }

    /// One GET of each value at once (plain for a value of which nothing is known, else
    /// hanging). Returns at the first notice; else when a hanging GET answered without one; a
    /// plain GET (quick) or a failure waits for the other too, so that the first look reads
    /// both values and a value that keeps failing does not hide the other's notice. After a
    /// failure the other is read plainly rather than waited on: its hanging GET could hold the
    /// look for a minute while the failed value, read again, would show a notice.
    async fn look_both(&mut self) -> Result<Option<Notice>, NoticeError> {
        let client = self.client.clone();
        let base = self.base.clone();
        let seen = self.seen.clone();
        let [s0, s1] = &seen;
        let mut preempted = Box::pin(Self::get(&client, &base, Value::Preempted, s0));
        let mut maintenance = Box::pin(Self::get(&client, &base, Value::Maintenance, s1));
        let (first, answer) = tokio::select! {
            a = &mut preempted => (Value::Preempted, a),
            a = &mut maintenance => (Value::Maintenance, a),
        };
        let other = match first {
            Value::Preempted => Value::Maintenance,
            Value::Maintenance => Value::Preempted,
        };
        let first = self.take(first, answer);
        let other_is_plain = seen[other.index()] == Seen::Not;
        match first {
            Ok(Some(notice)) => return Ok(Some(notice)),
            Ok(None) if !other_is_plain => return Ok(None),
            _ => {}
        }
        let pending = match other {
            Value::Preempted => preempted,
            Value::Maintenance => maintenance,
        };
        let answer = if first.is_err() && !other_is_plain {
            drop(pending);
            Self::get(&client, &base, other, &Seen::Not).await
        } else {
            pending.await
        };
        match (first, self.take(other, answer)) {
            (_, Ok(Some(notice))) => Ok(Some(notice)),
            (Err(e), _) | (_, Err(e)) => Err(e),
            (Ok(_), Ok(None)) => Ok(None),
        }
    }
}

#[async_trait]
impl Source for GceMetadata {
    fn cloud(&self) -> Cloud {
        Cloud::Gcp
    }

    async fn present(&self) -> bool {
        let request = self
            .client
            .get(format!("{}/", self.base))
            .timeout(PROBE_TIMEOUT);
        match http::send(SERVICE, "GET /", request).await {
            Ok(reply) => reply.flavor.as_deref() == Some("Google"),
            Err(_) => false,
        }
    }

    /// The first look reads both values with plain GETs; the others hang on both until one
    /// changes (or about a minute passes). A value whose read failed is read plainly again.
    async fn look(&mut self) -> Result<Option<Notice>, NoticeError> {
        self.look_both().await
    }

    fn pause(&self) -> Duration {
        // The next hanging GET at once (the watcher waits after failures).
        Duration::ZERO
    }

    async fn approve(&self, _notice: &Notice) -> Result<bool, NoticeError> {
        // GCE has nothing to approve.
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn preempted_true_is_a_notice() {
        let n = Value::Preempted.notice("TRUE\n").unwrap().unwrap();
        assert_eq!(n.kind, NoticeKind::Preempted);
        assert_eq!(n.cloud, Cloud::Gcp);
        assert_eq!(Value::Preempted.notice("FALSE").unwrap(), None);
        for bad in ["<html>not json", "", "true"] {
            assert!(
                matches!(
                    Value::Preempted.notice(bad),
                    Err(NoticeError::Malformed { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn only_a_terminating_maintenance_is_a_notice() {
        let n = Value::Maintenance
            .notice("TERMINATE_ON_HOST_MAINTENANCE")
            .unwrap()
            .unwrap();
        assert_eq!(n.kind, NoticeKind::HostMaintenance);
        for none in ["NONE", "MIGRATE_ON_HOST_MAINTENANCE", "SOMETHING_NEW"] {
            assert_eq!(Value::Maintenance.notice(none).unwrap(), None, "{none}");
        }
        for bad in ["<html>not json", ""] {
            assert!(
                matches!(
                    Value::Maintenance.notice(bad),
                    Err(NoticeError::Malformed { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_host_setting_is_a_host_and_port() {
        assert_eq!(base_url("127.0.0.1:8080").unwrap(), "http://127.0.0.1:8080");
        assert_eq!(
            base_url("metadata.google.internal").unwrap(),
            "http://metadata.google.internal"
        );
        for bad in ["", "http://x", "a/b", "x y"] {
            assert!(
                matches!(base_url(bad), Err(NoticeError::Config(_))),
                "{bad}"
            );
        }
    }
}
