//! Scale-in protection (Auto Scaling, VMSS, Kubernetes) and the lifecycle-hook completion,
//! against a dedicated moto (the Auto Scaling control plane: protection and scale-in are its
//! own) and the fake metadata service of `integration_tests::metadata` (instance identity,
//! managed identity, ARM's protection PUT, the pod PATCH, `CompleteLifecycleAction`, which moto
//! answers with 500).
//!
//! The crate reads its endpoints from the environment, as on a machine, and the environment
//! belongs to the whole process: each case runs in a child process (this test binary again,
//! with the variables set and every cloud setting of the parent removed). The parent starts
//! moto and the fakes, and checks that the child passed.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr,
    reason = "test code: a failure should fail the test"
)]

use std::path::PathBuf;
use std::process::{Command, Stdio};

use integration_tests::autoscaling::{DedicatedMoto, MotoApi};
use integration_tests::metadata::{FakeMetadata, Machine};
use leader_notice::{AutoScaling, NoticeError, ProtectOn, protector};
use serde_json::{Value, json};

/// Set in the child: run the case instead of setting it up.
const CHILD_VAR: &str = "LEADER_PROTECTION_TEST_CHILD";

/// The pod deletion cost annotation.
const COST: &str = "controller.kubernetes.io/pod-deletion-cost";

fn in_child() -> bool {
    std::env::var_os(CHILD_VAR).is_some()
}

/// A variable the parent gave the child.
fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("the parent did not set {name}"))
}

/// Whether the parent's environment variable `name` could steer the crate.
fn cloud_setting(name: &str) -> bool {
    [
        "AWS_",
        "AZURE_",
        "KUBERNETES_",
        "LEADER_AZURE_",
        "LEADER_K8S_",
        "GCE_",
    ]
    .iter()
    .any(|p| name.starts_with(p))
        || matches!(name, "POD_NAME" | "SSL_CERT_FILE" | "SSL_CERT_DIR")
}

/// Runs `test` (this binary's test of that name) in a child with `env` only as cloud settings.
fn run_child(test: &str, env: &[(&str, String)]) {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_VAR, "1")
        .stdin(Stdio::null());
    for (name, _) in std::env::vars() {
        if cloud_setting(&name) {
            command.env_remove(name);
        }
    }
    // No profile of the user's, whatever HOME holds.
    let none = std::env::temp_dir().join("leader-notice-no-aws-config");
    command
        .env("AWS_CONFIG_FILE", &none)
        .env("AWS_SHARED_CREDENTIALS_FILE", &none);
    for (name, value) in env {
        command.env(name, value);
    }
    let out = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the child run of {test} failed");
    // The child must really have run the test, not filtered it out.
    assert!(stdout.contains("1 passed"), "{stdout}");
}

// -- moto ---------------------------------------------------------------------------------

// -- the fake metadata service, from the child ---------------------------------------------

async fn fake_state(fake: &str) -> Value {
    reqwest::get(format!("{fake}/_state"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn fake_post(fake: &str, path: &str, body: Value) {
    let response = reqwest::Client::new()
        .post(format!("{fake}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "{path}: {response:?}");
}

/// The calls the fake answered whose path starts with `prefix`.
async fn fake_calls(fake: &str, prefix: &str) -> Vec<Value> {
    let calls: Vec<Value> = reqwest::get(format!("{fake}/_calls"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    calls
        .into_iter()
        .filter(|c| c["path"].as_str().is_some_and(|p| p.starts_with(prefix)))
        .collect()
}

fn config_error(result: Result<impl Sized, NoticeError>) -> String {
    match result {
        Err(NoticeError::Config(message)) => message,
        Err(other) => panic!("not a configuration error: {other:?}"),
        Ok(_) => panic!("it succeeded"),
    }
}

// -- AWS ------------------------------------------------------------------------------------

/// The leader's instance is protected, a scale-in to 1 keeps it and removes the two others,
/// unprotecting works, the lifecycle action is completed with CONTINUE, and an instance in no
/// group is told so. (Bad credentials are not tested: moto accepts any.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_protection_keeps_the_leader_through_a_scale_in() {
    if in_child() {
        return aws_case().await;
    }
    let Some(moto) = DedicatedMoto::start() else {
        return;
    };
    let group = "leaders".to_owned();
    let instances = moto.api().group(&group, 3);
    // moto removes instances in its list order: unprotected, the first would go first.
    let leader = instances[0].clone();
    let fake = FakeMetadata::start(&Machine {
        aws_instance_id: leader.clone(),
        autoscaling_upstream: Some(moto.url().to_owned()),
        ..Machine::default()
    });
    run_child(
        "aws_protection_keeps_the_leader_through_a_scale_in",
        &[
            ("AWS_EC2_METADATA_SERVICE_ENDPOINT", fake.http_url()),
            ("AWS_ENDPOINT_URL_AUTO_SCALING", fake.http_url()),
            ("AWS_REGION", "us-east-1".to_owned()),
            ("AWS_ACCESS_KEY_ID", "AKIDTEST".to_owned()),
            ("AWS_SECRET_ACCESS_KEY", "not-a-secret".to_owned()),
            ("TEST_MOTO", moto.url().to_owned()),
            ("TEST_FAKE", fake.http_url()),
            ("TEST_GROUP", group.clone()),
            ("TEST_LEADER", leader.clone()),
        ],
    );
    let completions = &fake.state()["lifecycle_completions"];
    assert_eq!(
        completions,
        &json!([{
            "AutoScalingGroupName": group,
            "LifecycleHookName": "drain",
            "InstanceId": leader,
            "LifecycleActionResult": "CONTINUE",
        }])
    );
}

async fn aws_case() {
    let (moto, fake) = (MotoApi::new(&var("TEST_MOTO")), var("TEST_FAKE"));
    let (group, leader) = (var("TEST_GROUP"), var("TEST_LEADER"));
    let client = AutoScaling::from_env().await.unwrap();
    assert_eq!(
        client.this_instance().await.unwrap(),
        (leader.clone(), group.clone())
    );
    let protection = protector(ProtectOn::Aws).await.unwrap();
    let described = protection.describe();
    assert!(
        described.contains(&leader) && described.contains(&group),
        "{described}"
    );
    // (moto's calls are blocking: a few milliseconds on loopback, in a test's runtime.)
    assert!(!moto.protected(&leader));

    protection.set(true).await.unwrap();
    assert!(moto.protected(&leader));
    protection.set(true).await.unwrap(); // idempotent
    moto.set_desired_capacity(&group, 1);
    assert_eq!(moto.instances(&group), vec![leader.clone()]);

    protection.set(false).await.unwrap();
    assert!(!moto.protected(&leader));

    client
        .complete_lifecycle_action(&group, "drain", &leader)
        .await
        .unwrap();
    // Each call reached the fake signed (it logs the Authorization header redacted).
    let posts = fake_calls(&fake, "/").await;
    let actions: Vec<&str> = posts
        .iter()
        .filter_map(|c| c["form"]["Action"].as_str())
        .collect();
    for action in [
        "DescribeAutoScalingInstances",
        "SetInstanceProtection",
        "CompleteLifecycleAction",
    ] {
        assert!(actions.contains(&action), "{action} not in {actions:?}");
    }
    for call in posts.iter().filter(|c| c["form"]["Action"].is_string()) {
        assert_eq!(call["headers"]["authorization"], "<redacted>", "{call}");
        assert!(call["headers"]["x-amz-date"].is_string(), "{call}");
    }

    // Another machine, in no group.
    fake_post(
        &fake,
        "/_machine",
        json!({"aws_instance_id": "i-0aaaaaaaaaaaaaaaa"}),
    )
    .await;
    let message = config_error(protector(ProtectOn::Aws).await);
    assert!(
        message.contains("i-0aaaaaaaaaaaaaaaa") && message.contains("not in an Auto Scaling group"),
        "{message}"
    );
}

// -- Azure ----------------------------------------------------------------------------------

/// The VM's protection is PUT to ARM with the managed identity's token (the fake refuses any
/// other), set then cleared; the token is fetched once for both; a VM in no scale set is told
/// so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_protection_is_put_on_the_vm_with_the_managed_identity() {
    if in_child() {
        return match var("TEST_CASE").as_str() {
            "protect" => azure_case().await,
            "outside" => azure_outside_a_scale_set().await,
            other => panic!("no case {other}"),
        };
    }
    let fake = FakeMetadata::start(&Machine::default());
    let lonely = FakeMetadata::start(&Machine {
        azure_scale_set: String::new(),
        azure_vm_name: "lonely".to_owned(),
        ..Machine::default()
    });
    run_child(
        "azure_protection_is_put_on_the_vm_with_the_managed_identity",
        &[
            ("LEADER_AZURE_IMDS_ENDPOINT", fake.http_url()),
            ("LEADER_AZURE_ARM_ENDPOINT", fake.https_url()),
            ("SSL_CERT_FILE", fake.ca_file().display().to_string()),
            ("TEST_FAKE", fake.http_url()),
            ("TEST_VM", Machine::default().azure_vm_path()),
            ("TEST_CASE", "protect".to_owned()),
        ],
    );
    run_child(
        "azure_protection_is_put_on_the_vm_with_the_managed_identity",
        &[
            ("LEADER_AZURE_IMDS_ENDPOINT", lonely.http_url()),
            ("TEST_CASE", "outside".to_owned()),
        ],
    );
    // The last write was the clear.
    let vm = Machine::default().azure_vm_path();
    assert_eq!(fake.state()["arm_protection"][&vm], json!(false));
}

async fn azure_case() {
    let (fake, vm) = (var("TEST_FAKE"), var("TEST_VM"));
    let protection = protector(ProtectOn::Azure).await.unwrap();
    let described = protection.describe();
    assert!(
        described.contains("vmss_0") && described.contains("vmss"),
        "{described}"
    );

    protection.set(true).await.unwrap();
    assert_eq!(fake_state(&fake).await["arm_protection"][&vm], json!(true));
    protection.set(false).await.unwrap();
    assert_eq!(fake_state(&fake).await["arm_protection"][&vm], json!(false));

    let puts = fake_calls(&fake, "/subscriptions/").await;
    assert_eq!(puts.len(), 2, "{puts:?}");
    for put in &puts {
        assert_eq!(put["method"], "PUT");
        assert_eq!(put["query"]["api-version"], "2023-09-01");
        assert_eq!(put["status"], 200);
    }
    let tokens = fake_calls(&fake, "/metadata/identity/oauth2/token").await;
    assert_eq!(tokens.len(), 1, "the token is reused: {tokens:?}");
}

async fn azure_outside_a_scale_set() {
    let message = config_error(protector(ProtectOn::Azure).await);
    assert!(
        message.contains("lonely") && message.contains("not in a virtual machine scale set"),
        "{message}"
    );
}

// -- Kubernetes -----------------------------------------------------------------------------

/// The deletion cost is set on the pod and removed, through the API server's HTTPS with the
/// service account's CA (no other trust) and token, read again at each call; a pod that is
/// not there is a configuration error that names POD_NAME.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k8s_deletion_cost_is_set_then_removed() {
    if in_child() {
        return k8s_case().await;
    }
    let fake = FakeMetadata::start(&Machine::default());
    let account = tempfile::tempdir().unwrap();
    std::fs::write(account.path().join("token"), "sa-token-1\n").unwrap();
    std::fs::copy(fake.ca_file(), account.path().join("ca.crt")).unwrap();
    std::fs::write(account.path().join("namespace"), "default").unwrap();
    run_child(
        "k8s_deletion_cost_is_set_then_removed",
        &[
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1".to_owned()),
            ("KUBERNETES_SERVICE_PORT", fake.https_port().to_string()),
            (
                "LEADER_K8S_SERVICEACCOUNT_DIR",
                account.path().display().to_string(),
            ),
            ("POD_NAME", "pod-0".to_owned()),
            ("TEST_FAKE", fake.http_url()),
        ],
    );
    let state = fake.state();
    let annotations = state["pod_annotations"]["default/pod-0"]
        .as_object()
        .unwrap();
    assert!(annotations.get(COST).is_none(), "{annotations:?}");
}

async fn k8s_case() {
    let fake = var("TEST_FAKE");
    let dir = PathBuf::from(var("LEADER_K8S_SERVICEACCOUNT_DIR"));
    let protection = protector(ProtectOn::Kubernetes).await.unwrap();
    assert_eq!(protection.describe(), "pod default/pod-0");

    protection.set(true).await.unwrap();
    assert_eq!(cost(&fake).await, Some(json!("2147483647")));
    // A rotated token is read at the next call.
    std::fs::write(dir.join("token"), "").unwrap();
    let message = config_error(protection.set(false).await);
    assert!(message.contains("token"), "{message}");
    assert_eq!(cost(&fake).await, Some(json!("2147483647")));
    std::fs::write(dir.join("token"), "sa-token-2").unwrap();
    protection.set(false).await.unwrap();
    assert_eq!(cost(&fake).await, None);

    // This pod is gone (or POD_NAME is wrong): the API server says 404.
    fake_post(&fake, "/_machine", json!({"pod_name": "pod-1"})).await;
    let message = config_error(protection.set(true).await);
    assert!(message.contains("POD_NAME"), "{message}");
}

/// The deletion cost annotation of pod default/pod-0, as the fake holds it.
async fn cost(fake: &str) -> Option<Value> {
    let state = fake_state(fake).await;
    let annotations = state["pod_annotations"]["default/pod-0"]
        .as_object()
        .unwrap_or_else(|| panic!("no pod default/pod-0 in {state}"))
        .clone();
    annotations.get(COST).cloned()
}

/// Out of a pod: the error names the setting that is missing.
#[tokio::test]
async fn k8s_discovery_names_what_is_missing() {
    if in_child() {
        let message = config_error(protector(ProtectOn::Kubernetes).await);
        let missing = var("TEST_MISSING");
        assert!(message.contains(&missing), "{message}");
        return;
    }
    let account = tempfile::tempdir().unwrap();
    let dir = account.path().display().to_string();
    run_child(
        "k8s_discovery_names_what_is_missing",
        &[("TEST_MISSING", "KUBERNETES_SERVICE_HOST".to_owned())],
    );
    // A service account folder without its token.
    run_child(
        "k8s_discovery_names_what_is_missing",
        &[
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1".to_owned()),
            ("LEADER_K8S_SERVICEACCOUNT_DIR", dir.clone()),
            ("TEST_MISSING", format!("{dir}/token")),
        ],
    );
}
