//! Azure: `protectionPolicy.protectFromScaleIn` on this VM of its scale set, through ARM with
//! the VM's managed identity.

use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Mutex;
use tokio::time::Instant;
use tracing::debug;
use url::Url;

use super::Protector;
use crate::NoticeError;
use crate::http::send;

const SERVICE: &str = "azure";

/// The setting that moves ARM (tests, sovereign clouds); the default is Azure's public cloud.
const ARM_VAR: &str = "LEADER_AZURE_ARM_ENDPOINT";
const DEFAULT_ARM: &str = "https://management.azure.com";

/// The first Compute API version that writes the protection of a Flexible scale set's VMs too.
const API_VERSION: &str = "2023-09-01";

/// How long one PUT may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a managed identity token is used before the metadata service is asked again. It
/// caches the token itself and hands out the same one until close to its expiry (tokens last
/// hours), so asking every few minutes keeps ours fresh without reading its lifetime; a 401
/// drops it at once.
const TOKEN_REUSE: Duration = Duration::from_secs(300);

/// What a refused PUT lacks.
const NEEDS: &str = "the VM's managed identity needs \
    Microsoft.Compute/virtualMachineScaleSets/virtualMachines/write on the scale set (e.g. the \
    Virtual Machine Contributor role); set AZURE_CLIENT_ID to choose a user-assigned identity";

/// This VM in its scale set.
pub(crate) struct VmssProtector {
    http: reqwest::Client,
    /// `{arm}/subscriptions/S/resourceGroups/RG/providers/Microsoft.Compute/
    /// virtualMachineScaleSets/VMSS/virtualMachines/ID?api-version=...`.
    url: Url,
    described: String,
    /// The ARM token and when it was fetched.
    token: Mutex<Option<(String, Instant)>>,
}

impl VmssProtector {
    /// The protector of this VM: its subscription, resource group, scale set and instance id
    /// from the metadata service (`LEADER_AZURE_IMDS_ENDPOINT`), ARM at
    /// `LEADER_AZURE_ARM_ENDPOINT` (default `https://management.azure.com`).
    ///
    /// # Errors
    /// [`NoticeError::Config`] if this VM is in no scale set or a setting is wrong; the
    /// metadata service's error.
    pub(crate) async fn discover() -> Result<Self, NoticeError> {
        let compute = crate::azure::compute().await?;
        if compute.vm_scale_set_name.is_empty() {
            return Err(NoticeError::Config(format!(
                "VM {} is not in a virtual machine scale set (the metadata service's \
                 vmScaleSetName is empty): protection on azure needs one",
                compute.name
            )));
        }
        // A Flexible scale set's VMs are addressed by their name.
        let instance = compute
            .instance_id
            .clone()
            .unwrap_or_else(|| compute.name.clone());
        let arm = std::env::var(ARM_VAR).unwrap_or_else(|_| DEFAULT_ARM.to_owned());
        let url = vm_url(
            &arm,
            &compute.subscription_id,
            &compute.resource_group_name,
            &compute.vm_scale_set_name,
            &instance,
        )?;
        debug!(%url, "Azure scale set protector");
        Ok(Self {
            http: crate::http::api_client(None)?,
            url,
            described: format!(
                "VM {} (instance {instance}) of scale set {} in resource group {}",
                compute.name, compute.vm_scale_set_name, compute.resource_group_name
            ),
            token: Mutex::new(None),
        })
    }

    /// The ARM token: the one held if it is fresh, else a new one from the metadata service.
    async fn token(&self) -> Result<String, NoticeError> {
        let mut held = self.token.lock().await;
        if let Some((token, at)) = held.as_ref()
            && at.elapsed() < TOKEN_REUSE
        {
            return Ok(token.clone());
        }
        let token = crate::azure::arm_token().await?;
        *held = Some((token.clone(), Instant::now()));
        Ok(token)
    }
}

#[async_trait]
impl Protector for VmssProtector {
    fn describe(&self) -> String {
        self.described.clone()
    }

    async fn set(&self, protected: bool) -> Result<(), NoticeError> {
        let token = self.token().await?;
        let what = format!(
            "ARM PUT protectFromScaleIn={protected} on {}",
            self.described
        );
        let request = self
            .http
            .put(self.url.clone())
            .timeout(CALL_TIMEOUT)
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body(body(protected).to_string());
        let reply = send(SERVICE, &what, request).await?;
        if reply.status.as_u16() == 401 {
            // Expired or revoked: the next call asks for a new one.
            *self.token.lock().await = None;
        }
        reply.success(SERVICE, &what, NEEDS)?;
        Ok(())
    }
}

/// The body of the PUT. Only `protectFromScaleIn`: `protectFromScaleSetActions` would also
/// block upgrades and reimages, and a mark left behind would then hold back every rollout.
fn body(protected: bool) -> serde_json::Value {
    serde_json::json!({
        "properties": { "protectionPolicy": { "protectFromScaleIn": protected } }
    })
}

/// The ARM URL of a scale set's VM.
fn vm_url(
    arm: &str,
    subscription: &str,
    group: &str,
    vmss: &str,
    instance: &str,
) -> Result<Url, NoticeError> {
    let bad = |why: String| NoticeError::Config(format!("{ARM_VAR}={arm:?} {why}"));
    let mut url = Url::parse(arm.trim()).map_err(|e| bad(format!("does not parse: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || !url.has_host() {
        return Err(bad("is not an http(s) URL".to_owned()));
    }
    for (what, value) in [
        ("subscriptionId", subscription),
        ("resourceGroupName", group),
        ("vmScaleSetName", vmss),
        ("the instance id", instance),
    ] {
        if value.trim().is_empty() {
            return Err(NoticeError::Config(format!(
                "the metadata service gave no {what} for this VM"
            )));
        }
    }
    url.path_segments_mut()
        .map_err(|()| bad("cannot hold a path".to_owned()))?
        .pop_if_empty()
        .extend([
            "subscriptions",
            subscription,
            "resourceGroups",
            group,
            "providers",
            "Microsoft.Compute",
            "virtualMachineScaleSets",
            vmss,
            "virtualMachines",
            instance,
        ]);
    url.query_pairs_mut()
        .append_pair("api-version", API_VERSION);
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_sets_scale_in_protection_only() {
        assert_eq!(
            body(true).to_string(),
            r#"{"properties":{"protectionPolicy":{"protectFromScaleIn":true}}}"#
        );
        assert_eq!(
            body(false).to_string(),
            r#"{"properties":{"protectionPolicy":{"protectFromScaleIn":false}}}"#
        );
    }

    #[test]
    fn the_url_names_the_vm_of_the_scale_set() {
        let url = vm_url("https://management.azure.com/", "sub", "rg", "web", "3").unwrap();
        assert_eq!(
            url.as_str(),
            "https://management.azure.com/subscriptions/sub/resourceGroups/rg/providers/\
             Microsoft.Compute/virtualMachineScaleSets/web/virtualMachines/3?api-version=2023-09-01"
        );
        // Odd characters stay inside their segment.
        let url = vm_url("http://127.0.0.1:8080", "s", "r g", "a/b", "web_1").unwrap();
        assert!(
            url.path()
                .ends_with("/virtualMachineScaleSets/a%2Fb/virtualMachines/web_1"),
            "{url}"
        );
        assert!(url.path().contains("/resourceGroups/r%20g/"), "{url}");
        for bad in ["management.azure.com", "ftp://x", "not a url"] {
            assert!(
                matches!(vm_url(bad, "s", "r", "v", "1"), Err(NoticeError::Config(m)) if m.contains(ARM_VAR)),
                "{bad}"
            );
        }
        assert!(
            matches!(vm_url(DEFAULT_ARM, "s", "", "v", "1"), Err(NoticeError::Config(m)) if m.contains("resourceGroupName"))
        );
    }
}
