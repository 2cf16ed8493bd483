"""The command the supervision tests run under `leader run`.

Every line it appends to LOG is `KIND TOKEN PID BOOTTIME_NS`, written in one `write` to a file
opened with O_APPEND, so lines from several processes never tear. BOOTTIME is shared by every
process of the host, so lines from two terms can be ordered. PID is the pid the tests see: the
command may run in a PID namespace of its own, where `os.getpid()` is another number, but
`/proc` is the host's and names the process by its pid there.

- `start`: the command began (its pid);
- `daemon`: a grandchild that left the session (setsid after a double fork) and ignores
  SIGTERM, SIGINT and SIGHUP: only SIGKILL ends it, and only a supervisor that tracks
  re-parented descendants can find it;
- `beat`: every 50 ms, from the command and from the daemon, while they live;
- `signal`: the command got SIGTERM, SIGINT or SIGHUP; it keeps working (and beating) for one
  more second, as a real service finishing its work would, then writes `stop` and exits 0.
"""

import os
import signal
import sys
import time

LOG = sys.argv[1]
TOKEN = os.environ.get("LEADER_FENCING_TOKEN", "?")


def host_pid():
    return int(os.readlink("/proc/self"))


def note(kind):
    line = f"{kind} {TOKEN} {host_pid()} {time.clock_gettime_ns(time.CLOCK_BOOTTIME)}\n"
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def beat_forever():
    while True:
        note("beat")
        time.sleep(0.05)


def daemonize():
    middle = os.fork()
    if middle != 0:
        os.waitpid(middle, 0)
        return
    os.setsid()
    if os.fork() != 0:
        os._exit(0)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    note("daemon")
    beat_forever()


stopping_since = None


def on_signal(signum, _frame):
    global stopping_since
    if stopping_since is None:
        stopping_since = time.monotonic()
        note(f"signal{signum}")


note("start")
daemonize()
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, on_signal)
while True:
    note("beat")
    if stopping_since is not None and time.monotonic() - stopping_since >= 0.9:
        note("stop")
        sys.exit(0)
    time.sleep(0.05)
