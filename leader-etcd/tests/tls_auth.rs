//! `https://` endpoints against the test etcd's TLS listener (a certificate of the throwaway test
//! CA that `scripts/emulators` generates), and what a client that does not trust it is told.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod support;

use std::sync::Arc;

use leader_core::{Acquisition, ErrorKind, HolderId, LeaseBackend, LeaseClient};
use leader_etcd::EtcdStore;
use support::Prefix;

/// The test etcd's HTTPS endpoint and the CA file that signed its certificate; `None` to skip
/// outside `scripts/emulators` (Docker's `env.sh` has no HTTPS setup).
fn https() -> Option<(String, String)> {
    let tls = integration_tests::tls::require_tls()?;
    Some((tls.etcd, tls.ca_file.display().to_string()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_over_https_with_a_private_ca() {
    let Some((endpoint, ca)) = https() else {
        return;
    };
    let p = Prefix::new();
    let store = EtcdStore::builder()
        .with_endpoint(&endpoint)
        .with_ca_file(&ca)
        .with_prefix(&p.prefix)
        .build()
        .await
        .unwrap();
    let backend: Arc<dyn LeaseBackend> = Arc::new(store);
    let mut c = LeaseClient::new(
        backend,
        p.unique_key(),
        HolderId::new("tls").unwrap(),
        support::timing(),
    )
    .unwrap();
    assert!(matches!(
        c.try_acquire().await.unwrap(),
        Acquisition::Acquired(_)
    ));
    assert!(c.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_certificate_is_a_configuration_error_that_names_the_fix() {
    let Some((endpoint, _)) = https() else {
        return;
    };
    let err = EtcdStore::builder()
        .with_endpoint(&endpoint)
        .with_connect_timeout(std::time::Duration::from_secs(2))
        .build()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    let text = err.to_string();
    assert!(
        text.contains("certificate") && text.contains("LEADER_ETCD_CA_FILE"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_ca_file_is_a_configuration_error() {
    let Some((endpoint, _)) = https() else {
        return;
    };
    let err = EtcdStore::builder()
        .with_endpoint(&endpoint)
        .with_ca_file("/nonexistent/ca.pem")
        .build()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
}

/// The auth-enabled test server (`None` to skip, as [`https`]), with a user `leader-runner` whose role may read and write
/// under `allowed/`, and a user `outsider` with no role (created once; later calls find them).
async fn auth_server() -> Option<String> {
    use integration_tests::etcd::{EtcdRaw, b64};
    let tls = integration_tests::tls::require_tls()?;
    let endpoint = tls.etcd_auth;
    let root = EtcdRaw::authenticated(&endpoint, "root", &tls.etcd_root_password)
        .await
        .unwrap();
    let steps = [
        ("auth/role/add", serde_json::json!({"name": "leases"})),
        (
            "auth/role/grant",
            serde_json::json!({"name": "leases", "perm": {
                "permType": "READWRITE", "key": b64("allowed/"), "range_end": b64("allowed0")}}),
        ),
        (
            "auth/user/add",
            serde_json::json!({"name": "leader-runner", "password": "runner-pw"}),
        ),
        (
            "auth/user/grant",
            serde_json::json!({"user": "leader-runner", "role": "leases"}),
        ),
        (
            "auth/user/add",
            serde_json::json!({"name": "outsider", "password": "outsider-pw"}),
        ),
    ];
    for (path, body) in steps {
        if let Err(e) = root.post(path, body).await {
            assert!(
                e.contains("already exists") || e.contains("already granted"),
                "{path}: {e}"
            );
        }
    }
    Some(endpoint)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_with_readwrite_on_the_prefix_can_lead() {
    let Some(endpoint) = auth_server().await else {
        return;
    };
    let prefix = format!("allowed/{}/", integration_tests::unique_name("auth"));
    let store = EtcdStore::builder()
        .with_endpoint(&endpoint)
        .with_user("leader-runner", "runner-pw")
        .with_prefix(&prefix)
        .build()
        .await
        .unwrap();
    let backend: Arc<dyn LeaseBackend> = Arc::new(store.clone());
    let key = leader_core::conformance::unique_key("auth").unwrap();
    let mut c = LeaseClient::new(
        backend,
        key.clone(),
        HolderId::new("a").unwrap(),
        support::timing(),
    )
    .unwrap();
    let Acquisition::Acquired(grant) = c.try_acquire().await.unwrap() else {
        panic!("a fresh key must be free");
    };
    assert!(matches!(
        c.renew().await.unwrap(),
        leader_core::Renewal::Renewed(_)
    ));
    let fence = leader_core::backend::Fence::new(key, c.holder().clone(), grant.token);
    let object = leader_core::ObjectName::new("report").unwrap();
    leader_core::FencedStore::fenced_write(&store, &fence, &object, b"done")
        .await
        .unwrap();
    assert!(c.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_or_missing_credentials_and_missing_permissions_are_clear_errors() {
    let Some(endpoint) = auth_server().await else {
        return;
    };
    let build = |user: Option<(&str, &str)>, prefix: &str| {
        let mut b = EtcdStore::builder()
            .with_endpoint(&endpoint)
            .with_prefix(prefix);
        if let Some((u, p)) = user {
            b = b.with_user(u, p);
        }
        b.build()
    };
    let wrong = build(Some(("leader-runner", "nope")), "allowed/")
        .await
        .unwrap_err();
    assert_eq!(wrong.kind(), ErrorKind::Unauthenticated, "{wrong}");
    assert!(
        wrong.to_string().contains("user name and password"),
        "{wrong}"
    );
    let none = build(None, "allowed/").await.unwrap_err();
    assert_eq!(none.kind(), ErrorKind::Unauthenticated, "{none}");
    assert!(none.to_string().contains("LEADER_ETCD_USER"), "{none}");
    let outsider = build(Some(("outsider", "outsider-pw")), "allowed/")
        .await
        .unwrap_err();
    assert_eq!(outsider.kind(), ErrorKind::PermissionDenied, "{outsider}");
    assert!(outsider.to_string().contains("readwrite"), "{outsider}");
    let elsewhere = build(Some(("leader-runner", "runner-pw")), "other/")
        .await
        .unwrap_err();
    assert_eq!(elsewhere.kind(), ErrorKind::PermissionDenied, "{elsewhere}");
}
