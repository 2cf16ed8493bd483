//! Azure Instance Metadata Service: Scheduled Events for this VM, its identity (for the
//! scale-set protection), and its managed identity's ARM token.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use tracing::{debug, info};

use crate::http::{self, Reply};
use crate::{Cloud, Notice, NoticeError, NoticeKind, Source};

const SERVICE: &str = "azure";

/// The setting that moves the metadata service (tests); the default is Azure's.
const ENDPOINT_VAR: &str = "LEADER_AZURE_IMDS_ENDPOINT";
const DEFAULT_ENDPOINT: &str = "http://169.254.169.254";

const EVENTS: &str = "/metadata/scheduledevents?api-version=2020-07-01";
const NAME: &str = "/metadata/instance/compute/name?api-version=2021-02-01&format=text";
const COMPUTE: &str = "/metadata/instance/compute?api-version=2021-02-01";
const INSTANCE: &str = "/metadata/instance?api-version=2021-02-01";
const TOKEN: &str = "/metadata/identity/oauth2/token?api-version=2018-02-01";
/// The resource of an ARM token (the trailing slash is part of it).
const ARM_RESOURCE: &str = "https://management.azure.com/";

/// The first Scheduled Events call enrols the VM and may take up to two minutes.
const ENROL_TIMEOUT: Duration = Duration::from_secs(150);
/// Any other call.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// `present()`: one quick call.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Azure recommends a look every second.
const PAUSE: Duration = Duration::from_secs(1);

/// The metadata service's base URL, from `LEADER_AZURE_IMDS_ENDPOINT` (default
/// `http://169.254.169.254`), without a trailing slash.
///
/// # Errors
/// [`NoticeError::Config`] if the setting is not an http(s) URL.
pub(crate) fn imds_endpoint() -> Result<String, NoticeError> {
    let endpoint = std::env::var(ENDPOINT_VAR).unwrap_or_else(|_| DEFAULT_ENDPOINT.to_owned());
    parse_endpoint(&endpoint)
}

fn parse_endpoint(endpoint: &str) -> Result<String, NoticeError> {
    match url::Url::parse(endpoint) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.has_host() => {
            Ok(endpoint.trim_end_matches('/').to_owned())
        }
        _ => Err(NoticeError::Config(format!(
            "{ENDPOINT_VAR}={endpoint:?} is not an http(s) URL (e.g. {DEFAULT_ENDPOINT})"
        ))),
    }
}

/// A GET on the metadata service (header `Metadata: true`), the reply if it is 2xx.
async fn imds_get(
    client: &reqwest::Client,
    base: &str,
    path: &str,
    timeout: Duration,
) -> Result<Reply, NoticeError> {
    let what = format!("IMDS GET {}", path_only(path));
    let request = client
        .get(format!("{base}{path}"))
        .header("Metadata", "true")
        .timeout(timeout);
    http::send(SERVICE, &what, request).await?.success(
        SERVICE,
        &what,
        "the metadata service refused the request",
    )
}

/// A path without its query, for messages.
fn path_only(path: &str) -> &str {
    path.split('?').next().unwrap_or(path)
}

/// This VM as the metadata service describes it (the fields the scale-set protection needs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Compute {
    /// The subscription's id.
    pub(crate) subscription_id: String,
    /// The resource group of the VM (and of its scale set).
    pub(crate) resource_group_name: String,
    /// The scale set's name; empty if the VM is in none.
    pub(crate) vm_scale_set_name: String,
    /// The VM's name (`{scale set}_{instance id}` in a uniform scale set).
    pub(crate) name: String,
    /// The instance id in a uniform scale set (`3` of `web_3`); `None` outside a scale set or
    /// in a flexible one (whose VM names carry no instance id).
    pub(crate) instance_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ComputeDoc {
    #[serde(default)]
    subscription_id: String,
    #[serde(default)]
    resource_group_name: String,
    #[serde(default)]
    vm_scale_set_name: String,
    name: String,
}

/// Parses `/metadata/instance/compute`.
fn parse_compute(body: &str) -> Result<Compute, NoticeError> {
    let doc: ComputeDoc = http::parse_json(SERVICE, "IMDS GET instance/compute", body)?;
    let instance_id = uniform_instance_id(&doc.vm_scale_set_name, &doc.name);
    Ok(Compute {
        subscription_id: doc.subscription_id,
        resource_group_name: doc.resource_group_name,
        vm_scale_set_name: doc.vm_scale_set_name,
        name: doc.name,
        instance_id,
    })
}

/// The instance id of a uniform scale set's VM named `{vmss}_{id}`.
fn uniform_instance_id(vmss: &str, name: &str) -> Option<String> {
    if vmss.is_empty() {
        return None;
    }
    let id = name.strip_prefix(vmss)?.strip_prefix('_')?;
    (!id.is_empty() && id.bytes().all(|b| b.is_ascii_digit())).then(|| id.to_owned())
}

/// This VM's subscription, resource group, scale set, name and instance id.
///
/// # Errors
/// The metadata service's error (not on Azure: [`NoticeError::Unavailable`]).
pub(crate) async fn compute() -> Result<Compute, NoticeError> {
    let base = imds_endpoint()?;
    let client = http::metadata_client(CALL_TIMEOUT)?;
    let reply = imds_get(&client, &base, COMPUTE, CALL_TIMEOUT).await?;
    parse_compute(&reply.body)
}

#[derive(Deserialize)]
struct TokenDoc {
    access_token: String,
}

/// A token of this VM's managed identity for Azure Resource Manager
/// (`https://management.azure.com/`); a user-assigned identity is chosen with
/// `AZURE_CLIENT_ID`. Never log it.
///
/// # Errors
/// [`NoticeError::Config`] if the VM has no managed identity (or not the one chosen); the
/// metadata service's error otherwise.
pub(crate) async fn arm_token() -> Result<String, NoticeError> {
    let base = imds_endpoint()?;
    let client = http::metadata_client(CALL_TIMEOUT)?;
    let mut url = url::Url::parse(&format!("{base}{TOKEN}"))
        .map_err(|e| NoticeError::Config(format!("{ENDPOINT_VAR}: {e}")))?;
    url.query_pairs_mut().append_pair("resource", ARM_RESOURCE);
    if let Ok(client_id) = std::env::var("AZURE_CLIENT_ID")
        && !client_id.is_empty()
    {
        url.query_pairs_mut().append_pair("client_id", &client_id);
    }
    let what = "IMDS GET identity/oauth2/token";
    let request = client.get(url).header("Metadata", "true");
    let reply = http::send(SERVICE, what, request).await?;
    if reply.status == reqwest::StatusCode::BAD_REQUEST {
        // Azure answers 400 "Identity not found" when the VM has no managed identity.
        return Err(NoticeError::Config(format!(
            "azure: {what}: no managed identity token ({}): assign a managed identity to the \
             VM (scale set), or set AZURE_CLIENT_ID to the user-assigned one to use",
            http::prefix(&reply.body)
        )));
    }
    // The body of a successful reply holds the token: never put it in a message.
    let reply = reply.success(SERVICE, what, "the managed identity endpoint refused")?;
    let doc: TokenDoc = serde_json::from_str(&reply.body).map_err(|e| NoticeError::Malformed {
        service: SERVICE,
        message: format!("{what}: the token answer is not the expected JSON ({e})"),
    })?;
    Ok(doc.access_token)
}

/// `/metadata/scheduledevents`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct EventsDoc {
    #[serde(default)]
    document_incarnation: u64,
    #[serde(default)]
    events: Vec<Event>,
}

/// One scheduled event.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Event {
    event_id: String,
    event_type: String,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    event_status: String,
    #[serde(default)]
    not_before: String,
}

/// The notice kind of an event type. Only the two that take the machine away for good count:
/// `Freeze` is a pause of seconds, and after a `Reboot` or `Redeploy` the machine comes back
/// (the OS shutdown's SIGTERM hands over; a notice would end campaigning for good); unknown
/// types are none too.
fn kind_of(event_type: &str) -> Option<NoticeKind> {
    match event_type {
        "Preempt" => Some(NoticeKind::Preempt),
        "Terminate" => Some(NoticeKind::Terminate),
        _ => None,
    }
}

/// The first notice for VM `own` in a Scheduled Events document.
///
/// # Errors
/// [`NoticeError::Malformed`] if the document does not parse.
fn events_notice(body: &str, own: &str) -> Result<Option<Notice>, NoticeError> {
    let doc: EventsDoc = http::parse_json(SERVICE, "IMDS GET scheduledevents", body)?;
    debug!(
        incarnation = doc.document_incarnation,
        events = doc.events.len(),
        "scheduled events"
    );
    for event in doc.events {
        let names_own = event.resources.iter().any(|r| r.eq_ignore_ascii_case(own));
        let Some(kind) = kind_of(&event.event_type) else {
            continue;
        };
        if !names_own {
            continue;
        }
        let only_this_instance = event.resources.len() == 1;
        let detail = format!(
            "{} {} ({}, not before {:?}, resources {})",
            event.event_type,
            event.event_id,
            event.event_status,
            event.not_before,
            event.resources.join(",")
        );
        return Ok(Some(Notice {
            cloud: Cloud::Azure,
            kind,
            detail,
            event_id: Some(event.event_id),
            only_this_instance,
        }));
    }
    Ok(None)
}

/// Watches this VM's Azure Scheduled Events.
pub(crate) struct ScheduledEvents {
    client: reqwest::Client,
    base: String,
    /// This VM's name, read at the first look that could.
    own: Option<String>,
    /// Whether a Scheduled Events call succeeded (the VM is enrolled; later calls are quick).
    enrolled: bool,
    /// The events approved already: each at most once.
    approved: Mutex<HashSet<String>>,
}

impl ScheduledEvents {
    /// The source, at `LEADER_AZURE_IMDS_ENDPOINT` (default `http://169.254.169.254`).
    ///
    /// # Errors
    /// [`NoticeError::Config`] if the setting is not an http(s) URL.
    pub(crate) fn from_env() -> Result<Self, NoticeError> {
        Ok(Self {
            client: http::metadata_client(CALL_TIMEOUT)?,
            base: imds_endpoint()?,
            own: None,
            enrolled: false,
            approved: Mutex::new(HashSet::new()),
        })
    }

    /// This VM's name, read once.
    async fn own_name(&mut self) -> Result<String, NoticeError> {
        if let Some(own) = &self.own {
            return Ok(own.clone());
        }
        let reply = imds_get(&self.client, &self.base, NAME, CALL_TIMEOUT).await?;
        let name = reply.body.trim();
        if name.is_empty() || name.contains(|c: char| c.is_whitespace() || c == '<') {
            return Err(http::malformed(
                SERVICE,
                "IMDS GET compute/name",
                "not a VM name",
                name,
            ));
        }
        info!(vm = name, "watching Azure Scheduled Events for this VM");
        self.own = Some(name.to_owned());
        Ok(name.to_owned())
    }

    fn mark_approved(&self, id: &str) -> bool {
        match self.approved.lock() {
            Ok(mut set) => set.insert(id.to_owned()),
            Err(poisoned) => poisoned.into_inner().insert(id.to_owned()),
        }
    }

    fn unmark_approved(&self, id: &str) {
        match self.approved.lock() {
            Ok(mut set) => set.remove(id),
            Err(poisoned) => poisoned.into_inner().remove(id),
        };
    }
}

#[async_trait]
impl Source for ScheduledEvents {
    fn cloud(&self) -> Cloud {
        Cloud::Azure
    }

    async fn present(&self) -> bool {
        let Ok(reply) = imds_get(&self.client, &self.base, INSTANCE, PROBE_TIMEOUT).await else {
            return false;
        };
        serde_json::from_str::<serde_json::Value>(&reply.body)
            .is_ok_and(|v| v.get("compute").is_some_and(serde_json::Value::is_object))
    }

    async fn look(&mut self) -> Result<Option<Notice>, NoticeError> {
        // The events first, even without the name: the first call enrols the VM.
        let timeout = if self.enrolled {
            CALL_TIMEOUT
        } else {
            ENROL_TIMEOUT
        };
        let reply = imds_get(&self.client, &self.base, EVENTS, timeout).await?;
        self.enrolled = true;
        let own = self.own_name().await?;
        events_notice(&reply.body, &own)
    }

    fn pause(&self) -> Duration {
        PAUSE
    }

    async fn approve(&self, notice: &Notice) -> Result<bool, NoticeError> {
        let Some(id) = notice.event_id.as_deref() else {
            return Ok(false);
        };
        if notice.cloud != Cloud::Azure || !notice.only_this_instance {
            // Approving an event of several machines would release the others too.
            return Ok(false);
        }
        if !self.mark_approved(id) {
            return Ok(false);
        }
        let body = serde_json::json!({ "StartRequests": [{ "EventId": id }] }).to_string();
        let what = "IMDS POST scheduledevents (StartRequests)";
        let request = self
            .client
            .post(format!("{}{EVENTS}", self.base))
            .header("Metadata", "true")
            .header("Content-Type", "application/json")
            .body(body);
        let sent = http::send(SERVICE, what, request)
            .await
            .and_then(|r| r.success(SERVICE, what, "the metadata service refused the approval"));
        match sent {
            Ok(_) => {
                info!(event = id, kind = %notice.kind, "approved this VM's scheduled event: the platform may go ahead now");
                Ok(true)
            }
            Err(e) => {
                self.unmark_approved(id);
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn doc(events: &str) -> String {
        format!(r#"{{"DocumentIncarnation":3,"Events":[{events}]}}"#)
    }

    fn event(id: &str, kind: &str, resources: &[&str]) -> String {
        serde_json::json!({
            "EventId": id, "EventType": kind, "ResourceType": "VirtualMachine",
            "Resources": resources, "EventStatus": "Scheduled",
            "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT", "Description": "",
            "EventSource": "Platform", "DurationInSeconds": -1
        })
        .to_string()
    }

    #[test]
    fn event_types_map_to_kinds_and_freeze_is_none() {
        for (t, k) in [
            ("Preempt", NoticeKind::Preempt),
            ("Terminate", NoticeKind::Terminate),
        ] {
            let n = events_notice(&doc(&event("E1", t, &["vmss_0"])), "vmss_0")
                .unwrap()
                .unwrap();
            assert_eq!(n.kind, k, "{t}");
            assert_eq!(n.cloud, Cloud::Azure);
            assert_eq!(n.event_id.as_deref(), Some("E1"));
            assert!(n.only_this_instance);
            assert!(n.detail.contains(t), "{}", n.detail);
        }
        for t in ["Freeze", "Reboot", "Redeploy"] {
            let back = doc(&event("E2", t, &["vmss_0"]));
            assert_eq!(events_notice(&back, "vmss_0").unwrap(), None, "{t}");
        }
    }

    #[test]
    fn another_vms_event_is_ignored_and_a_shared_one_is_not_only_ours() {
        let other = doc(&event("E1", "Terminate", &["vmss_1"]));
        assert_eq!(events_notice(&other, "vmss_0").unwrap(), None);
        let shared = doc(&event("E2", "Preempt", &["vmss_1", "VMSS_0"]));
        let n = events_notice(&shared, "vmss_0").unwrap().unwrap();
        assert_eq!(n.event_id.as_deref(), Some("E2"));
        assert!(!n.only_this_instance);
    }

    #[test]
    fn the_first_event_for_this_vm_counts() {
        let body = doc(&format!(
            "{},{},{}",
            event("E1", "Freeze", &["vmss_0"]),
            event("E2", "Terminate", &["vmss_9"]),
            event("E3", "Preempt", &["vmss_0"])
        ));
        let n = events_notice(&body, "vmss_0").unwrap().unwrap();
        assert_eq!(n.event_id.as_deref(), Some("E3"));
        assert_eq!(n.kind, NoticeKind::Preempt);
    }

    #[test]
    fn no_events_and_garbage() {
        assert_eq!(events_notice(&doc(""), "vmss_0").unwrap(), None);
        assert_eq!(
            events_notice(r#"{"DocumentIncarnation":0,"Events":[]}"#, "vmss_0").unwrap(),
            None
        );
        assert!(matches!(
            events_notice("<html>not json", "vmss_0"),
            Err(NoticeError::Malformed {
                service: "azure",
                ..
            })
        ));
    }

    #[test]
    fn compute_gives_the_instance_id_of_a_uniform_scale_set() {
        let c = parse_compute(
            r#"{"name":"web_12","vmScaleSetName":"web","subscriptionId":"s","resourceGroupName":"rg","location":"x"}"#,
        )
        .unwrap();
        assert_eq!(c.instance_id.as_deref(), Some("12"));
        assert_eq!(c.subscription_id, "s");
        assert_eq!(c.resource_group_name, "rg");
        assert_eq!(c.vm_scale_set_name, "web");
        assert_eq!(c.name, "web_12");
        let single = parse_compute(r#"{"name":"vm1","vmScaleSetName":""}"#).unwrap();
        assert_eq!(single.instance_id, None);
        assert_eq!(uniform_instance_id("web", "web_abc123"), None);
        assert_eq!(uniform_instance_id("web", "webx_1"), None);
        assert_eq!(uniform_instance_id("web", "web_"), None);
        assert!(parse_compute("<html>").is_err());
    }

    #[test]
    fn the_endpoint_must_be_a_url() {
        assert_eq!(
            parse_endpoint("http://127.0.0.1:9/").unwrap(),
            "http://127.0.0.1:9"
        );
        assert!(matches!(
            parse_endpoint("169.254.169.254"),
            Err(NoticeError::Config(_))
        ));
    }
}
