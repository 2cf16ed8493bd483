//! EC2 Auto Scaling on a dedicated moto, for the tests of scale-in protection and lifecycle
//! hooks: moto's Auto Scaling is a real implementation of groups, their instances and a
//! scale-in that honours protection (its lifecycle hooks are inert and its
//! `CompleteLifecycleAction` answers 500: the fake metadata service, [`crate::metadata`],
//! plays that one call).
//!
//! The calls are plain form POSTs: moto checks no signature, but picks the service from the
//! credential scope of the `Authorization` header, which these requests carry.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr
)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::docs::repository;

/// How long one call may take.
const CALL_LIMIT: Duration = Duration::from_secs(30);

/// A moto of its own (`scripts/emulators instance start moto DIR --empty`), with its data in a
/// temporary folder; stopped on drop (and by `scripts/emulators` if this process dies first).
pub struct DedicatedMoto {
    dir: tempfile::TempDir,
    url: String,
}

impl DedicatedMoto {
    /// Starts one. `None` (the test skips) only if it cannot start and `LEADER_ALLOW_SKIP=1`;
    /// otherwise a failure to start fails the test.
    pub fn start() -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new(repository().join("scripts/emulators"))
            .args(["instance", "start", "moto"])
            .arg(instance_dir(&dir))
            .args(["--empty", "--owner", &std::process::id().to_string()])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let url = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .trim()
            .to_owned();
        if !out.status.success() || !url.starts_with("http://127.0.0.1:") {
            let why = String::from_utf8_lossy(&out.stderr).into_owned();
            if std::env::var(crate::ALLOW_SKIP_VAR).as_deref() == Ok("1") {
                eprintln!("SKIPPED: no moto: {why}");
                return None;
            }
            panic!(
                "scripts/emulators instance start moto: {why} (set {}=1 to skip)",
                crate::ALLOW_SKIP_VAR
            );
        }
        Some(Self { dir, url })
    }

    /// Its endpoint: `http://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Its Auto Scaling API.
    pub fn api(&self) -> MotoApi {
        MotoApi::new(&self.url)
    }
}

fn instance_dir(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("moto")
}

impl Drop for DedicatedMoto {
    fn drop(&mut self) {
        let _ = Command::new(repository().join("scripts/emulators"))
            .args(["instance", "stop"])
            .arg(instance_dir(&self.dir))
            .stdin(Stdio::null())
            .output();
    }
}

/// The Query APIs of a moto at `url` (EC2 for a launch template, Auto Scaling), as a test
/// drives them: every call must answer 200, or the test fails.
#[derive(Clone, Debug)]
pub struct MotoApi {
    url: String,
}

impl MotoApi {
    /// The API of the moto at `url` (`http://127.0.0.1:PORT`).
    pub fn new(url: &str) -> Self {
        Self {
            url: url.trim_end_matches('/').to_owned(),
        }
    }

    /// A Query call of `service` (`ec2`, `autoscaling`): the answer's body.
    pub fn call(&self, service: &str, params: &[(&str, &str)]) -> String {
        let authority = self.url.trim_start_matches("http://");
        let body: Vec<String> = params
            .iter()
            .map(|(k, v)| format!("{}={}", form_encode(k), form_encode(v)))
            .collect();
        let body = body.join("&");
        let mut stream = TcpStream::connect(authority).unwrap();
        stream.set_read_timeout(Some(CALL_LIMIT)).unwrap();
        write!(
            stream,
            "POST / HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\
             Content-Type: application/x-www-form-urlencoded\r\n\
             Authorization: AWS4-HMAC-SHA256 Credential=AKIDTEST/20240101/us-east-1/{service}/\
             aws4_request, SignedHeaders=host, Signature=00\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        let status = answer.split_whitespace().nth(1).unwrap_or_default();
        assert_eq!(status, "200", "{params:?}: {answer}");
        answer
    }

    /// An Auto Scaling action (API version 2011-01-01).
    pub fn autoscaling(&self, action: &str, params: &[(&str, &str)]) -> String {
        let mut all = vec![("Action", action), ("Version", "2011-01-01")];
        all.extend_from_slice(params);
        self.call("autoscaling", &all)
    }

    /// A launch template and an Auto Scaling group of `size`, both named `name`, in
    /// us-east-1a: the group's instances, in moto's order (the order its scale-in follows).
    pub fn group(&self, name: &str, size: usize) -> Vec<String> {
        self.call(
            "ec2",
            &[
                ("Action", "CreateLaunchTemplate"),
                ("Version", "2016-11-15"),
                ("LaunchTemplateName", name),
                ("LaunchTemplateData.ImageId", "ami-12c6146b"),
                ("LaunchTemplateData.InstanceType", "t3.micro"),
            ],
        );
        let size = size.to_string();
        self.autoscaling(
            "CreateAutoScalingGroup",
            &[
                ("AutoScalingGroupName", name),
                ("LaunchTemplate.LaunchTemplateName", name),
                ("LaunchTemplate.Version", "$Latest"),
                ("MinSize", "0"),
                ("MaxSize", &size),
                ("DesiredCapacity", &size),
                ("AvailabilityZones.member.1", "us-east-1a"),
            ],
        );
        let instances = self.instances(name);
        assert_eq!(instances.len().to_string(), size, "{instances:?}");
        instances
    }

    /// The instances of `group`, in moto's order.
    pub fn instances(&self, group: &str) -> Vec<String> {
        let xml = self.autoscaling(
            "DescribeAutoScalingGroups",
            &[("AutoScalingGroupNames.member.1", group)],
        );
        xml_values(&xml, "InstanceId")
    }

    /// Whether moto has `instance` protected from scale-in (`DescribeAutoScalingInstances`).
    pub fn protected(&self, instance: &str) -> bool {
        let xml = self.autoscaling(
            "DescribeAutoScalingInstances",
            &[("InstanceIds.member.1", instance)],
        );
        match xml_values(&xml, "ProtectedFromScaleIn").as_slice() {
            [flag] => flag == "true",
            other => panic!("{instance}: {other:?} in {xml}"),
        }
    }

    /// Sets or clears `instance`'s protection, as an operator (or a crashed leader) would.
    pub fn set_protected(&self, group: &str, instance: &str, on: bool) {
        self.autoscaling(
            "SetInstanceProtection",
            &[
                ("AutoScalingGroupName", group),
                ("InstanceIds.member.1", instance),
                ("ProtectedFromScaleIn", if on { "true" } else { "false" }),
            ],
        );
    }

    /// A scale-in (or out) to `capacity`: moto removes unprotected instances at once.
    pub fn set_desired_capacity(&self, group: &str, capacity: usize) {
        let capacity = capacity.to_string();
        self.autoscaling(
            "SetDesiredCapacity",
            &[
                ("AutoScalingGroupName", group),
                ("DesiredCapacity", &capacity),
            ],
        );
    }
}

/// `s`, percent-encoded for a form body (every byte but the unreserved ones).
fn form_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The text of each `<tag>` of `xml` (the few plain elements the tests read).
pub fn xml_values(xml: &str, tag: &str) -> Vec<String> {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    xml.split(&open)
        .skip(1)
        .filter_map(|rest| rest.split_once(&close).map(|(v, _)| v.to_owned()))
        .collect()
}
