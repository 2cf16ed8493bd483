//! A fake of the cloud instance-metadata services, one process per simulated machine.
//!
//! [`FakeMetadata::start`] runs `scripts/fake_identity.py` on two free loopback ports (plain HTTP
//! and HTTPS, one state) for one [`Machine`]: the AWS instance metadata service (IMDSv2), the
//! Azure instance metadata service (compute metadata, scheduled events, managed identity), the
//! GCE metadata server (with ETags and hanging GETs), and the few control-plane calls a machine
//! makes about itself (Azure ARM scale-in protection of its VM, a PATCH of its Kubernetes pod,
//! Auto Scaling's `CompleteLifecycleAction`). It is a FAKE of the metadata services, not a store
//! and not an emulator of a cloud: it plays what the machine sees, lets a test raise the notices
//! a cloud gives before it takes a machine away ([`raise`](FakeMetadata::raise)), break paths
//! ([`fault`](FakeMetadata::fault)), and read back what the machine was asked to do
//! ([`state`](FakeMetadata::state)). The script's docstring lists every path and control body.
//!
//! The HTTPS port serves the server certificate of the test CA of `scripts/emulators` (next to
//! `LEADER_TEST_CA_FILE`, else in `.emulators/tls/`); when the emulators never ran, a CA of the
//! fakes' own, made once into `$TMPDIR/leader-fake-metadata-tls/`. Trust
//! [`FakeMetadata::ca_file`], whichever it is.
//!
//! Auto Scaling actions other than the lifecycle ones go to [`Machine::autoscaling_upstream`]
//! (a moto, which answers the lifecycle actions with 500). The process is killed when the
//! [`FakeMetadata`] is dropped.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

/// How long [`FakeMetadata::start`] waits for the ready line.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// The timeout of [`FakeMetadata::request`] (connect, write, and each read).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The identity of the simulated machine (each a flag of `scripts/fake_identity.py`; also
/// changeable while it runs with [`FakeMetadata::machine`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Machine {
    /// The EC2 instance id (`/latest/meta-data/instance-id`).
    pub aws_instance_id: String,
    /// The AWS region (`/latest/meta-data/placement/region`).
    pub aws_region: String,
    /// The Azure VM name (`compute.name`, and the default `Resources` of scheduled events).
    pub azure_vm_name: String,
    /// The Azure subscription id.
    pub azure_subscription: String,
    /// The Azure resource group.
    pub azure_resource_group: String,
    /// The name of the Azure scale set the VM belongs to.
    pub azure_scale_set: String,
    /// The VM's instance id in its scale set.
    pub azure_instance_id: String,
    /// The namespace of the machine's Kubernetes pod.
    pub pod_namespace: String,
    /// The name of the machine's Kubernetes pod.
    pub pod_name: String,
    /// The GCE instance id (`/computeMetadata/v1/instance/id`).
    pub gce_instance_id: String,
    /// Where Auto Scaling actions other than `CompleteLifecycleAction` and
    /// `RecordLifecycleActionHeartbeat` are forwarded (a moto endpoint, `http://127.0.0.1:P`).
    pub autoscaling_upstream: Option<String>,
}

impl Default for Machine {
    fn default() -> Self {
        Self {
            aws_instance_id: "i-0fake0000000000001".to_owned(),
            aws_region: "us-east-1".to_owned(),
            azure_vm_name: "vmss_0".to_owned(),
            azure_subscription: "00000000-0000-0000-0000-000000000000".to_owned(),
            azure_resource_group: "rg".to_owned(),
            azure_scale_set: "vmss".to_owned(),
            azure_instance_id: "0".to_owned(),
            pod_namespace: "default".to_owned(),
            pod_name: "pod-0".to_owned(),
            gce_instance_id: "1000000000000000001".to_owned(),
            autoscaling_upstream: None,
        }
    }
}

impl Machine {
    /// The ARM resource path of the VM (the key of `arm_protection` in [`FakeMetadata::state`]).
    pub fn azure_vm_path(&self) -> String {
        format!(
            "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Compute/\
             virtualMachineScaleSets/{}/virtualMachines/{}",
            self.azure_subscription,
            self.azure_resource_group,
            self.azure_scale_set,
            self.azure_instance_id
        )
    }

    /// The script's flags for this machine.
    fn args(&self) -> Vec<String> {
        let mut args = Vec::new();
        for (flag, value) in [
            ("--aws-instance-id", &self.aws_instance_id),
            ("--aws-region", &self.aws_region),
            ("--azure-vm-name", &self.azure_vm_name),
            ("--azure-subscription", &self.azure_subscription),
            ("--azure-resource-group", &self.azure_resource_group),
            ("--azure-scale-set", &self.azure_scale_set),
            ("--azure-instance-id", &self.azure_instance_id),
            ("--pod-namespace", &self.pod_namespace),
            ("--pod-name", &self.pod_name),
            ("--gce-instance-id", &self.gce_instance_id),
        ] {
            args.push(flag.to_owned());
            args.push(value.clone());
        }
        if let Some(upstream) = &self.autoscaling_upstream {
            args.push("--autoscaling-upstream".to_owned());
            args.push(upstream.clone());
        }
        args
    }
}

/// An HTTP answer of the fake (see [`FakeMetadata::request`]).
#[derive(Clone, Debug)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// The headers, in order, names as sent.
    pub headers: Vec<(String, String)>,
    /// The body (lossy UTF-8).
    pub body: String,
}

impl Answer {
    /// The first header called `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON.
    ///
    /// # Errors
    /// The body is not JSON.
    pub fn json(&self) -> Result<Value, String> {
        serde_json::from_str(&self.body).map_err(|e| format!("not JSON ({e}): {}", self.body))
    }
}

/// The TLS files the fake serves with, and the CA that signed them.
#[derive(Clone, Debug)]
struct TlsFiles {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl TlsFiles {
    fn in_dir(dir: &Path) -> Option<Self> {
        let files = Self {
            ca: dir.join("ca.pem"),
            cert: dir.join("server.pem"),
            key: dir.join("server-key.pem"),
        };
        (files.ca.is_file() && files.cert.is_file() && files.key.is_file()).then_some(files)
    }
}

/// This checkout's root.
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from(".."), Path::to_path_buf)
}

/// The test CA of `scripts/emulators` (beside `LEADER_TEST_CA_FILE`, else in
/// `.emulators/tls/`); without one, the fakes' own CA in `$TMPDIR/leader-fake-metadata-tls/`,
/// made once by `scripts/test_ca.py` and kept for later runs.
fn tls_files() -> Result<TlsFiles, String> {
    static FILES: OnceLock<Result<TlsFiles, String>> = OnceLock::new();
    FILES
        .get_or_init(|| {
            let from_env = std::env::var_os("LEADER_TEST_CA_FILE")
                .map(PathBuf::from)
                .and_then(|ca| ca.parent().and_then(TlsFiles::in_dir));
            let emulators = || TlsFiles::in_dir(&repo_root().join(".emulators/tls"));
            let shared = std::env::temp_dir().join("leader-fake-metadata-tls");
            if let Some(files) = from_env
                .or_else(emulators)
                .or_else(|| TlsFiles::in_dir(&shared))
            {
                return Ok(files);
            }
            // Made aside and renamed into place: a concurrent test process that made its own
            // first wins, and both use the winner's.
            let mine = std::env::temp_dir()
                .join(format!("leader-fake-metadata-tls-{}", std::process::id()));
            make_test_ca(&mine)?;
            if std::fs::rename(&mine, &shared).is_err() {
                let _ = std::fs::remove_dir_all(&mine);
            }
            TlsFiles::in_dir(&shared)
                .ok_or_else(|| format!("no test CA in {} after making one", shared.display()))
        })
        .clone()
}

/// Runs `scripts/test_ca.py DIR` (with the emulators' venv if installed: it needs
/// `cryptography`).
fn make_test_ca(dir: &Path) -> Result<(), String> {
    let venv = repo_root().join(".emulators/venv/bin/python");
    let python = if venv.is_file() {
        venv
    } else {
        PathBuf::from("python3")
    };
    let output = Command::new(&python)
        .arg(repo_root().join("scripts/test_ca.py"))
        .arg(dir)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running {} scripts/test_ca.py: {e}", python.display()))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "scripts/test_ca.py {} failed: {}",
            dir.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// A running fake of the metadata services of one simulated machine (see the module docs).
/// Killed, and waited for, when dropped.
#[derive(Debug)]
pub struct FakeMetadata {
    child: Child,
    http_port: u16,
    https_port: u16,
    ca_file: PathBuf,
    log_file: PathBuf,
}

impl FakeMetadata {
    /// Starts the fake for `machine`; fails the calling test if it does not come up.
    #[allow(
        clippy::panic,
        reason = "a test helper: failing the test with a message is its job"
    )]
    pub fn start(machine: &Machine) -> Self {
        match Self::try_start(machine) {
            Ok(fake) => fake,
            Err(error) => panic!("could not start the fake metadata service: {error}"),
        }
    }

    /// Starts the fake for `machine`: `python3 scripts/fake_identity.py` on free ports, with the
    /// test CA's server certificate; returns once it printed its ready line.
    ///
    /// # Errors
    /// No TLS material, the process did not start, or it did not say it is ready in 30 s.
    pub fn try_start(machine: &Machine) -> Result<Self, String> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let tls = tls_files()?;
        let log_file = std::env::temp_dir().join(format!(
            "leader-fake-metadata-{}-{}.log",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let log = File::create(&log_file).map_err(|e| format!("{}: {e}", log_file.display()))?;
        let mut child = Command::new("python3")
            .arg(repo_root().join("scripts/fake_identity.py"))
            .args(["--host", "127.0.0.1", "--port", "0", "--tls-port", "0"])
            .arg("--cert")
            .arg(&tls.cert)
            .arg("--key")
            .arg(&tls.key)
            .args(machine.args())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("running python3 scripts/fake_identity.py: {e}"))?;
        let ready = child
            .stdout
            .take()
            .ok_or_else(|| "no stdout pipe".to_owned())
            .and_then(wait_ready);
        match ready {
            Ok((http_port, https_port)) => Ok(Self {
                child,
                http_port,
                https_port,
                ca_file: tls.ca,
                log_file,
            }),
            Err(error) => {
                let _ = child.kill();
                let _ = child.wait();
                let log = std::fs::read_to_string(&log_file).unwrap_or_default();
                let _ = std::fs::remove_file(&log_file);
                Err(format!("{error}; its log:\n{log}"))
            }
        }
    }

    /// `http://127.0.0.1:PORT`: the plain-HTTP port (the metadata services are plain HTTP).
    pub fn http_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.http_port)
    }

    /// `https://127.0.0.1:PORT`: the same state over HTTPS, with a certificate for 127.0.0.1
    /// signed by [`ca_file`](Self::ca_file) (for ARM and the Kubernetes API).
    pub fn https_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.https_port)
    }

    /// `127.0.0.1:PORT` of the plain-HTTP port (the form of `GCE_METADATA_HOST`).
    pub fn authority(&self) -> String {
        format!("127.0.0.1:{}", self.http_port)
    }

    /// The HTTPS port (for `KUBERNETES_SERVICE_PORT`).
    pub fn https_port(&self) -> u16 {
        self.https_port
    }

    /// The CA that signed the HTTPS certificate: `LEADER_TEST_CA_FILE` when `scripts/emulators`
    /// set it up, else `.emulators/tls/ca.pem`, else the fakes' own (see the module docs).
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// The fake's log (one line per request); removed on drop unless the test is failing.
    pub fn log_file(&self) -> &Path {
        &self.log_file
    }

    /// Raises a notice (`POST /_notice`), e.g. `{"cloud":"aws","kind":"spot"}`,
    /// `{"cloud":"azure","type":"Terminate"}` (the answer's `event_id` is the event's id),
    /// `{"cloud":"gcp","kind":"preempted"}`; `"in": SECONDS` raises it later, `"clear": true`
    /// withdraws it. Returns the fake's record of it; fails the test if the fake refuses it.
    pub fn raise(&self, notice: Value) -> Value {
        self.control("POST", "/_notice", Some(&notice))
    }

    /// Sets a fault (`POST /_fault`): `{"prefix":"/latest/meta-data/spot","mode":"hang"}`
    /// (also `garbage`, `status500`, and `none` to clear). Returns the faults now set.
    pub fn fault(&self, fault: Value) -> Value {
        self.control("POST", "/_fault", Some(&fault))
    }

    /// Changes the machine's identity (`POST /_machine`, keys as the fields of [`Machine`]
    /// without `autoscaling_upstream`); returns the identity now.
    pub fn machine(&self, changes: Value) -> Value {
        self.control("POST", "/_machine", Some(&changes))
    }

    /// What the machine was asked to do and what it sees (`GET /_state`): `azure_approvals`,
    /// `lifecycle_completions`, `lifecycle_heartbeats`, `arm_protection`, `pod_annotations`,
    /// `notices`, and the current `aws`/`azure`/`gcp` notice state, `faults`, `machine`.
    pub fn state(&self) -> Value {
        self.control("GET", "/_state", None)
    }

    /// Every request the fake answered (`GET /_calls`; secrets redacted).
    pub fn calls(&self) -> Vec<Value> {
        match self.control("GET", "/_calls", None) {
            Value::Array(calls) => calls,
            _ => Vec::new(),
        }
    }

    #[allow(
        clippy::panic,
        reason = "a test helper: failing the test with a message is its job"
    )]
    fn control(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        let text = body.map(Value::to_string);
        let headers: &[(&str, &str)] = if text.is_some() {
            &[("Content-Type", "application/json")]
        } else {
            &[]
        };
        let answer = self
            .request(method, path, headers, text.as_deref())
            .and_then(|a| {
                if a.status == 200 {
                    a.json()
                } else {
                    Err(format!("status {}: {}", a.status, a.body))
                }
            });
        match answer {
            Ok(value) => value,
            Err(error) => panic!("fake metadata {method} {path}: {error}"),
        }
    }

    /// One plain-HTTP request to the fake (`path` with its query), with the default timeout.
    ///
    /// # Errors
    /// No connection, a timeout, or an answer that is not HTTP.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> Result<Answer, String> {
        self.request_with_timeout(method, path, headers, body, REQUEST_TIMEOUT)
    }

    /// [`request`](Self::request) with `timeout` for the connect, the write and each read (an
    /// `Err` after it: how a test sees that a request hangs).
    ///
    /// # Errors
    /// No connection, a timeout, or an answer that is not HTTP.
    pub fn request_with_timeout(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
        timeout: Duration,
    ) -> Result<Answer, String> {
        http_request(self.http_port, method, path, headers, body, timeout)
            .map_err(|e| format!("{method} {}{path}: {e}", self.http_url()))
    }
}

impl Drop for FakeMetadata {
    #[allow(
        clippy::print_stderr,
        reason = "a test helper: tells where the log of a failing test is"
    )]
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "the fake metadata service's log is in {}",
                self.log_file.display()
            );
        } else {
            let _ = std::fs::remove_file(&self.log_file);
        }
    }
}

/// Reads the script's stdout until `ready http=P https=Q` (in a thread: a pipe read cannot time
/// out), and returns the two ports.
fn wait_ready(stdout: std::process::ChildStdout) -> Result<(u16, u16), String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(ports) = parse_ready(&line) {
                let _ = tx.send(Ok(ports));
                return;
            }
            seen.push(line);
        }
        let _ = tx.send(Err(format!(
            "it exited before its ready line (stdout: {seen:?})"
        )));
    });
    rx.recv_timeout(READY_TIMEOUT)
        .map_err(|_| format!("no ready line within {READY_TIMEOUT:?}"))?
}

fn parse_ready(line: &str) -> Option<(u16, u16)> {
    let rest = line.strip_prefix("ready ")?;
    let mut http = None;
    let mut https = None;
    for word in rest.split_whitespace() {
        if let Some(port) = word.strip_prefix("http=") {
            http = port.parse().ok();
        } else if let Some(port) = word.strip_prefix("https=") {
            https = port.parse().ok();
        }
    }
    Some((http?, https?))
}

/// A blocking HTTP/1.1 request on loopback, `Connection: close`, the whole answer read.
fn http_request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
    timeout: Duration,
) -> Result<Answer, String> {
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&address, timeout).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| e.to_string())?;
    let body = body.unwrap_or("");
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\
         Content-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream
        .write_all(request.as_bytes())
        .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).map_err(|e| e.to_string())?;
    parse_answer(&raw)
}

fn parse_answer(raw: &[u8]) -> Result<Answer, String> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("not an HTTP answer: {text:?}"))?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("no status line: {head:?}"))?;
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Ok(Answer {
        status,
        headers,
        body: body.to_owned(),
    })
}
