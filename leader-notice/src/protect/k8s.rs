//! Kubernetes: the pod deletion cost of this pod.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use tracing::debug;

use super::Protector;
use crate::NoticeError;
use crate::http::{prefix, send};

const SERVICE: &str = "kubernetes";

/// The annotation a ReplicaSet reads to choose which pods to delete first on a scale-down.
const ANNOTATION: &str = "controller.kubernetes.io/pod-deletion-cost";

/// The leader's deletion cost: the largest the annotation takes (an `int32`).
///
/// On a scale-down the ReplicaSet controller deletes the pods of lowest cost first (among pods
/// of the same readiness and placement); a pod without the annotation costs 0. The largest
/// value puts the leader behind every other pod whatever costs others use, unless another
/// pod has this value too. Clearing removes the annotation (cost 0 again) rather than writing
/// a low value, so the pod goes back to exactly what it was before it led.
const LEADER_COST: &str = "2147483647";

/// Where the service account's files are mounted, unless `LEADER_K8S_SERVICEACCOUNT_DIR` says.
const DEFAULT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// How long one PATCH may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// This pod, through the Kubernetes API with its service account.
pub(crate) struct PodProtector {
    http: reqwest::Client,
    /// `https://HOST:PORT/api/v1/namespaces/NS/pods/NAME`.
    url: String,
    /// Read again at each call: projected service-account tokens rotate.
    token_file: PathBuf,
    namespace: String,
    pod: String,
}

impl PodProtector {
    /// The protector of this pod: the API server from `KUBERNETES_SERVICE_HOST` and
    /// `KUBERNETES_SERVICE_PORT` (443 if unset), the service account's `token`, `ca.crt` and
    /// `namespace` from `LEADER_K8S_SERVICEACCOUNT_DIR` (default
    /// `/var/run/secrets/kubernetes.io/serviceaccount`), the pod's name from `POD_NAME` (set it
    /// with the downward API, `fieldRef: metadata.name`), else the host name.
    ///
    /// # Errors
    /// [`NoticeError::Config`] naming the setting or file that is missing or wrong.
    pub(crate) fn discover() -> Result<Self, NoticeError> {
        let host = var("KUBERNETES_SERVICE_HOST").ok_or_else(|| {
            NoticeError::Config(
                "KUBERNETES_SERVICE_HOST is not set: protection on k8s runs in a pod (the \
                 kubelet sets it)"
                    .to_owned(),
            )
        })?;
        let port = var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|| "443".to_owned());
        if port.parse::<u16>().is_err() {
            return Err(NoticeError::Config(format!(
                "KUBERNETES_SERVICE_PORT={port:?} is not a port number"
            )));
        }
        let dir = var("LEADER_K8S_SERVICEACCOUNT_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DIR));
        let token_file = dir.join("token");
        read_token(&token_file)?;
        let ca = std::fs::read(dir.join("ca.crt")).map_err(|e| missing(&dir, "ca.crt", &e))?;
        let http = crate::http::api_client(Some(&ca))?;
        let namespace = std::fs::read_to_string(dir.join("namespace"))
            .map_err(|e| missing(&dir, "namespace", &e))?
            .trim()
            .to_owned();
        check_name(
            "the namespace (service account's namespace file)",
            &namespace,
        )?;
        let pod = pod_name()?;
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        let url = format!("https://{host}:{port}/api/v1/namespaces/{namespace}/pods/{pod}");
        debug!(%url, "Kubernetes pod protector");
        Ok(Self {
            http,
            url,
            token_file,
            namespace,
            pod,
        })
    }
}

#[async_trait]
impl Protector for PodProtector {
    fn describe(&self) -> String {
        format!("pod {}/{}", self.namespace, self.pod)
    }

    async fn set(&self, protected: bool) -> Result<(), NoticeError> {
        let token = read_token(&self.token_file)?;
        let what = format!("PATCH pod {}/{}", self.namespace, self.pod);
        let request = self
            .http
            .patch(&self.url)
            .timeout(CALL_TIMEOUT)
            .bearer_auth(token)
            .header("content-type", "application/merge-patch+json")
            .header("accept", "application/json")
            .body(patch(protected).to_string());
        let reply = send(SERVICE, &what, request).await?;
        if reply.status.as_u16() == 404 {
            return Err(NoticeError::Config(format!(
                "{what}: no such pod (404): set POD_NAME to the pod's name with the downward \
                 API (fieldRef: metadata.name) if the host name is not it; the answer: {}",
                prefix(&reply.body)
            )));
        }
        let needs = format!(
            "the pod's service account needs RBAC permission to patch pods in namespace {} \
             (a Role with verbs [patch] on resources [pods], bound to it); a 401 means its \
             token was not accepted",
            self.namespace
        );
        reply.success(SERVICE, &what, &needs)?;
        Ok(())
    }
}

/// The merge patch that sets (`true`) or removes (`false`) the leader's deletion cost.
fn patch(protected: bool) -> serde_json::Value {
    let value = if protected {
        serde_json::Value::String(LEADER_COST.to_owned())
    } else {
        serde_json::Value::Null
    };
    serde_json::json!({ "metadata": { "annotations": { ANNOTATION: value } } })
}

/// A setting, trimmed; `None` if unset or blank.
fn var(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// This pod's name: `POD_NAME`, else the host name (a pod's host name is its name unless the
/// pod sets `hostname`).
fn pod_name() -> Result<String, NoticeError> {
    let (pod, from) = match var("POD_NAME") {
        Some(pod) => (pod, "POD_NAME"),
        None => (
            gethostname::gethostname()
                .to_string_lossy()
                .trim()
                .to_owned(),
            "the host name (POD_NAME is not set)",
        ),
    };
    check_name(&format!("the pod name from {from}"), &pod)?;
    Ok(pod)
}

/// A namespace or pod name must be a DNS name: it goes into the request's path.
fn check_name(what: &str, name: &str) -> Result<(), NoticeError> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(NoticeError::Config(format!(
            "{what} is {name:?}, not a Kubernetes name (lower-case letters, digits, '-', '.'); \
             set POD_NAME with the downward API"
        )))
    }
}

/// The service account's token, read now.
fn read_token(file: &Path) -> Result<String, NoticeError> {
    let token = std::fs::read_to_string(file).map_err(|e| {
        NoticeError::Config(format!(
            "cannot read the service account token {}: {e} (is a service account token \
             mounted? automountServiceAccountToken must not be false)",
            file.display()
        ))
    })?;
    let token = token.trim();
    if token.is_empty() {
        return Err(NoticeError::Config(format!(
            "the service account token {} is empty",
            file.display()
        )));
    }
    Ok(token.to_owned())
}

fn missing(dir: &Path, file: &str, e: &std::io::Error) -> NoticeError {
    NoticeError::Config(format!(
        "cannot read the service account's {file} in {} (set LEADER_K8S_SERVICEACCOUNT_DIR \
         if it is mounted elsewhere): {e}",
        dir.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_patch_sets_the_largest_cost_or_removes_it() {
        assert_eq!(
            patch(true).to_string(),
            r#"{"metadata":{"annotations":{"controller.kubernetes.io/pod-deletion-cost":"2147483647"}}}"#
        );
        assert_eq!(
            patch(false).to_string(),
            r#"{"metadata":{"annotations":{"controller.kubernetes.io/pod-deletion-cost":null}}}"#
        );
        assert_eq!(LEADER_COST.parse::<i32>().unwrap(), i32::MAX);
    }

    #[test]
    fn names_that_could_change_the_path_are_refused() {
        assert!(check_name("pod", "web-7d9f8-abcde").is_ok());
        assert!(check_name("pod", "a.b-c").is_ok());
        for bad in ["", "../secrets", "a/b", "Web", "a b", "a?b"] {
            assert!(
                matches!(check_name("the pod name", bad), Err(NoticeError::Config(m)) if m.contains("the pod name")),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_missing_or_empty_token_says_which_file() {
        let dir = std::env::temp_dir().join(format!("leader-notice-k8s-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        let e = read_token(&file).unwrap_err();
        assert!(e.to_string().contains("token"), "{e}");
        std::fs::write(&file, "\n").unwrap();
        assert!(read_token(&file).unwrap_err().to_string().contains("empty"));
        std::fs::write(&file, "abc\n").unwrap();
        assert_eq!(read_token(&file).unwrap(), "abc");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
