"""Serve moto with every request serialized behind one global lock.

Stock ``moto_server`` runs moto's WSGI app on a threaded werkzeug server, and
moto's in-memory backends are not thread safe: two concurrent conditional
writes to one DynamoDB item can both pass their condition check (two winners in
a compare-and-swap race, lost updates). Real DynamoDB is linearizable per item,
so the leader-lease tests need an emulator that is too. This launcher keeps the
threaded server (slow clients do not block the accept loop) but runs each
request, body included, while holding one process-wide lock.

Usage: moto_server.py --host 127.0.0.1 --port PORT [--stock]
                      [--tls-port PORT --cert PEM --key PEM]

``--stock`` serves the same app without the lock, to demonstrate the race.
``--tls-port`` also serves the same app (same state, same lock) over HTTPS with the given
certificate and key, for the tests of the TLS paths.
``POST /moto-api/reset`` clears all state (moto's own endpoint).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any, Callable, Iterable

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import make_server


class SerializedApp:
    """WSGI middleware: one request at a time, the whole response produced under the lock."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self._app = app
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        with self._lock:
            result = self._app(environ, start_response)
            try:
                body = b"".join(result)
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()
        return [body]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--stock", action="store_true", help="do not serialize requests")
    parser.add_argument("--tls-port", type=int, help="also serve HTTPS on this port")
    parser.add_argument("--cert", help="PEM certificate for --tls-port")
    parser.add_argument("--key", help="PEM private key for --tls-port")
    args = parser.parse_args(argv)
    if args.tls_port is not None and not (args.cert and args.key):
        parser.error("--tls-port needs --cert and --key")

    app: Any = DomainDispatcherApplication(create_backend_app)
    if not args.stock:
        app = SerializedApp(app)

    server = make_server(
        args.host,
        args.port,
        app,
        threaded=True,
        request_handler=MotoRequestHandler,
    )

    servers = [server]
    if args.tls_port is not None:
        tls = make_server(
            args.host,
            args.tls_port,
            app,
            threaded=True,
            request_handler=MotoRequestHandler,
            ssl_context=(args.cert, args.key),
        )
        servers.append(tls)
        threading.Thread(target=tls.serve_forever, daemon=True).start()
        print(f"moto also listening on https://{args.host}:{args.tls_port}", flush=True)

    def stop(_signum: int, _frame: Any) -> None:
        # shutdown() blocks until serve_forever returns, so call it from another thread.
        for s in servers:
            threading.Thread(target=s.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    mode = "stock (NOT serialized)" if args.stock else "serialized"
    print(f"moto {mode} listening on http://{args.host}:{args.port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
