//! The fake of the metadata services (`scripts/fake_identity.py` through
//! `integration_tests::metadata`): each path and control that the notice and protection tests
//! rely on answers as documented, so that those tests cannot pass against a fake that does not.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failure should fail the test"
)]

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use integration_tests::autoscaling::DedicatedMoto;
use integration_tests::metadata::{Answer, FakeMetadata, Machine};
use serde_json::{Value, json};

const EVENTS: &str = "/metadata/scheduledevents?api-version=2020-07-01";
const PREEMPTED: &str = "/computeMetadata/v1/instance/preempted";
const SPOT: &str = "/latest/meta-data/spot/instance-action";
const GOOGLE: (&str, &str) = ("Metadata-Flavor", "Google");
const AZURE: (&str, &str) = ("Metadata", "true");

fn get(fake: &FakeMetadata, path: &str, headers: &[(&str, &str)]) -> Answer {
    fake.request("GET", path, headers, None).unwrap()
}

fn imds_token(fake: &FakeMetadata) -> String {
    let answer = fake
        .request(
            "PUT",
            "/latest/api/token",
            &[("x-aws-ec2-metadata-token-ttl-seconds", "60")],
            None,
        )
        .unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
    answer.body
}

fn imds_get(fake: &FakeMetadata, token: &str, path: &str) -> Answer {
    get(
        fake,
        &format!("/latest/meta-data/{path}"),
        &[("x-aws-ec2-metadata-token", token)],
    )
}

/// Polls `check` (every 50 ms, at most `limit`) until it is true.
async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    check()
}

fn managed_identity_token(fake: &FakeMetadata) -> String {
    let path = "/metadata/identity/oauth2/token?api-version=2018-02-01\
                &resource=https://management.azure.com/";
    let answer = get(fake, path, &[AZURE]);
    assert_eq!(answer.status, 200, "{answer:?}");
    let token = answer.json().unwrap();
    assert_eq!(token["resource"], "https://management.azure.com/");
    assert_eq!(token["token_type"], "Bearer");
    assert!(token["expires_in"].is_string() && token["expires_on"].is_string());
    token["access_token"].as_str().unwrap().to_owned()
}

#[test]
fn aws_imds_requires_a_session_token_and_serves_the_machine() {
    let machine = Machine {
        aws_instance_id: "i-0123456789abcdef0".to_owned(),
        aws_region: "eu-west-1".to_owned(),
        ..Machine::default()
    };
    let fake = FakeMetadata::start(&machine);
    let without = get(&fake, "/latest/meta-data/instance-id", &[]);
    assert_eq!(without.status, 401, "{without:?}");
    let bad = imds_get(&fake, "not-a-token", "instance-id");
    assert_eq!(bad.status, 401, "{bad:?}");
    let token = imds_token(&fake);
    let id = imds_get(&fake, &token, "instance-id");
    assert_eq!((id.status, id.body.as_str()), (200, "i-0123456789abcdef0"));
    let region = imds_get(&fake, &token, "placement/region");
    assert_eq!(region.body, "eu-west-1");
}

#[test]
fn aws_notices_are_absent_until_raised() {
    let fake = FakeMetadata::start(&Machine::default());
    let token = imds_token(&fake);
    assert_eq!(imds_get(&fake, &token, "spot/instance-action").status, 404);
    let rebalance = "events/recommendations/rebalance";
    assert_eq!(imds_get(&fake, &token, rebalance).status, 404);
    let lifecycle = "autoscaling/target-lifecycle-state";
    assert_eq!(imds_get(&fake, &token, lifecycle).body, "InService");

    fake.raise(json!({"cloud": "aws", "kind": "spot"}));
    let spot = imds_get(&fake, &token, "spot/instance-action");
    assert_eq!(spot.status, 200, "{spot:?}");
    let action = spot.json().unwrap();
    assert_eq!(action["action"], "terminate");
    let time = action["time"].as_str().unwrap();
    assert!(time.len() == 20 && time.ends_with('Z'), "{time}");
    // The others did not move.
    assert_eq!(imds_get(&fake, &token, rebalance).status, 404);
    assert_eq!(imds_get(&fake, &token, lifecycle).body, "InService");

    fake.raise(json!({"cloud": "aws", "kind": "rebalance"}));
    let notice = imds_get(&fake, &token, rebalance).json().unwrap();
    assert!(notice["noticeTime"].is_string(), "{notice}");
    fake.raise(json!({"cloud": "aws", "kind": "lifecycle"}));
    assert_eq!(imds_get(&fake, &token, lifecycle).body, "Terminated");

    fake.raise(json!({"cloud": "aws", "kind": "spot", "clear": true}));
    assert_eq!(imds_get(&fake, &token, "spot/instance-action").status, 404);
    let kinds: Vec<Value> = fake.state()["notices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["kind"].clone())
        .collect();
    assert_eq!(kinds, ["spot", "rebalance", "lifecycle", "spot"]);
}

#[tokio::test]
async fn a_notice_with_in_is_raised_later() {
    let fake = FakeMetadata::start(&Machine::default());
    let token = imds_token(&fake);
    let record = fake.raise(json!({"cloud": "aws", "kind": "spot", "in": 1}));
    assert_eq!(record["raised"], false, "{record}");
    assert_eq!(imds_get(&fake, &token, "spot/instance-action").status, 404);
    assert_eq!(fake.state()["notices"][0]["raised"], false);
    let raised = eventually(Duration::from_secs(15), || {
        imds_get(&fake, &token, "spot/instance-action").status == 200
    })
    .await;
    assert!(raised, "the delayed spot notice never appeared");
    assert_eq!(fake.state()["notices"][0]["raised"], true);
}

#[test]
fn azure_scheduled_events_need_the_header_and_count_incarnations() {
    let fake = FakeMetadata::start(&Machine::default());
    let refused = get(&fake, EVENTS, &[]);
    assert_eq!(refused.status, 400, "{refused:?}");
    let empty = get(&fake, EVENTS, &[AZURE]).json().unwrap();
    assert_eq!(empty["Events"], json!([]));
    let first = empty["DocumentIncarnation"].as_i64().unwrap();

    let own = fake.raise(json!({"cloud": "azure", "type": "Terminate"}));
    let own_id = own["event_id"].as_str().unwrap().to_owned();
    let doc = get(&fake, EVENTS, &[AZURE]).json().unwrap();
    assert_eq!(doc["DocumentIncarnation"].as_i64().unwrap(), first + 1);
    let event = &doc["Events"][0];
    assert_eq!(event["EventId"], own_id.as_str());
    assert_eq!(event["EventType"], "Terminate");
    assert_eq!(event["EventStatus"], "Scheduled");
    assert_eq!(event["Resources"], json!(["vmss_0"]));

    let other = fake.raise(json!({"cloud": "azure", "type": "Preempt", "resources": ["vmss_7"]}));
    let doc = get(&fake, EVENTS, &[AZURE]).json().unwrap();
    assert_eq!(doc["DocumentIncarnation"].as_i64().unwrap(), first + 2);
    assert_eq!(doc["Events"][1]["Resources"], json!(["vmss_7"]));
    assert_ne!(other["event_id"], own["event_id"]);

    let body = json!({"StartRequests": [{"EventId": own_id}]}).to_string();
    let approve = fake.request("POST", EVENTS, &[AZURE], Some(&body)).unwrap();
    assert_eq!(approve.status, 200, "{approve:?}");
    let unknown = json!({"StartRequests": [{"EventId": "NOT-AN-EVENT"}]}).to_string();
    let refused = fake
        .request("POST", EVENTS, &[AZURE], Some(&unknown))
        .unwrap();
    assert_eq!(refused.status, 400, "{refused:?}");
    let no_header = fake.request("POST", EVENTS, &[], Some(&body)).unwrap();
    assert_eq!(no_header.status, 400, "{no_header:?}");

    let doc = get(&fake, EVENTS, &[AZURE]).json().unwrap();
    assert_eq!(doc["DocumentIncarnation"].as_i64().unwrap(), first + 3);
    assert_eq!(doc["Events"][0]["EventStatus"], "Started");
    assert_eq!(doc["Events"][1]["EventStatus"], "Scheduled");
    assert_eq!(fake.state()["azure_approvals"], json!([own_id]));
}

#[test]
fn azure_compute_metadata_and_managed_identity() {
    let machine = Machine {
        azure_vm_name: "web_3".to_owned(),
        azure_scale_set: "web".to_owned(),
        azure_instance_id: "3".to_owned(),
        ..Machine::default()
    };
    let fake = FakeMetadata::start(&machine);
    let name_path = "/metadata/instance/compute/name?api-version=2021-02-01&format=text";
    assert_eq!(get(&fake, name_path, &[]).status, 400);
    let name = get(&fake, name_path, &[AZURE]);
    assert_eq!((name.status, name.body.as_str()), (200, "web_3"));
    let compute = get(
        &fake,
        "/metadata/instance/compute?api-version=2021-02-01",
        &[AZURE],
    )
    .json()
    .unwrap();
    assert_eq!(compute["vmScaleSetName"], "web");
    assert_eq!(compute["resourceGroupName"], "rg");
    assert_eq!(compute["subscriptionId"], machine.azure_subscription);
    assert_eq!(compute["resourceId"], machine.azure_vm_path());
    let instance = get(&fake, "/metadata/instance?api-version=2021-02-01", &[AZURE]);
    assert_eq!(instance.json().unwrap()["compute"]["name"], "web_3");

    let token_path = "/metadata/identity/oauth2/token?api-version=2018-02-01\
                      &resource=https://management.azure.com/";
    assert_eq!(get(&fake, token_path, &[]).status, 400);
    assert!(!managed_identity_token(&fake).is_empty());
}

#[test]
fn arm_protection_needs_the_managed_identity_token_and_is_recorded() {
    let machine = Machine::default();
    let fake = FakeMetadata::start(&machine);
    let path = format!("{}?api-version=2024-07-01", machine.azure_vm_path());
    let protect =
        |on: bool| json!({"properties": {"protectionPolicy": {"protectFromScaleIn": on}}});
    let body = protect(true).to_string();
    let anonymous = fake.request("PUT", &path, &[], Some(&body)).unwrap();
    assert_eq!(anonymous.status, 401, "{anonymous:?}");
    let forged = [("Authorization", "Bearer made-up")];
    assert_eq!(
        fake.request("PUT", &path, &forged, Some(&body))
            .unwrap()
            .status,
        401
    );
    assert_eq!(fake.state()["arm_protection"], json!({}));

    let bearer = format!("Bearer {}", managed_identity_token(&fake));
    let auth = [("Authorization", bearer.as_str())];
    let put = fake.request("PUT", &path, &auth, Some(&body)).unwrap();
    assert_eq!(put.status, 200, "{put:?}");
    assert_eq!(
        put.json().unwrap()["properties"]["protectionPolicy"]["protectFromScaleIn"],
        true
    );
    assert_eq!(
        fake.state()["arm_protection"][machine.azure_vm_path()],
        true
    );
    let off = protect(false).to_string();
    assert_eq!(
        fake.request("PUT", &path, &auth, Some(&off))
            .unwrap()
            .status,
        200
    );
    assert_eq!(
        fake.state()["arm_protection"][machine.azure_vm_path()],
        false
    );

    let other = path.replace("/virtualMachines/0", "/virtualMachines/9");
    let missing = fake.request("PUT", &other, &auth, Some(&body)).unwrap();
    assert_eq!(missing.status, 404, "{missing:?}");
}

#[test]
fn pod_patch_merges_annotations_and_null_removes() {
    let machine = Machine {
        pod_namespace: "jobs".to_owned(),
        pod_name: "runner-1".to_owned(),
        ..Machine::default()
    };
    let fake = FakeMetadata::start(&machine);
    let path = "/api/v1/namespaces/jobs/pods/runner-1";
    let merge = ("Content-Type", "application/merge-patch+json");
    let auth = ("Authorization", "Bearer sa-token");
    let patch = |annotations: Value| json!({"metadata": {"annotations": annotations}}).to_string();

    let body = patch(json!({"a": "1", "b": "2"}));
    let anonymous = fake.request("PATCH", path, &[merge], Some(&body)).unwrap();
    assert_eq!(anonymous.status, 401, "{anonymous:?}");
    let first = fake
        .request("PATCH", path, &[merge, auth], Some(&body))
        .unwrap();
    assert_eq!(first.status, 200, "{first:?}");
    let pod = first.json().unwrap();
    assert_eq!(pod["metadata"]["annotations"], json!({"a": "1", "b": "2"}));

    let body = patch(json!({"a": null, "c": "3"}));
    let second = fake
        .request("PATCH", path, &[merge, auth], Some(&body))
        .unwrap();
    assert_eq!(
        second.json().unwrap()["metadata"]["annotations"],
        json!({"b": "2", "c": "3"})
    );
    assert_eq!(
        fake.state()["pod_annotations"]["jobs/runner-1"],
        json!({"b": "2", "c": "3"})
    );

    let not_a_string = patch(json!({"d": 4}));
    let bad = fake
        .request("PATCH", path, &[merge, auth], Some(&not_a_string))
        .unwrap();
    assert_eq!(bad.status, 400, "{bad:?}");
    let other = "/api/v1/namespaces/jobs/pods/runner-2";
    let missing = fake
        .request("PATCH", other, &[merge, auth], Some(&body))
        .unwrap();
    assert_eq!(missing.status, 404, "{missing:?}");
    assert_eq!(missing.json().unwrap()["reason"], "NotFound");
}

fn complete_lifecycle(fake: &FakeMetadata, result: &str) -> Answer {
    let form = format!(
        "Action=CompleteLifecycleAction&Version=2011-01-01&AutoScalingGroupName=web\
         &LifecycleHookName=drain&InstanceId=i-0fake0000000000001&LifecycleActionResult={result}"
    );
    fake.request(
        "POST",
        "/",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        Some(&form),
    )
    .unwrap()
}

#[test]
fn complete_lifecycle_action_is_recorded() {
    let fake = FakeMetadata::start(&Machine::default());
    let answer = complete_lifecycle(&fake, "CONTINUE");
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(
        answer.body.starts_with("<CompleteLifecycleActionResponse")
            && answer.body.contains("<RequestId>"),
        "{answer:?}"
    );
    let bad = complete_lifecycle(&fake, "MAYBE");
    assert_eq!(bad.status, 400, "{bad:?}");
    assert!(bad.body.contains("ValidationError"), "{bad:?}");
    assert_eq!(
        fake.state()["lifecycle_completions"],
        json!([{
            "AutoScalingGroupName": "web",
            "LifecycleHookName": "drain",
            "InstanceId": "i-0fake0000000000001",
            "LifecycleActionResult": "CONTINUE",
        }])
    );
}

#[test]
fn other_autoscaling_actions_are_forwarded_to_the_upstream() {
    let Some(moto) = DedicatedMoto::start() else {
        return;
    };
    let machine = Machine {
        autoscaling_upstream: Some(moto.url().to_owned()),
        ..Machine::default()
    };
    let fake = FakeMetadata::start(&machine);
    // moto picks the service from the credential scope of the signature (it checks no more).
    let authorization = "AWS4-HMAC-SHA256 Credential=AKIDFAKE/20250101/us-east-1/autoscaling/\
                         aws4_request, SignedHeaders=host;x-amz-date, Signature=00";
    let answer = fake
        .request(
            "POST",
            "/",
            &[
                ("Content-Type", "application/x-www-form-urlencoded"),
                ("Authorization", authorization),
                ("X-Amz-Date", "20250101T000000Z"),
            ],
            Some("Action=DescribeAutoScalingGroups&Version=2011-01-01"),
        )
        .unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(
        answer.body.contains("<DescribeAutoScalingGroupsResponse")
            && answer.body.contains("<AutoScalingGroups"),
        "{answer:?}"
    );
    // The lifecycle action stays here (moto would answer 500).
    assert_eq!(complete_lifecycle(&fake, "ABANDON").status, 200);
    let completions = &fake.state()["lifecycle_completions"];
    assert_eq!(completions[0]["LifecycleActionResult"], "ABANDON");
}

#[test]
fn without_an_upstream_other_actions_are_refused() {
    let fake = FakeMetadata::start(&Machine::default());
    let answer = fake
        .request(
            "POST",
            "/",
            &[("Content-Type", "application/x-www-form-urlencoded")],
            Some("Action=DescribeAutoScalingGroups&Version=2011-01-01"),
        )
        .unwrap();
    assert_eq!(answer.status, 400, "{answer:?}");
    assert!(answer.body.contains("--autoscaling-upstream"), "{answer:?}");
}

fn gce_get(fake: &FakeMetadata, query: &str, timeout: Duration) -> Result<Answer, String> {
    fake.request_with_timeout(
        "GET",
        &format!("{PREEMPTED}{query}"),
        &[GOOGLE],
        None,
        timeout,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gce_hanging_get_returns_on_change_or_a_different_etag() {
    let fake = Arc::new(FakeMetadata::start(&Machine::default()));
    let ten = Duration::from_secs(10);
    let missing_flavor = fake.request("GET", PREEMPTED, &[], None).unwrap();
    assert_eq!(missing_flavor.status, 403);
    let first = gce_get(&fake, "", ten).unwrap();
    assert_eq!(first.body, "FALSE");
    let etag = first.header("ETag").unwrap().to_owned();
    // Unchanged value: answered after timeout_sec with the same value and ETag.
    let timed_out = gce_get(
        &fake,
        &format!("?wait_for_change=true&last_etag={etag}&timeout_sec=1"),
        ten,
    )
    .unwrap();
    assert_eq!(
        (timed_out.body.as_str(), timed_out.header("ETag")),
        ("FALSE", Some(etag.as_str()))
    );

    let waiting = {
        let fake = Arc::clone(&fake);
        let query = format!("?wait_for_change=true&last_etag={etag}&timeout_sec=60");
        tokio::task::spawn_blocking(move || gce_get(&fake, &query, Duration::from_secs(60)))
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "the hanging GET answered before any change"
    );
    fake.raise(json!({"cloud": "gcp", "kind": "preempted"}));
    let changed = tokio::time::timeout(ten, waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(changed.body, "TRUE");
    let new_etag = changed.header("ETag").unwrap();
    assert_ne!(new_etag, etag);

    // An old ETag: the current value at once (well within its 60 s).
    let stale = gce_get(
        &fake,
        &format!("?wait_for_change=true&last_etag={etag}&timeout_sec=60"),
        ten,
    )
    .unwrap();
    assert_eq!(stale.body, "TRUE");

    let maintenance = "/computeMetadata/v1/instance/maintenance-event";
    assert_eq!(get(&fake, maintenance, &[GOOGLE]).body, "NONE");
    fake.raise(json!({"cloud": "gcp", "kind": "maintenance"}));
    let event = get(&fake, maintenance, &[GOOGLE]);
    assert_eq!(event.body, "TERMINATE_ON_HOST_MAINTENANCE");
    assert!(event.header("ETag").is_some());
    let id = get(&fake, "/computeMetadata/v1/instance/id", &[GOOGLE]);
    assert_eq!(id.body, "1000000000000000001");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_hang_garbage_and_fail_only_their_prefix() {
    let fake = Arc::new(FakeMetadata::start(&Machine::default()));
    let token = imds_token(&fake);
    let faults = fake.fault(json!({"prefix": "/latest/meta-data/spot", "mode": "hang"}));
    assert_eq!(faults["faults"]["/latest/meta-data/spot"], "hang");
    let header = [("x-aws-ec2-metadata-token", token.as_str())];

    let short = fake.request_with_timeout("GET", SPOT, &header, None, Duration::from_secs(1));
    assert!(short.is_err(), "a hung path answered: {short:?}");
    let hanging = {
        let fake = Arc::clone(&fake);
        let token = token.clone();
        tokio::task::spawn_blocking(move || {
            let header = [("x-aws-ec2-metadata-token", token.as_str())];
            fake.request_with_timeout("GET", SPOT, &header, None, Duration::from_secs(60))
        })
    };
    // Other paths answer meanwhile.
    assert_eq!(imds_get(&fake, &token, "instance-id").status, 200);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!hanging.is_finished());
    fake.fault(json!({"prefix": "/latest/meta-data/spot", "mode": "none"}));
    let released = tokio::time::timeout(Duration::from_secs(10), hanging)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(released.status, 404, "{released:?}");

    fake.fault(json!({"prefix": "/latest/meta-data/spot", "mode": "garbage"}));
    let garbage = imds_get(&fake, &token, "spot/instance-action");
    assert_eq!(
        (garbage.status, garbage.body.as_str()),
        (200, "<html>not json")
    );
    fake.fault(json!({"prefix": "/metadata/", "mode": "status500"}));
    assert_eq!(get(&fake, EVENTS, &[AZURE]).status, 500);
    assert_eq!(imds_get(&fake, &token, "instance-id").status, 200);
    let state = fake.state();
    assert_eq!(
        state["faults"],
        json!({"/latest/meta-data/spot": "garbage", "/metadata/": "status500"})
    );
    let refused = fake
        .request(
            "POST",
            "/_fault",
            &[],
            Some(r#"{"prefix":"x","mode":"hang"}"#),
        )
        .unwrap();
    assert_eq!(refused.status, 400);
}

#[test]
fn machine_identity_changes_while_running() {
    let fake = FakeMetadata::start(&Machine::default());
    let token = imds_token(&fake);
    let now = fake.machine(json!({"aws_instance_id": "i-0second000000000002"}));
    assert_eq!(now["aws_instance_id"], "i-0second000000000002");
    assert_eq!(
        imds_get(&fake, &token, "instance-id").body,
        "i-0second000000000002"
    );
    let unknown = fake
        .request("POST", "/_machine", &[], Some(r#"{"color":"red"}"#))
        .unwrap();
    assert_eq!(unknown.status, 400, "{unknown:?}");
}

#[test]
fn https_port_is_served_with_a_certificate_of_its_ca() {
    let fake = FakeMetadata::start(&Machine::default());
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--cacert"])
        .arg(fake.ca_file())
        .arg(format!("{}/_healthz", fake.https_url()))
        .output()
        .expect("curl (used by scripts/emulators too) must be installed");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok");
}
