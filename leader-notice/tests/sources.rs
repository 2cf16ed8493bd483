//! The notice sources of EC2, Azure and GCE against the fake metadata service
//! (`integration_tests::metadata::FakeMetadata`, one process per simulated machine), through
//! the public API: `NoticeWatcher` and `NoticeWatch`.
//!
//! The endpoints are environment variables, and a process has one environment. So each case
//! runs in a child process of this test binary: each test starts a fake, then runs itself
//! again in a child with every endpoint pointed at the fake (or at a closed port) and the
//! case's name in `LEADER_NOTICE_TEST_CASE`; in the child, the test runs that `child_*` case
//! instead, and the parent checks that exactly one test ran there and passed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::TcpListener;
use std::process::Command;
use std::time::Duration;

use integration_tests::metadata::{FakeMetadata, Machine};
use leader_notice::{Cloud, Notice, NoticeKind, NoticeWatch, NoticeWatcher, Watch};
use serde_json::{Value, json};

/// Set in a child's environment: the fake's plain-HTTP URL, for the controls.
const FAKE_VAR: &str = "LEADER_NOTICE_TEST_FAKE";
/// Set in a child's environment: the case to run (a `child_*` function).
const CASE_VAR: &str = "LEADER_NOTICE_TEST_CASE";
/// Set in a child's environment: the case's parameter (e.g. `aws hang`).
const PARAM_VAR: &str = "LEADER_NOTICE_TEST_PARAM";

/// How often the watcher looks in these tests (AWS and Azure).
const POLL: Duration = Duration::from_millis(200);
/// How long a notice may take to arrive once raised: far more than a poll, and less than a
/// GCE hanging GET's minute (so a GCE notice must come through the hanging GET's answer).
const ARRIVES_WITHIN: Duration = Duration::from_secs(20);

// ------------------------------------------------------------------------------------------
// The parent side.

/// `127.0.0.1:P` where nothing listens.
fn closed_authority() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("127.0.0.1:{port}")
}

/// Runs the child test `case` with every endpoint at `fake`, then `overrides`, and `param`.
fn run_child(case: &str, fake: &FakeMetadata, overrides: &[(&str, String)], param: &str) {
    let test = TEST.with(|t| t.borrow().clone());
    let mut env: Vec<(&str, String)> = vec![
        (CASE_VAR, case.to_owned()),
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT", fake.http_url()),
        ("LEADER_AZURE_IMDS_ENDPOINT", fake.http_url()),
        ("GCE_METADATA_HOST", fake.authority()),
        (FAKE_VAR, fake.http_url()),
        (PARAM_VAR, param.to_owned()),
        ("RUST_LOG", "leader_notice=debug".to_owned()),
    ];
    for (name, value) in overrides {
        env.retain(|(n, _)| n != name);
        env.push((name, value.clone()));
    }
    let output = Command::new(std::env::current_exe().unwrap())
        .args([test.as_str(), "--exact", "--nocapture", "--test-threads=1"])
        // A profile must not move the IMDS endpoint, nor a region come from elsewhere.
        .env("AWS_CONFIG_FILE", "/nonexistent/leader-notice-test")
        .envs(env)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "child {case} ({param}) failed or did not run:\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
}

thread_local! {
    /// The name of the test this thread runs (the child runs the same test).
    static TEST: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// Names the test this thread works for.
fn as_test(name: &str) {
    TEST.with(|t| *t.borrow_mut() = name.to_owned());
}

/// In a child: runs the case of `CASE_VAR` and returns `true`. In the parent: records the
/// test's name for `run_child` and returns `false`.
fn dispatch(test: &str) -> bool {
    as_test(test);
    let Ok(case) = std::env::var(CASE_VAR) else {
        return false;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        match case.as_str() {
            "child_aws_spot" => child_aws_spot().await,
            "child_aws_lifecycle" => child_aws_lifecycle().await,
            "child_azure_own_event" => child_azure_own_event().await,
            "child_azure_shared_event" => child_azure_shared_event().await,
            "child_gce_preempted" => child_gce_preempted().await,
            "child_gce_maintenance" => child_gce_maintenance().await,
            "child_fault" => child_fault().await,
            "child_one_path_hangs" => child_one_path_hangs().await,
            "child_gce_failed_value_while_other_hangs" => {
                child_gce_failed_value_while_other_hangs().await
            }
            "child_auto" => child_auto().await,
            other => panic!("no child case {other}"),
        }
    });
    true
}

/// A fake of a default machine (VM `vmss_0`, instance `i-0fake0000000000001`).
fn fake() -> FakeMetadata {
    FakeMetadata::start(&Machine::default())
}

#[test]
fn aws_spot_interruption_arrives_and_nothing_before() {
    if dispatch("aws_spot_interruption_arrives_and_nothing_before") {
        return;
    }
    run_child("child_aws_spot", &fake(), &[], "");
}

#[test]
fn aws_terminated_target_lifecycle_state_is_a_scale_in() {
    if dispatch("aws_terminated_target_lifecycle_state_is_a_scale_in") {
        return;
    }
    run_child("child_aws_lifecycle", &fake(), &[], "");
}

#[test]
fn azure_own_event_arrives_and_is_approved_once_and_only_it() {
    if dispatch("azure_own_event_arrives_and_is_approved_once_and_only_it") {
        return;
    }
    run_child("child_azure_own_event", &fake(), &[], "");
}

#[test]
fn azure_event_of_two_vms_is_a_notice_but_never_approved() {
    if dispatch("azure_event_of_two_vms_is_a_notice_but_never_approved") {
        return;
    }
    run_child("child_azure_shared_event", &fake(), &[], "");
}

#[test]
fn gce_preemption_arrives_through_the_hanging_get() {
    if dispatch("gce_preemption_arrives_through_the_hanging_get") {
        return;
    }
    run_child("child_gce_preempted", &fake(), &[], "");
}

#[test]
fn gce_terminating_maintenance_is_a_notice_a_migration_is_not() {
    if dispatch("gce_terminating_maintenance_is_a_notice_a_migration_is_not") {
        return;
    }
    run_child("child_gce_maintenance", &fake(), &[], "");
}

#[test]
fn a_hanging_or_garbage_service_gives_no_notice_and_is_watched_again_after() {
    if dispatch("a_hanging_or_garbage_service_gives_no_notice_and_is_watched_again_after") {
        return;
    }
    // One fake per case, the cases of one cloud in a row, the clouds in parallel.
    let clouds = ["aws", "azure", "gcp"].map(|cloud| {
        std::thread::spawn(move || {
            as_test("a_hanging_or_garbage_service_gives_no_notice_and_is_watched_again_after");
            for mode in ["hang", "garbage", "status500"] {
                run_child("child_fault", &fake(), &[], &format!("{cloud} {mode}"));
            }
        })
    });
    for cloud in clouds {
        cloud.join().unwrap();
    }
}

#[test]
fn a_path_that_keeps_hanging_does_not_hide_the_other_paths_notice() {
    if dispatch("a_path_that_keeps_hanging_does_not_hide_the_other_paths_notice") {
        return;
    }
    let clouds = ["aws", "gcp"].map(|cloud| {
        std::thread::spawn(move || {
            as_test("a_path_that_keeps_hanging_does_not_hide_the_other_paths_notice");
            run_child("child_one_path_hangs", &fake(), &[], cloud);
        })
    });
    for cloud in clouds {
        cloud.join().unwrap();
    }
}

#[test]
fn a_gce_value_that_failed_is_read_again_while_the_other_hangs() {
    if dispatch("a_gce_value_that_failed_is_read_again_while_the_other_hangs") {
        return;
    }
    run_child("child_gce_failed_value_while_other_hangs", &fake(), &[], "");
}

#[test]
fn auto_watches_gce_alone_when_only_gce_answers() {
    if dispatch("auto_watches_gce_alone_when_only_gce_answers") {
        return;
    }
    let closed = format!("http://{}", closed_authority());
    let overrides = [
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT", closed.clone()),
        ("LEADER_AZURE_IMDS_ENDPOINT", closed),
    ];
    run_child("child_auto", &fake(), &overrides, "gcp");
}

#[test]
fn auto_watches_aws_alone_when_only_aws_answers() {
    if dispatch("auto_watches_aws_alone_when_only_aws_answers") {
        return;
    }
    let overrides = [
        (
            "LEADER_AZURE_IMDS_ENDPOINT",
            format!("http://{}", closed_authority()),
        ),
        ("GCE_METADATA_HOST", closed_authority()),
    ];
    run_child("child_auto", &fake(), &overrides, "aws");
}

#[test]
fn auto_watches_azure_alone_when_only_azure_answers() {
    if dispatch("auto_watches_azure_alone_when_only_azure_answers") {
        return;
    }
    let overrides = [
        (
            "AWS_EC2_METADATA_SERVICE_ENDPOINT",
            format!("http://{}", closed_authority()),
        ),
        ("GCE_METADATA_HOST", closed_authority()),
    ];
    run_child("child_auto", &fake(), &overrides, "azure");
}

// ------------------------------------------------------------------------------------------
// The child side: runs only in a child process, through `dispatch`.

/// The fake's controls, over HTTP from the child.
struct Fake {
    http: reqwest::Client,
    url: String,
}

impl Fake {
    /// The fake of the parent, or `None` outside a child process.
    fn from_env() -> Option<Self> {
        let url = std::env::var(FAKE_VAR).ok()?;
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .try_init();
        Some(Self {
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
            url,
        })
    }

    async fn control(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = self.http.request(method, format!("{}{path}", self.url));
        if let Some(body) = body {
            request = request
                .header("Content-Type", "application/json")
                .body(body.to_string());
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        assert!(status.is_success(), "{path}: {status} {text}");
        serde_json::from_str(&text).unwrap()
    }

    async fn raise(&self, notice: Value) -> Value {
        self.control(reqwest::Method::POST, "/_notice", Some(notice))
            .await
    }

    async fn fault(&self, prefix: &str, mode: &str) {
        let body = json!({ "prefix": prefix, "mode": mode });
        self.control(reqwest::Method::POST, "/_fault", Some(body))
            .await;
    }

    async fn state(&self) -> Value {
        self.control(reqwest::Method::GET, "/_state", None).await
    }

    async fn calls(&self) -> Vec<Value> {
        match self.control(reqwest::Method::GET, "/_calls", None).await {
            Value::Array(calls) => calls,
            other => panic!("/_calls: {other}"),
        }
    }
}

fn watch(which: Watch) -> NoticeWatch {
    NoticeWatcher::new(which)
        .poll_every(POLL)
        .unwrap()
        .spawn()
        .unwrap()
}

/// Asserts that no notice comes during `d` (the watcher looks many times meanwhile).
async fn no_notice_for(w: &NoticeWatch, d: Duration, why: &str) {
    if let Ok(n) = tokio::time::timeout(d, w.notice()).await {
        panic!("{why}: unexpected notice {n:?}");
    }
}

/// The notice, which must come within [`ARRIVES_WITHIN`].
async fn notice(w: &NoticeWatch, what: &str) -> Notice {
    match tokio::time::timeout(ARRIVES_WITHIN, w.notice()).await {
        Ok(n) => n,
        Err(_) => panic!("no notice within {ARRIVES_WITHIN:?} of {what}"),
    }
}

async fn child_aws_spot() {
    let Some(fake) = Fake::from_env() else { return };
    let w = watch(Watch::Only(Cloud::Aws));
    no_notice_for(&w, Duration::from_millis(1500), "nothing raised").await;
    fake.raise(json!({"cloud": "aws", "kind": "rebalance"}))
        .await;
    no_notice_for(
        &w,
        Duration::from_millis(1500),
        "a rebalance recommendation",
    )
    .await;
    fake.raise(json!({"cloud": "aws", "kind": "spot"})).await;
    let n = notice(&w, "a spot interruption").await;
    assert_eq!(
        (n.cloud, n.kind),
        (Cloud::Aws, NoticeKind::SpotInterruption)
    );
    assert!(n.detail.contains("terminate"), "{}", n.detail);
    assert!(!w.approve().await.unwrap(), "nothing to approve on EC2");
}

async fn child_aws_lifecycle() {
    let Some(fake) = Fake::from_env() else { return };
    let w = watch(Watch::Only(Cloud::Aws));
    no_notice_for(&w, Duration::from_millis(1500), "InService").await;
    fake.raise(json!({"cloud": "aws", "kind": "lifecycle"}))
        .await;
    let n = notice(&w, "a terminate lifecycle").await;
    assert_eq!((n.cloud, n.kind), (Cloud::Aws, NoticeKind::ScaleIn));
}

async fn child_azure_own_event() {
    let Some(fake) = Fake::from_env() else { return };
    let w = watch(Watch::Only(Cloud::Azure));
    no_notice_for(&w, Duration::from_secs(1), "no events").await;
    let other = fake
        .raise(json!({"cloud": "azure", "type": "Terminate", "resources": ["vmss_7"]}))
        .await;
    fake.raise(json!({"cloud": "azure", "type": "Freeze"}))
        .await;
    no_notice_for(
        &w,
        Duration::from_millis(1500),
        "another VM's Terminate, own Freeze",
    )
    .await;
    let own = fake
        .raise(json!({"cloud": "azure", "type": "Terminate"}))
        .await;
    let n = notice(&w, "this VM's Terminate").await;
    assert_eq!((n.cloud, n.kind), (Cloud::Azure, NoticeKind::Terminate));
    assert_eq!(n.event_id.as_deref(), own["event_id"].as_str());
    assert!(n.only_this_instance);
    assert!(w.approve().await.unwrap(), "own event approved");
    assert!(!w.approve().await.unwrap(), "approved once only");
    let state = fake.state().await;
    assert_eq!(
        state["azure_approvals"],
        json!([own["event_id"]]),
        "only this VM's event, once (not {})",
        other["event_id"]
    );
}

async fn child_azure_shared_event() {
    let Some(fake) = Fake::from_env() else { return };
    let w = watch(Watch::Only(Cloud::Azure));
    no_notice_for(&w, Duration::from_secs(1), "no events").await;
    let shared = fake
        .raise(json!({"cloud": "azure", "type": "Preempt", "resources": ["vmss_1", "vmss_0"]}))
        .await;
    let n = notice(&w, "a Preempt of two VMs").await;
    assert_eq!((n.cloud, n.kind), (Cloud::Azure, NoticeKind::Preempt));
    assert_eq!(n.event_id.as_deref(), shared["event_id"].as_str());
    assert!(!n.only_this_instance);
    assert!(
        !w.approve().await.unwrap(),
        "an event of two VMs is not ours to approve"
    );
    assert_eq!(fake.state().await["azure_approvals"], json!([]));
}

async fn child_gce_preempted() {
    let Some(fake) = Fake::from_env() else { return };
    let w = watch(Watch::Only(Cloud::Gcp));
    // Long enough for the first (plain) look and for the hanging GETs to be waiting.
    no_notice_for(&w, Duration::from_secs(2), "not preempted").await;
    fake.raise(json!({"cloud": "gcp", "kind": "preempted"}))
        .await;
    let n = notice(&w, "a preemption").await;
    assert_eq!((n.cloud, n.kind), (Cloud::Gcp, NoticeKind::Preempted));
    let hanging = fake.calls().await.into_iter().any(|c| {
        c["path"] == "/computeMetadata/v1/instance/preempted"
            && c["query"]["wait_for_change"] == "true"
            && c["query"]["last_etag"]
                .as_str()
                .is_some_and(|e| !e.is_empty())
    });
    assert!(
        hanging,
        "the notice came through a hanging GET with the last ETag"
    );
}

async fn child_gce_maintenance() {
    let Some(fake) = Fake::from_env() else { return };
    let w = watch(Watch::Only(Cloud::Gcp));
    no_notice_for(&w, Duration::from_secs(1), "no maintenance").await;
    fake.raise(
        json!({"cloud": "gcp", "kind": "maintenance", "value": "MIGRATE_ON_HOST_MAINTENANCE"}),
    )
    .await;
    no_notice_for(&w, Duration::from_millis(1500), "a live migration").await;
    fake.raise(json!({"cloud": "gcp", "kind": "maintenance"}))
        .await;
    let n = notice(&w, "a terminating maintenance").await;
    assert_eq!((n.cloud, n.kind), (Cloud::Gcp, NoticeKind::HostMaintenance));
}

/// The notice raised by `cloud`'s case, its kind, and the prefix of the paths a fault breaks.
fn case_of(cloud: &str) -> (Watch, Value, NoticeKind, &'static str) {
    match cloud {
        "aws" => (
            Watch::Only(Cloud::Aws),
            json!({"cloud": "aws", "kind": "spot"}),
            NoticeKind::SpotInterruption,
            "/latest/meta-data/spot",
        ),
        "azure" => (
            Watch::Only(Cloud::Azure),
            json!({"cloud": "azure", "type": "Preempt"}),
            NoticeKind::Preempt,
            "/metadata/scheduledevents",
        ),
        "gcp" => (
            Watch::Only(Cloud::Gcp),
            json!({"cloud": "gcp", "kind": "preempted"}),
            NoticeKind::Preempted,
            "/computeMetadata/v1/instance/",
        ),
        other => panic!("no case for {other}"),
    }
}

async fn child_fault() {
    let Some(fake) = Fake::from_env() else { return };
    let param = std::env::var(PARAM_VAR).unwrap();
    let (cloud, mode) = param.split_once(' ').unwrap();
    let (which, raise, kind, prefix) = case_of(cloud);
    let w = watch(which);
    no_notice_for(&w, Duration::from_secs(1), "a healthy service").await;
    fake.fault(prefix, mode).await;
    // Several looks (or a hanging one past its timeout) meet the fault.
    no_notice_for(&w, Duration::from_secs(4), mode).await;
    fake.fault(prefix, "none").await;
    fake.raise(raise).await;
    let n = notice(&w, &format!("a notice after a {mode} fault was cleared")).await;
    assert_eq!(n.kind, kind, "{cloud} {mode}");
}

async fn child_one_path_hangs() {
    let Some(fake) = Fake::from_env() else { return };
    let cloud = std::env::var(PARAM_VAR).unwrap();
    // The fault stays: each look meets it; a notice on the other path must still come, which
    // it cannot if a look waits for the hanging path for longer than ARRIVES_WITHIN.
    let (which, hangs, raise, kind) = match cloud.as_str() {
        "aws" => (
            Watch::Only(Cloud::Aws),
            "/latest/meta-data/spot",
            json!({"cloud": "aws", "kind": "lifecycle"}),
            NoticeKind::ScaleIn,
        ),
        _ => (
            Watch::Only(Cloud::Gcp),
            "/computeMetadata/v1/instance/preempted",
            json!({"cloud": "gcp", "kind": "maintenance"}),
            NoticeKind::HostMaintenance,
        ),
    };
    // From the first look (a GCE hanging GET already waiting would not meet the fault).
    fake.fault(hangs, "hang").await;
    let w = watch(which);
    no_notice_for(&w, Duration::from_secs(3), "a hanging path").await;
    fake.raise(raise).await;
    let n = notice(&w, &format!("a {cloud} notice beside a hanging path")).await;
    assert_eq!(n.kind, kind);
    fake.fault(hangs, "none").await;
}

async fn child_gce_failed_value_while_other_hangs() {
    let Some(fake) = Fake::from_env() else { return };
    // From the first look: instance/preempted answers garbage, maintenance-event is fine, so
    // each later look meets a failed preempted beside a hanging GET on maintenance-event,
    // which nothing will end for a minute.
    let preempted = "/computeMetadata/v1/instance/preempted";
    fake.fault(preempted, "garbage").await;
    let w = watch(Watch::Only(Cloud::Gcp));
    no_notice_for(&w, Duration::from_secs(2), "a garbage preempted").await;
    // A look after the first met the garbage: by then maintenance-event was read, so that
    // look's GET of it was a hanging one (the race this test is about), which the look then
    // dropped for a plain read.
    let calls = fake.calls().await;
    let garbage_reads = calls.iter().filter(|c| c["path"] == preempted).count();
    assert!(
        garbage_reads >= 2,
        "only {garbage_reads} read(s) of preempted before the fault was cleared"
    );
    let plain_maintenance_reads = calls
        .iter()
        .filter(|c| {
            c["path"] == "/computeMetadata/v1/instance/maintenance-event"
                && c["query"].get("wait_for_change").is_none()
        })
        .count();
    assert!(
        plain_maintenance_reads >= 2,
        "maintenance-event read plainly {plain_maintenance_reads} time(s): after a failed \
         read of preempted, the look must not wait on maintenance-event's hanging GET"
    );
    fake.fault(preempted, "none").await;
    fake.raise(json!({"cloud": "gcp", "kind": "preempted"}))
        .await;
    let n = notice(&w, "preempted, once it answered again beside a hanging GET").await;
    assert_eq!(n.kind, NoticeKind::Preempted);
}

async fn child_auto() {
    let Some(fake) = Fake::from_env() else { return };
    let cloud = std::env::var(PARAM_VAR).unwrap();
    let (_, raise, kind, _) = case_of(&cloud);
    let w = watch(Watch::Auto);
    no_notice_for(&w, Duration::from_secs(2), "nothing raised").await;
    fake.raise(raise).await;
    let n = notice(&w, &format!("a {cloud} notice with Auto")).await;
    assert_eq!((n.cloud.as_str(), n.kind), (cloud.as_str(), kind));
}
