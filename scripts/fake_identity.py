"""A FAKE of the cloud identity endpoints, for the credential-chain tests. Never use it
outside tests: it hands a token to anyone who asks.

The stores in the tests are the real emulators (moto, Azurite, fake-gcs-server); what no
emulator offers is the machine's identity: the metadata services and token endpoints that the
SDKs' credential chains call. This server plays them, over plain HTTP and HTTPS on two ports
(one state), and records every request so that a test can check that the SDK really went
through the path it claims to test.

Usage: fake_identity.py --host 127.0.0.1 --port P --tls-port Q --cert PEM --key PEM
                        [--identity-header SECRET]

Endpoints (the request and answer formats the SDKs expect):
  AWS EC2 IMDSv2    PUT /latest/api/token; GET /latest/meta-data/iam/security-credentials/[ROLE];
                    GET /latest/meta-data/placement/region
  Entra ID          POST /{tenant}/oauth2/v2.0/token (client assertion -> a JWT that Azurite's
                    OAuth mode accepts: it checks claims, not signatures)
  App Service MI    GET /msi/token?api-version=2019-08-01&resource=... (x-identity-header)
  GCE metadata      GET /computeMetadata/v1/... (Metadata-Flavor: Google)
  Google STS        POST /v1/token (token exchange, for external_account credentials)
  for the tests     GET /_calls (the request log; secrets redacted), POST /_reset, GET /_healthz
"""

from __future__ import annotations

import argparse
import base64
import datetime
import hashlib
import json
import secrets
import signal
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

AWS_ROLE = "leader-test-role"
AWS_KEY_ID = "AKIAFAKEIMDS0000001"
REDACTED_HEADERS = {"authorization", "x-identity-header", "x-aws-ec2-metadata-token"}
HASHED_FIELDS = {"client_assertion", "subject_token"}
FAKE_OID = "00000000-0000-4000-8000-000000000001"


class State:
    def __init__(self, identity_header: str) -> None:
        self.lock = threading.Lock()
        self.calls: list[dict[str, Any]] = []
        self.imds_tokens: set[str] = set()
        self.identity_header = identity_header


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def fake_jwt(tenant: str, app_id: str) -> str:
    now = int(time.time())
    header = {"alg": "RS256", "typ": "JWT"}
    payload = {
        "aud": "https://storage.azure.com",
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

    def _answer(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        if isinstance(body, (dict, list)):
            data = json.dumps(body).encode()
            content_type = "application/json"
        else:
            data = str(body).encode()
            content_type = "text/plain"
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
        if body is None:
            self._answer(400, {
                "error": "invalid_request",
                "error_description": "unreadable body (bad or short Content-Length, or chunked)",
            })
        else:
            if self.headers.get("Content-Type", "").startswith("application/x-www-form-urlencoded"):
                try:
                    parsed = parse_qs(body.decode(), keep_blank_values=True, strict_parsing=False)
                    form = {k: v[0] for k, v in parsed.items()}
                except (UnicodeDecodeError, ValueError):
                    form = {}
            try:
                self._route(path, query, form)
            except Exception as e:  # never crash the fake on bad input
                if not self._status:
                    self._answer(400, {"error": "invalid_request", "error_description": repr(e)})
        self._record(path, query, form)

    do_GET = do_PUT = do_POST = do_DELETE = lambda self: self._handle()  # noqa: E731

    # -- routes ---------------------------------------------------------------------------

    def _route(self, path: str, query: dict[str, str], form: dict[str, str]) -> None:
        if path.startswith("/latest/"):
            return self._imds(path)
        if path.endswith("/oauth2/v2.0/token") and self.command == "POST":
            if not self._is_form():
                return self._not_form()
            return self._entra(path.split("/")[1], form)
        if path == "/msi/token" and self.command == "GET":
            return self._app_service(query)
        if path.startswith("/computeMetadata/") or path == "/":
            return self._gce(path)
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
        if path == "/latest/meta-data/placement/region":
            return self._answer(200, "us-east-1")
        return self._answer(404, "not found")

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

    def _gce(self, path: str) -> None:
        flavor = {"Metadata-Flavor": "Google"}
        if path == "/":  # the detection ping: answered without the request header, as GCE does
            return self._answer(200, "", flavor)
        if self.headers.get("metadata-flavor") != "Google":
            return self._answer(403, "Missing Metadata-Flavor: Google header", flavor)
        if path in ("/computeMetadata/v1/", "/computeMetadata/v1"):
            return self._answer(200, "instance/\nproject/\nuniverse/\n", flavor)
        answers: dict[str, Any] = {
            "/computeMetadata/v1/instance/service-accounts/default/token": {
                "access_token": "ya29.fake-metadata-token",
                "expires_in": 3599,
                "token_type": "Bearer",
            },
            "/computeMetadata/v1/universe/universe-domain": "googleapis.com",
            "/computeMetadata/v1/project/project-id": "fake-project",
            "/computeMetadata/v1/instance/service-accounts/default/email":
                "fake-sa@fake-project.iam.gserviceaccount.com",
        }
        if path in answers:
            return self._answer(200, answers[path], flavor)
        return self._answer(404, "not found", flavor)

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
    args = parser.parse_args(argv)

    Handler.state = State(args.identity_header)
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
    print(f"fake identity listening on http://{args.host}:{args.port} and "
          f"https://{args.host}:{args.tls_port}", flush=True)
    plain.serve_forever()
    tls_thread.join(timeout=5)
    for s in servers:
        s.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
