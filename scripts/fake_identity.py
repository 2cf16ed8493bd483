"""A FAKE of the cloud identity and instance-metadata endpoints, for the tests. Never use it
outside tests: it hands a token to anyone who asks.

The stores in the tests are the real emulators (moto, Azurite, fake-gcs-server); what no
emulator offers is the machine itself: the metadata services and token endpoints that the SDKs'
credential chains call, and the notices a cloud gives a machine before it takes it away (spot
interruption, scale-in, preemption, maintenance). This server plays them for ONE simulated
machine, over plain HTTP and HTTPS on two ports (one state), and records every request so that a
test can check that the code really went through the path it claims to test. It is a fake of the
metadata services, not a store: its state lives in memory and dies with the process.

Usage: fake_identity.py --host 127.0.0.1 --port P --tls-port Q --cert PEM --key PEM
                        [--identity-header SECRET] [--autoscaling-upstream URL]
                        [--aws-instance-id ID] [--aws-region R] [--azure-vm-name NAME]
                        [--azure-subscription S] [--azure-resource-group RG]
                        [--azure-scale-set VMSS] [--azure-instance-id N]
                        [--pod-namespace NS] [--pod-name NAME] [--gce-instance-id N]
With P or Q 0 it takes free ports. Once both listen it prints one line to stdout, flushed:
`ready http=P https=Q` (the ports it got).

Endpoints (the request and answer formats the SDKs and clouds use):
  AWS EC2 IMDSv2    PUT /latest/api/token; then, with the token, GET /latest/meta-data/...:
                    iam/security-credentials/[ROLE], placement/region, placement/availability-zone,
                    instance-id, spot/instance-action (404 until raised),
                    events/recommendations/rebalance (404 until raised),
                    autoscaling/target-lifecycle-state (InService; Terminated once raised)
  Auto Scaling      POST / (form, Action=...): CompleteLifecycleAction and
                    RecordLifecycleActionHeartbeat are recorded and answered here (moto answers
                    them 500); every other Action is forwarded as is to --autoscaling-upstream
  Entra ID          POST /{tenant}/oauth2/v2.0/token (client assertion -> a JWT that Azurite's
                    OAuth mode accepts: it checks claims, not signatures)
  App Service MI    GET /msi/token?api-version=2019-08-01&resource=... (x-identity-header)
  Azure IMDS        (header Metadata: true, else 400) GET /metadata/instance,
                    /metadata/instance/compute[/FIELD][?format=text],
                    GET|POST /metadata/scheduledevents (events; POST {"StartRequests":[...]}),
                    GET /metadata/identity/oauth2/token?resource=... (managed identity)
  Azure ARM         GET|PUT /subscriptions/{s}/resourceGroups/{rg}/providers/Microsoft.Compute/
                    virtualMachineScaleSets/{vmss}/virtualMachines/{id} (Bearer token of the
                    managed identity path; the PUT records properties.protectionPolicy)
  Kubernetes API    GET|PATCH /api/v1/namespaces/{ns}/pods/{name} (Bearer; merge patch of the
                    pod's annotations, null removes one)
  GCE metadata      GET /computeMetadata/v1/... (Metadata-Flavor: Google), with ETag and hanging
                    GETs (?wait_for_change=true&last_etag=E&timeout_sec=N) on instance/preempted
                    and instance/maintenance-event
  Google STS        POST /v1/token (token exchange, for external_account credentials)
  for the tests     GET /_calls (the request log; secrets redacted), POST /_reset (clears it),
                    GET /_healthz, GET /_state (what the machine was asked to do),
                    POST /_notice (raise a notice, optionally "in": SECONDS later; "clear": true
                    withdraws it), POST /_fault ({"prefix":..., "mode": hang|garbage|status500|
                    none}), GET|POST /_machine (the machine's identity)

/_notice bodies: {"cloud":"aws","kind":"spot"|"rebalance"|"lifecycle"};
{"cloud":"azure","type":"Preempt"|"Terminate"|"Reboot"|"Redeploy"|"Freeze","resources":[...]}
(resources default to this VM's name; the answer carries the generated "event_id"; "clear" takes
an optional "event_id", else every event goes); {"cloud":"gcp","kind":"preempted"|"maintenance"}
("value" sets another maintenance-event value, e.g. MIGRATE_ON_HOST_MAINTENANCE).
"""

from __future__ import annotations

import argparse
import base64
import datetime
import email.utils
import hashlib
import json
import secrets
import signal
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import urllib.error
import urllib.request
import uuid
from typing import Any
from urllib.parse import parse_qs, urlsplit

AWS_ROLE = "leader-test-role"
AWS_KEY_ID = "AKIAFAKEIMDS0000001"
REDACTED_HEADERS = {"authorization", "x-identity-header", "x-aws-ec2-metadata-token"}
HASHED_FIELDS = {"client_assertion", "subject_token"}
FAKE_OID = "00000000-0000-4000-8000-000000000001"
HANG_LIMIT = 120.0  # seconds a "hang" fault holds a request at most
GCE_WAIT_DEFAULT = 60.0  # timeout_sec of a hanging GET that names none
AUTOSCALING_XMLNS = "http://autoscaling.amazonaws.com/doc/2011-01-01/"
FAULT_MODES = ("hang", "garbage", "status500", "none")
# The machine's identity: flag --NAME-WITH-DASHES, key in POST /_machine.
MACHINE_DEFAULTS = {
    "aws_instance_id": "i-0fake0000000000001",
    "aws_region": "us-east-1",
    "azure_vm_name": "vmss_0",
    "azure_subscription": "00000000-0000-0000-0000-000000000000",
    "azure_resource_group": "rg",
    "azure_scale_set": "vmss",
    "azure_instance_id": "0",
    "pod_namespace": "default",
    "pod_name": "pod-0",
    "gce_instance_id": "1000000000000000001",
}
# How long before the event an Azure scheduled event is announced (its NotBefore), per type.
AZURE_LEAD_SECONDS = {"Preempt": 30, "Terminate": 300, "Reboot": 900, "Redeploy": 600, "Freeze": 900}
GCE_WATCHED = {
    "/computeMetadata/v1/instance/preempted": "preempted",
    "/computeMetadata/v1/instance/maintenance-event": "maintenance",
}


class State:
    """Everything the fake knows, behind one lock; `changed` wakes the hanging requests."""

    def __init__(self, identity_header: str, machine: dict[str, str], upstream: str | None) -> None:
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.calls: list[dict[str, Any]] = []
        self.imds_tokens: set[str] = set()
        self.identity_header = identity_header
        self.machine = dict(machine)
        self.upstream = upstream
        # notices, as the machine sees them
        self.aws_spot: dict[str, str] | None = None
        self.aws_rebalance: dict[str, str] | None = None
        self.aws_lifecycle = "InService"
        self.azure_events: list[dict[str, Any]] = []
        self.azure_incarnation = 1
        self.gce = {"preempted": "FALSE", "maintenance": "NONE"}
        # faults: path prefix -> mode
        self.faults: dict[str, str] = {}
        # what the machine was asked to do
        self.notices: list[dict[str, Any]] = []
        self.azure_approvals: list[str] = []
        self.azure_mi_tokens: set[str] = set()
        self.lifecycle_completions: list[dict[str, str]] = []
        self.lifecycle_heartbeats: list[dict[str, str]] = []
        self.arm_protection: dict[str, bool] = {}
        self.pods: dict[str, dict[str, Any]] = {}

    # The helpers below expect the lock to be held.

    def vm_path(self) -> str:
        m = self.machine
        return (f"/subscriptions/{m['azure_subscription']}/resourceGroups/{m['azure_resource_group']}"
                f"/providers/Microsoft.Compute/virtualMachineScaleSets/{m['azure_scale_set']}"
                f"/virtualMachines/{m['azure_instance_id']}")

    def pod(self) -> dict[str, Any]:
        """This machine's pod (created on first use: the identity may change before)."""
        key = f"{self.machine['pod_namespace']}/{self.machine['pod_name']}"
        if key not in self.pods:
            self.pods[key] = {
                "kind": "Pod",
                "apiVersion": "v1",
                "metadata": {
                    "name": self.machine["pod_name"],
                    "namespace": self.machine["pod_namespace"],
                    "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, key)),
                    "resourceVersion": "1",
                    "annotations": {},
                },
                "spec": {"nodeName": "fake-node"},
                "status": {"phase": "Running"},
            }
        return self.pods[key]

    def snapshot(self) -> dict[str, Any]:
        return {
            "azure_approvals": list(self.azure_approvals),
            "lifecycle_completions": [dict(c) for c in self.lifecycle_completions],
            "lifecycle_heartbeats": [dict(c) for c in self.lifecycle_heartbeats],
            "arm_protection": dict(self.arm_protection),
            "pod_annotations": {
                key: dict(pod["metadata"].get("annotations") or {}) for key, pod in self.pods.items()
            },
            "notices": [dict(n) for n in self.notices],
            "aws": {"spot": self.aws_spot, "rebalance": self.aws_rebalance,
                    "lifecycle_state": self.aws_lifecycle},
            "azure": {"incarnation": self.azure_incarnation,
                      "events": [dict(e) for e in self.azure_events]},
            "gcp": dict(self.gce),
            "faults": dict(self.faults),
            "machine": dict(self.machine),
        }


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def fake_jwt(tenant: str, app_id: str, audience: str = "https://storage.azure.com") -> str:
    now = int(time.time())
    header = {"alg": "RS256", "typ": "JWT"}
    payload = {
        "aud": audience,
        "iss": f"https://sts.windows.net/{tenant}/",
        "iat": now - 60,
        "nbf": now - 60,
        "exp": now + 3600,
        "tid": tenant,
        "appid": app_id,
        "oid": FAKE_OID,
        "sub": FAKE_OID,
        "fake": "leader-lease fake identity",
    }
    parts = [json.dumps(p, separators=(",", ":")).encode() for p in (header, payload)]
    return ".".join([b64url(parts[0]), b64url(parts[1]), b64url(b"not-a-signature")])


def rfc3339(t: datetime.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def etag(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge, null removes a member, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def xml_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def apply_notice(state: State, notice: dict[str, Any], record: dict[str, Any]) -> None:
    """Makes a notice (or its withdrawal) visible; the caller holds the lock."""
    cloud, clear = notice["cloud"], bool(notice.get("clear"))
    now = utcnow()
    if cloud == "aws":
        kind = notice["kind"]
        if kind == "spot":
            state.aws_spot = None if clear else {
                "action": notice.get("action", "terminate"),
                "time": rfc3339(now + datetime.timedelta(minutes=2)),
            }
        elif kind == "rebalance":
            state.aws_rebalance = None if clear else {"noticeTime": rfc3339(now)}
        else:
            state.aws_lifecycle = "InService" if clear else "Terminated"
    elif cloud == "azure":
        if clear:
            wanted = notice.get("event_id")
            state.azure_events = [e for e in state.azure_events
                                  if wanted is not None and e["EventId"] != wanted]
        else:
            kind = notice["type"]
            state.azure_events.append({
                "EventId": record["event_id"],
                "EventStatus": "Scheduled",
                "EventType": kind,
                "ResourceType": "VirtualMachine",
                "Resources": list(notice.get("resources") or [state.machine["azure_vm_name"]]),
                "NotBefore": email.utils.format_datetime(
                    now + datetime.timedelta(seconds=AZURE_LEAD_SECONDS[kind]), usegmt=True),
                "Description": f"fake {kind} event raised by a test",
                "EventSource": "Platform",
                "DurationInSeconds": -1 if kind in ("Preempt", "Terminate") else 60,
            })
        state.azure_incarnation += 1
    else:
        if notice["kind"] == "preempted":
            state.gce["preempted"] = "FALSE" if clear else "TRUE"
        else:
            state.gce["maintenance"] = "NONE" if clear else notice.get(
                "value", "TERMINATE_ON_HOST_MAINTENANCE")
    record["raised"] = True
    record["raised_at"] = rfc3339(now)
    state.changed.notify_all()


def check_notice(notice: Any) -> str | None:
    """Why the /_notice body is not one the fake knows, or None."""
    if not isinstance(notice, dict):
        return "the body must be a JSON object"
    cloud = notice.get("cloud")
    delay = notice.get("in", 0)
    if not isinstance(delay, (int, float)) or isinstance(delay, bool) or delay < 0:
        return '"in" must be a number of seconds >= 0'
    if cloud == "aws":
        if notice.get("kind") not in ("spot", "rebalance", "lifecycle"):
            return 'aws "kind" must be spot, rebalance or lifecycle'
    elif cloud == "azure":
        if notice.get("clear"):
            return None
        if notice.get("type") not in AZURE_LEAD_SECONDS:
            return 'azure "type" must be one of ' + ", ".join(AZURE_LEAD_SECONDS)
        resources = notice.get("resources")
        if resources is not None and not (
                isinstance(resources, list) and all(isinstance(r, str) for r in resources)):
            return 'azure "resources" must be a list of VM names'
    elif cloud == "gcp":
        if notice.get("kind") not in ("preempted", "maintenance"):
            return 'gcp "kind" must be preempted or maintenance'
        if "value" in notice and not isinstance(notice["value"], str):
            return 'gcp "value" must be a string'
    else:
        return '"cloud" must be aws, azure or gcp'
    return None


class Handler(BaseHTTPRequestHandler):
    server_version = "fake-identity/1"
    timeout = 30  # seconds; a client that stalls (handshake or body) does not hold a thread forever
    state: State  # set on the class by main()

    # -- plumbing -------------------------------------------------------------------------

    def setup(self) -> None:
        super().setup()
        self._handshake_failed = False
        if isinstance(self.connection, ssl.SSLSocket):
            # The listening socket does not handshake in accept() (one slow client would block
            # the TLS accept loop); do it here, in this request's own thread.
            try:
                self.connection.do_handshake()
            except OSError as e:  # ssl.SSLError, timeouts, resets: a client that does not trust us
                self.log_message("TLS handshake failed: %s", e)
                self._handshake_failed = True

    def handle(self) -> None:
        if not self._handshake_failed:
            super().handle()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib's name)
        # Also called for a request line that did not parse, before command/path exist.
        sys.stderr.write(f"[fake-identity] {self.address_string()} {format % args}\n")

    def _body(self) -> bytes | None:
        """The request body (exactly Content-Length bytes), b"" without one, None if unreadable."""
        if self.headers.get("Transfer-Encoding"):
            return None  # chunked bodies: the SDKs send a length, this fake does not decode them
        length = self.headers.get("Content-Length")
        if length is None:
            return b""
        try:
            n = int(length)
        except ValueError:
            return None
        if n < 0 or n > 1 << 20:
            return None
        data = self.rfile.read(n)
        return data if len(data) == n else None

    def _answer(self, status: int, body: Any, headers: dict[str, str] | None = None,
                content_type: str | None = None) -> None:
        if isinstance(body, (dict, list)):
            data = json.dumps(body).encode()
            content_type = content_type or "application/json"
        elif isinstance(body, bytes):
            data = body
            content_type = content_type or "application/octet-stream"
        else:
            data = str(body).encode()
            content_type = content_type or "text/plain"
        self._status = status  # before writing: a client that hangs up is not answered twice
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _record(self, path: str, query: dict[str, str], form: dict[str, str]) -> None:
        headers = {
            k.lower(): ("<redacted>" if k.lower() in REDACTED_HEADERS else v)
            for k, v in self.headers.items()
        }
        shown = dict(form)
        for name in HASHED_FIELDS & form.keys():
            shown[name] = f"<{len(form[name])} chars>"
            shown[f"{name}_sha256"] = hashlib.sha256(form[name].encode()).hexdigest()
        with self.state.lock:
            self.state.calls.append({
                "method": self.command,
                "path": path,
                "query": query,
                "headers": headers,
                "form": shown,
                "status": getattr(self, "_status", 0),
            })

    def _handle(self) -> None:
        self._status = 0
        url = urlsplit(self.path)
        path = url.path
        query = {k: v[0] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        if path == "/_healthz":
            return self._answer(200, "ok")
        if path == "/_calls" and self.command == "GET":
            with self.state.lock:
                return self._answer(200, list(self.state.calls))
        if path == "/_reset" and self.command == "POST":
            with self.state.lock:
                self.state.calls.clear()
            return self._answer(200, "reset")
        form: dict[str, str] = {}
        body = self._body()
        self._raw_body = body or b""
        if body is None:
            self._answer(400, {
                "error": "invalid_request",
                "error_description": "unreadable body (bad or short Content-Length, or chunked)",
            })
        elif path.startswith("/_"):
            try:
                return self._control(path)
            except Exception as e:  # never crash the fake on bad input
                if not self._status:
                    self._answer(400, {"error": "invalid_request", "error_description": repr(e)})
                return None
        else:
            if self.headers.get("Content-Type", "").startswith("application/x-www-form-urlencoded"):
                try:
                    parsed = parse_qs(body.decode(), keep_blank_values=True, strict_parsing=False)
                    form = {k: v[0] for k, v in parsed.items()}
                except (UnicodeDecodeError, ValueError):
                    form = {}
            try:
                if not self._faulted(path):
                    self._route(path, query, form)
            except Exception as e:  # never crash the fake on bad input
                if not self._status:
                    self._answer(400, {"error": "invalid_request", "error_description": repr(e)})
        self._record(path, query, form)

    do_GET = do_PUT = do_POST = do_DELETE = do_PATCH = lambda self: self._handle()  # noqa: E731

    def _json_body(self) -> Any:
        """The request body as JSON (ValueError if it is not: answered 400 by _handle)."""
        return json.loads(self._raw_body.decode() or "null")

    def _bearer(self) -> str:
        auth = self.headers.get("Authorization", "")
        return auth[len("Bearer "):].strip() if auth.startswith("Bearer ") else ""

    # -- controls and faults --------------------------------------------------------------

    def _control(self, path: str) -> None:
        state = self.state
        if path == "/_state" and self.command == "GET":
            with state.lock:
                return self._answer(200, state.snapshot())
        if path == "/_machine" and self.command in ("GET", "POST"):
            if self.command == "POST":
                changes = self._json_body()
                if not isinstance(changes, dict) or not all(
                        k in MACHINE_DEFAULTS and isinstance(v, str) and v for k, v in changes.items()):
                    return self._answer(400, {"error": "the body must be a JSON object of "
                                              "non-empty strings with keys among "
                                              + ", ".join(MACHINE_DEFAULTS)})
                with state.lock:
                    state.machine.update(changes)
                    state.changed.notify_all()
            with state.lock:
                return self._answer(200, dict(state.machine))
        if path == "/_notice" and self.command == "POST":
            return self._raise_notice(self._json_body())
        if path == "/_fault" and self.command == "POST":
            fault = self._json_body()
            if not (isinstance(fault, dict) and isinstance(fault.get("prefix"), str)
                    and fault["prefix"].startswith("/") and fault.get("mode") in FAULT_MODES):
                return self._answer(400, {"error": 'the body must be {"prefix": "/path...", '
                                          '"mode": ' + "|".join(FAULT_MODES) + "}"})
            with state.lock:
                if fault["mode"] == "none":
                    state.faults.pop(fault["prefix"], None)
                else:
                    state.faults[fault["prefix"]] = fault["mode"]
                state.changed.notify_all()
                return self._answer(200, {"faults": dict(state.faults)})
        return self._answer(404, {"error": "not_found", "path": path})

    def _raise_notice(self, notice: Any) -> None:
        why = check_notice(notice)
        if why:
            return self._answer(400, {"error": why})
        delay = float(notice.get("in", 0))
        record: dict[str, Any] = {
            "cloud": notice["cloud"],
            "kind": notice.get("kind") or notice.get("type") or "",
            "clear": bool(notice.get("clear")),
            "requested_at": rfc3339(utcnow()),
            "in": delay,
            "raised": False,
        }
        if notice["cloud"] == "azure":
            record["event_id"] = notice.get("event_id") if record["clear"] else str(uuid.uuid4()).upper()
        state = self.state
        with state.lock:
            state.notices.append(record)
            if delay <= 0:
                apply_notice(state, notice, record)
            answer = dict(record)
        if delay > 0:
            def later() -> None:
                with state.lock:
                    apply_notice(state, notice, record)

            timer = threading.Timer(delay, later)
            timer.daemon = True
            timer.start()
        return self._answer(200, answer)

    def _faulted(self, path: str) -> bool:
        """Applies the fault whose prefix matches path (the longest), if any: True if it took
        the request (answered, or hung up after HANG_LIMIT)."""
        state = self.state
        deadline = time.monotonic() + HANG_LIMIT
        with state.lock:
            while True:
                matching = [p for p in state.faults if path.startswith(p)]
                if not matching:
                    return False
                mode = state.faults[max(matching, key=len)]
                if mode != "hang":
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    self.close_connection = True  # hang up without an answer
                    return True
                state.changed.wait(left)
        if mode == "garbage":
            self._answer(200, "<html>not json", content_type="text/html")
        else:
            self._answer(500, "fault injected by the test", content_type="text/plain")
        return True

    # -- routes ---------------------------------------------------------------------------

    def _route(self, path: str, query: dict[str, str], form: dict[str, str]) -> None:
        if path.startswith("/latest/"):
            return self._imds(path)
        if path == "/" and self.command == "POST":
            return self._autoscaling(form)
        if path.startswith("/metadata/"):
            return self._azure_imds(path, query)
        if path.lower().startswith("/subscriptions/"):
            return self._arm(path, query)
        if path.startswith("/api/v1/namespaces/"):
            return self._kubernetes(path)
        if path.endswith("/oauth2/v2.0/token") and self.command == "POST":
            if not self._is_form():
                return self._not_form()
            return self._entra(path.split("/")[1], form)
        if path == "/msi/token" and self.command == "GET":
            return self._app_service(query)
        if path.startswith("/computeMetadata/") or path == "/":
            return self._gce(path, query)
        if path == "/v1/token" and self.command == "POST":
            if not self._is_form():
                return self._not_form()
            return self._google_sts(form)
        return self._answer(404, {"error": "not_found", "path": path})

    def _is_form(self) -> bool:
        return self.headers.get("Content-Type", "").startswith("application/x-www-form-urlencoded")

    def _not_form(self) -> None:
        return self._answer(400, {
            "error": "invalid_request",
            "error_description": "Content-Type must be application/x-www-form-urlencoded",
        })

    def _imds(self, path: str) -> None:
        if path == "/latest/api/token":
            if self.command != "PUT":
                return self._answer(405, "use PUT")
            ttl = self.headers.get("x-aws-ec2-metadata-token-ttl-seconds")
            if not ttl:
                return self._answer(400, "missing x-aws-ec2-metadata-token-ttl-seconds")
            token = secrets.token_urlsafe(24)
            with self.state.lock:
                self.state.imds_tokens.add(token)
            return self._answer(200, token, {"x-aws-ec2-metadata-token-ttl-seconds": ttl})
        with self.state.lock:
            known = self.headers.get("x-aws-ec2-metadata-token") in self.state.imds_tokens
        if not known:
            return self._answer(401, "IMDSv2 session token missing or unknown")
        base = "/latest/meta-data/iam/security-credentials/"
        if path == base:
            return self._answer(200, AWS_ROLE)
        if path == base + AWS_ROLE:
            now = datetime.datetime.now(datetime.timezone.utc)
            return self._answer(200, {
                "Code": "Success",
                "LastUpdated": rfc3339(now),
                "Type": "AWS-HMAC",
                "AccessKeyId": AWS_KEY_ID,
                "SecretAccessKey": "fake-imds-secret",
                "Token": "fake-imds-session-token",
                "Expiration": rfc3339(now + datetime.timedelta(hours=6)),
            })
        with self.state.lock:
            machine = dict(self.state.machine)
            spot, rebalance = self.state.aws_spot, self.state.aws_rebalance
            lifecycle = self.state.aws_lifecycle
        meta = "/latest/meta-data/"
        if path == meta + "placement/region":
            return self._answer(200, machine["aws_region"])
        if path == meta + "placement/availability-zone":
            return self._answer(200, machine["aws_region"] + "a")
        if path == meta + "instance-id":
            return self._answer(200, machine["aws_instance_id"])
        if path == meta + "spot/instance-action":
            return self._answer(200, spot) if spot else self._answer(404, "not found")
        if path == meta + "events/recommendations/rebalance":
            return self._answer(200, rebalance) if rebalance else self._answer(404, "not found")
        if path == meta + "autoscaling/target-lifecycle-state":
            return self._answer(200, lifecycle)
        return self._answer(404, "not found")

    def _autoscaling_error(self, status: int, code: str, message: str) -> None:
        body = (f'<ErrorResponse xmlns="{AUTOSCALING_XMLNS}"><Error><Type>Sender</Type>'
                f"<Code>{code}</Code><Message>{xml_escape(message)}</Message></Error>"
                f"<RequestId>{uuid.uuid4()}</RequestId></ErrorResponse>")
        return self._answer(status, body, content_type="text/xml")

    def _autoscaling(self, form: dict[str, str]) -> None:
        action = form.get("Action", "")
        if action not in ("CompleteLifecycleAction", "RecordLifecycleActionHeartbeat"):
            return self._forward_autoscaling(action)
        missing = [f for f in ("AutoScalingGroupName", "LifecycleHookName") if not form.get(f)]
        if not form.get("InstanceId") and not form.get("LifecycleActionToken"):
            missing.append("InstanceId or LifecycleActionToken")
        if missing:
            return self._autoscaling_error(400, "ValidationError", "missing: " + ", ".join(missing))
        fields = ["AutoScalingGroupName", "LifecycleHookName", "InstanceId", "LifecycleActionToken"]
        if action == "CompleteLifecycleAction":
            if form.get("LifecycleActionResult") not in ("CONTINUE", "ABANDON"):
                return self._autoscaling_error(
                    400, "ValidationError", "LifecycleActionResult must be CONTINUE or ABANDON")
            fields.append("LifecycleActionResult")
        done = {f: form[f] for f in fields if f in form}
        with self.state.lock:
            if action == "CompleteLifecycleAction":
                self.state.lifecycle_completions.append(done)
            else:
                self.state.lifecycle_heartbeats.append(done)
        body = (f'<{action}Response xmlns="{AUTOSCALING_XMLNS}"><{action}Result/>'
                f"<ResponseMetadata><RequestId>{uuid.uuid4()}</RequestId></ResponseMetadata>"
                f"</{action}Response>")
        return self._answer(200, body, content_type="text/xml")

    def _forward_autoscaling(self, action: str) -> None:
        upstream = self.state.upstream
        if not upstream:
            return self._autoscaling_error(
                400, "InvalidAction", f"the fake answers {action or 'this request'} only through "
                "an upstream (start it with --autoscaling-upstream URL)")
        skip = {"host", "content-length", "connection", "transfer-encoding", "accept-encoding"}
        headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
        request = urllib.request.Request(upstream.rstrip("/") + self.path, data=self._raw_body,
                                         headers=headers, method=self.command)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=60) as response:
                status, answer_headers, data = response.status, response.headers, response.read()
        except urllib.error.HTTPError as e:
            status, answer_headers, data = e.code, e.headers, e.read()
        except OSError as e:  # URLError, refused, timeout
            return self._autoscaling_error(502, "UpstreamUnavailable", f"{upstream}: {e}")
        return self._answer(status, data, content_type=answer_headers.get("Content-Type", "text/xml"))

    # -- Azure ----------------------------------------------------------------------------

    def _azure_imds(self, path: str, query: dict[str, str]) -> None:
        if self.headers.get("Metadata", "").lower() != "true":
            return self._answer(400, {"error": "Bad request. Required metadata header not specified"})
        if not query.get("api-version"):
            return self._answer(400, {"error": "Bad request. api-version was not specified"})
        if path == "/metadata/scheduledevents":
            return self._scheduled_events()
        if path == "/metadata/identity/oauth2/token" and self.command == "GET":
            return self._managed_identity(query)
        if self.command != "GET":
            return self._answer(405, {"error": "method not allowed"})
        with self.state.lock:
            m = dict(self.state.machine)
            resource_id = self.state.vm_path()
        compute: dict[str, Any] = {
            "name": m["azure_vm_name"],
            "vmScaleSetName": m["azure_scale_set"],
            "subscriptionId": m["azure_subscription"],
            "resourceGroupName": m["azure_resource_group"],
            "resourceId": resource_id,
            "vmId": str(uuid.uuid5(uuid.NAMESPACE_URL, resource_id)),
            "location": "eastus",
            "zone": "",
            "osType": "Linux",
            "provider": "Microsoft.Compute",
            "azEnvironment": "AzurePublicCloud",
            "vmSize": "Standard_D2s_v3",
            "priority": "",
            "tags": "",
        }
        if path.rstrip("/") == "/metadata/instance":
            return self._answer(200, {"compute": compute, "network": {"interface": []}})
        if path.rstrip("/") == "/metadata/instance/compute":
            return self._answer(200, compute)
        field = path[len("/metadata/instance/compute/"):].rstrip("/")
        if path.startswith("/metadata/instance/compute/") and field in compute:
            return self._answer(200, str(compute[field]))
        return self._answer(404, {"error": "Not found"})

    def _scheduled_events(self) -> None:
        state = self.state
        if self.command == "GET":
            with state.lock:
                return self._answer(200, {
                    "DocumentIncarnation": state.azure_incarnation,
                    "Events": [dict(e, Resources=list(e["Resources"])) for e in state.azure_events],
                })
        if self.command != "POST":
            return self._answer(405, {"error": "method not allowed"})
        body = self._json_body()
        starts = body.get("StartRequests") if isinstance(body, dict) else None
        if not isinstance(starts, list) or not all(
                isinstance(s, dict) and isinstance(s.get("EventId"), str) for s in starts):
            return self._answer(400, {"error": 'the body must be {"StartRequests":[{"EventId":"..."}]}'})
        with state.lock:
            events = {e["EventId"]: e for e in state.azure_events}
            unknown = [s["EventId"] for s in starts if s["EventId"] not in events]
            if unknown:
                return self._answer(400, {"error": "unknown EventId: " + ", ".join(unknown)})
            for start in starts:
                events[start["EventId"]]["EventStatus"] = "Started"
                state.azure_approvals.append(start["EventId"])
            if starts:
                state.azure_incarnation += 1
                state.changed.notify_all()
        return self._answer(200, "")

    def _managed_identity(self, query: dict[str, str]) -> None:
        resource = query.get("resource")
        if not resource:
            return self._answer(400, {"error": "invalid_request",
                                      "error_description": "Required query variable 'resource' is missing"})
        now = int(time.time())
        token = fake_jwt("fake-tenant", "fake-managed-identity", resource)
        with self.state.lock:
            self.state.azure_mi_tokens.add(token)
        return self._answer(200, {
            "access_token": token,
            "client_id": "fake-managed-identity",
            "expires_in": "86399",
            "expires_on": str(now + 86399),
            "ext_expires_in": "86399",
            "not_before": str(now),
            "resource": resource,
            "token_type": "Bearer",
        })

    def _arm(self, path: str, query: dict[str, str]) -> None:
        def error(status: int, code: str, message: str) -> None:
            return self._answer(status, {"error": {"code": code, "message": message}})

        with self.state.lock:
            known = self._bearer() in self.state.azure_mi_tokens
            vm = self.state.vm_path()
            m = dict(self.state.machine)
        if not known:
            return error(401, "AuthenticationFailed",
                         "missing or unknown bearer token (get one from the managed identity path)")
        if not query.get("api-version"):
            return error(400, "MissingApiVersionParameter", "the api-version query parameter is required")
        if path.rstrip("/").lower() != vm.lower():
            return error(404, "ResourceNotFound", f"this fake knows one VM only: {vm}")
        if self.command == "PUT":
            body = self._json_body()
            policy = (body.get("properties") or {}).get("protectionPolicy") if isinstance(body, dict) else None
            flag = policy.get("protectFromScaleIn") if isinstance(policy, dict) else None
            if not isinstance(flag, bool):
                return error(400, "InvalidRequestContent",
                             "expected {\"properties\":{\"protectionPolicy\":{\"protectFromScaleIn\":BOOL}}}")
            with self.state.lock:
                self.state.arm_protection[vm] = flag
        elif self.command != "GET":
            return error(405, "MethodNotAllowed", f"{self.command} is not supported here")
        with self.state.lock:
            protected = self.state.arm_protection.get(vm, False)
        return self._answer(200, {
            "id": vm,
            "name": m["azure_vm_name"],
            "instanceId": m["azure_instance_id"],
            "type": "Microsoft.Compute/virtualMachineScaleSets/virtualMachines",
            "location": "eastus",
            "properties": {
                "provisioningState": "Succeeded",
                "protectionPolicy": {"protectFromScaleIn": protected, "protectFromScaleSetActions": False},
            },
        })

    # -- Kubernetes -----------------------------------------------------------------------

    def _kubernetes(self, path: str) -> None:
        def status(code: int, reason: str, message: str) -> None:
            return self._answer(code, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                       "status": "Failure", "message": message,
                                       "reason": reason, "code": code})

        parts = path.strip("/").split("/")  # api v1 namespaces NS pods NAME
        if len(parts) != 6 or parts[4] != "pods":
            return status(404, "NotFound", f"this fake serves single pods only, not {path}")
        if not self._bearer():
            return status(401, "Unauthorized", "Unauthorized")
        namespace, name = parts[3], parts[5]
        with self.state.lock:
            own = (namespace, name) == (self.state.machine["pod_namespace"], self.state.machine["pod_name"])
        if not own:
            return status(404, "NotFound", f'pods "{name}" not found')
        if self.command == "PATCH":
            kind = self.headers.get("Content-Type", "").split(";")[0].strip()
            if kind not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                return status(415, "UnsupportedMediaType", f"the fake takes merge patches, not {kind!r}")
            patch = self._json_body()
            if not isinstance(patch, dict):
                return status(400, "BadRequest", "the patch must be a JSON object")
            annotations = (patch.get("metadata") or {}).get("annotations") or {}
            if not isinstance(annotations, dict) or not all(
                    v is None or isinstance(v, str) for v in annotations.values()):
                return status(400, "BadRequest", "annotation values must be strings (or null to remove)")
            with self.state.lock:
                pod = self.state.pod()
                patched = merge_patch(pod, patch)
                patched["metadata"]["resourceVersion"] = str(int(pod["metadata"]["resourceVersion"]) + 1)
                self.state.pods[f"{namespace}/{name}"] = patched
        elif self.command != "GET":
            return status(405, "MethodNotAllowed", f"{self.command} is not supported here")
        with self.state.lock:
            return self._answer(200, self.state.pod())

    def _entra(self, tenant: str, form: dict[str, str]) -> None:
        def bad(why: str, code: int = 90014, status: int = 400, error: str = "invalid_request"):
            return self._answer(status, {"error": error, "error_description": why, "error_codes": [code]})

        if form.get("grant_type") != "client_credentials":
            return bad("grant_type must be client_credentials")
        if form.get("client_assertion_type") != "urn:ietf:params:oauth:client-assertion-type:jwt-bearer":
            return bad("client_assertion_type must be jwt-bearer")
        if not form.get("client_id"):
            return bad("client_id is missing")
        if not form.get("scope"):
            return bad("scope is missing")
        if "client_assertion" not in form:
            return bad("client_assertion is missing")
        if not form["client_assertion"]:
            return bad("client_assertion is empty", 700024, 401, "invalid_client")
        return self._answer(200, {
            "token_type": "Bearer",
            "expires_in": 3600,
            "ext_expires_in": 3600,
            "access_token": fake_jwt(tenant, form["client_id"]),
        })

    def _app_service(self, query: dict[str, str]) -> None:
        if self.headers.get("x-identity-header") != self.state.identity_header:
            return self._answer(401, {"error": "unauthorized", "error_description": "bad x-identity-header"})
        if not query.get("api-version") or not query.get("resource"):
            return self._answer(400, {"error": "invalid_request", "error_description": "api-version and resource are required"})
        client_id = query.get("client_id") or "fake-system-identity"
        return self._answer(200, {
            "access_token": fake_jwt("fake-tenant", client_id),
            "expires_on": str(int(time.time()) + 3600),
            "resource": query["resource"],
            "token_type": "Bearer",
            "client_id": client_id,
        })

    def _gce(self, path: str, query: dict[str, str]) -> None:
        flavor = {"Metadata-Flavor": "Google"}
        if path == "/":  # the detection ping: answered without the request header, as GCE does
            return self._answer(200, "", flavor)
        if self.headers.get("metadata-flavor") != "Google":
            return self._answer(403, "Missing Metadata-Flavor: Google header", flavor)
        if path in ("/computeMetadata/v1/", "/computeMetadata/v1"):
            return self._answer(200, "instance/\nproject/\nuniverse/\n", flavor)
        if path in GCE_WATCHED:
            return self._gce_watched(GCE_WATCHED[path], query, flavor)
        with self.state.lock:
            instance_id = self.state.machine["gce_instance_id"]
        answers: dict[str, Any] = {
            "/computeMetadata/v1/instance/service-accounts/default/token": {
                "access_token": "ya29.fake-metadata-token",
                "expires_in": 3599,
                "token_type": "Bearer",
            },
            "/computeMetadata/v1/universe/universe-domain": "googleapis.com",
            "/computeMetadata/v1/project/project-id": "fake-project",
            "/computeMetadata/v1/instance/id": instance_id,
            "/computeMetadata/v1/instance/zone": "projects/123456789012/zones/us-central1-a",
            "/computeMetadata/v1/instance/service-accounts/default/email":
                "fake-sa@fake-project.iam.gserviceaccount.com",
        }
        if path in answers:
            return self._answer(200, answers[path], flavor)
        return self._answer(404, "not found", flavor)

    def _gce_watched(self, key: str, query: dict[str, str], flavor: dict[str, str]) -> None:
        """A value with an ETag; with wait_for_change=true, a hanging GET: answered at once if
        the value's ETag differs from last_etag (default: the current one), else when it
        changes or after timeout_sec seconds (with the unchanged value)."""
        state = self.state
        wait = query.get("wait_for_change", "").lower() == "true"
        try:
            timeout = float(query.get("timeout_sec", GCE_WAIT_DEFAULT))
        except ValueError:
            return self._answer(400, "timeout_sec must be a number", flavor)
        with state.lock:
            value = state.gce[key]
            if wait:
                last = query.get("last_etag") or etag(value)
                deadline = time.monotonic() + max(timeout, 0.0)
                while etag(state.gce[key]) == last:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    state.changed.wait(left)
                value = state.gce[key]
        return self._answer(200, value, dict(flavor, ETag=etag(value)), content_type="application/text")

    def _google_sts(self, form: dict[str, str]) -> None:
        def bad(why: str):
            return self._answer(400, {"error": "invalid_request", "error_description": why})

        if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:token-exchange":
            return bad("grant_type must be token-exchange")
        if form.get("requested_token_type") != "urn:ietf:params:oauth:token-type:access_token":
            return bad("requested_token_type must be access_token")
        for field in ("subject_token", "subject_token_type", "audience"):
            if not form.get(field):
                return bad(f"{field} is missing")
        return self._answer(200, {
            "access_token": "ya29.fake-sts-token",
            "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
            "token_type": "Bearer",
            "expires_in": 3600,
        })


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tls-port", type=int, required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--identity-header", default="fake-identity-header")
    parser.add_argument("--autoscaling-upstream", default=None,
                        help="where Auto Scaling actions other than the faked ones go (moto)")
    for name, default in MACHINE_DEFAULTS.items():
        parser.add_argument("--" + name.replace("_", "-"), default=default)
    args = parser.parse_args(argv)

    machine = {name: getattr(args, name) for name in MACHINE_DEFAULTS}
    Handler.state = State(args.identity_header, machine, args.autoscaling_upstream)
    plain = ThreadingHTTPServer((args.host, args.port), Handler)
    tls = ThreadingHTTPServer((args.host, args.tls_port), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(args.cert, args.key)
    tls.socket = context.wrap_socket(tls.socket, server_side=True, do_handshake_on_connect=False)
    servers = [plain, tls]

    def stop(_signum: int, _frame: Any) -> None:
        for s in servers:
            threading.Thread(target=s.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    tls_thread = threading.Thread(target=tls.serve_forever, daemon=True)
    tls_thread.start()
    port, tls_port = plain.server_address[1], tls.server_address[1]
    print(f"fake identity listening on http://{args.host}:{port} and "
          f"https://{args.host}:{tls_port}", flush=True)
    # The last line on stdout, for whoever started it with --port 0 / --tls-port 0.
    print(f"ready http={port} https={tls_port}", flush=True)
    plain.serve_forever()
    tls_thread.join(timeout=5)
    for s in servers:
        s.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
