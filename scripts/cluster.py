"""A three-member etcd cluster or a three-server ZooKeeper ensemble on loopback ports, every
member behind TCP fault proxies, for the leader-lease tests. `scripts/emulators cluster ...`
runs it; it is not used on its own.

One process (this one, `serve`) owns the members (child processes of its own) and the proxies,
and takes orders on a control port (HTTP on 127.0.0.1). Every member has
  - a client proxy: what the tests' clients connect to (the cluster's advertised client URLs);
  - a peer proxy in front of each of its peer ports (etcd: its peer port, which the cluster
    advertises; ZooKeeper: its quorum and election ports, which the other servers' zoo.cfg name
    instead of the real ones; a server's own line names its real ports, to bind them).
A connection to a peer proxy is traced to the member that opened it (its socket's inode, from
/proc/net/tcp, among the members' open files), so that a member can be cut from the others in
both directions, although every member dials the others' proxies alike.

Faults, per member: stop (SIGTERM, SIGKILL after 10 s) and start (with its data), kill
(SIGKILL), pause (SIGSTOP) and resume (SIGCONT), isolate (cut from the other members and from
the clients), isolate-peers (cut from the other members only: its clients still reach it) and
heal. A cut connection is blackholed, as by a lost network: nothing more is forwarded either
way and nothing is closed; a new one is accepted and never answered. Heal closes the cut
connections (the parties reconnect) and lets new ones through.

Control (HTTP/1.0, JSON answers):
  GET  /status                     members, their state and their roles; the leader's index
  POST /member/N/ACTION            one of the actions above (N = 0, 1, 2)
  POST /shutdown                   stop everything and exit
The process also exits, stopping every member, on SIGTERM or SIGINT, and when the process
--owner names is gone.

Usage: cluster.py serve --kind etcd|zookeeper --dir DIR --ports P0,P1,... [--owner PID]
                        (etcd) --etcd BINARY
                        (zookeeper) --java JAVA --classpath CP
       cluster.py ctl DIR METHOD PATH      one control request, its JSON answer on stdout
Once every member answers and a leader is elected it writes DIR/cluster.json: the control
port, the client endpoints (through the proxies) and every port.
"""

import argparse
import asyncio
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request

MEMBERS = 3
ACTIONS = ("stop", "start", "kill", "pause", "resume", "isolate", "isolate-peers", "heal")


def log(msg):
    print(f"[cluster] {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Which member opened a connection


def socket_inode(local_port, remote_port):
    """The inode of the loopback socket bound to `local_port` and connected to `remote_port`."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) < 10:
                continue
            lport = int(parts[1].rsplit(":", 1)[1], 16)
            rport = int(parts[2].rsplit(":", 1)[1], 16)
            if lport == local_port and rport == remote_port and parts[9] != "0":
                return parts[9]
    return None


def owner_of(inode, pids):
    """The index of the pid in `pids` that holds the socket `inode`, or None."""
    target = f"socket:[{inode}]"
    for index, pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    return index
            except OSError:
                continue
    return None


# ---------------------------------------------------------------------------------------------
# Members


class Member:
    def __init__(self, index, ports):
        self.index = index
        self.name = f"m{index}"
        # Real ports, then their proxies.
        self.client, self.peers = ports["client"], ports["peers"]
        self.client_proxy, self.peer_proxies = ports["client_proxy"], ports["peer_proxies"]
        self.proc = None
        self.log = None
        self.paused = False
        self.cut_peers = False
        self.cut_clients = False

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def describe(self):
        return {
            "index": self.index,
            "name": self.name,
            "pid": self.proc.pid if self.running() else None,
            "running": self.running(),
            "paused": self.paused,
            "isolated_peers": self.cut_peers,
            "isolated_clients": self.cut_clients,
            "client_port": self.client,
            "client_proxy_port": self.client_proxy,
            "peer_ports": self.peers,
            "peer_proxy_ports": self.peer_proxies,
        }


class Cluster:
    def __init__(self, args):
        self.kind = args.kind
        self.dir = os.path.abspath(args.dir)
        ports = [int(p) for p in args.ports.split(",")]
        per = 4 if self.kind == "etcd" else 6  # client, proxy, peer port(s) and their proxies
        need = 1 + MEMBERS * per
        if len(ports) != need:
            raise SystemExit(f"--ports: {need} ports needed, {len(ports)} given")
        self.control_port = ports[0]
        self.members = []
        for i in range(MEMBERS):
            p = ports[1 + i * per : 1 + (i + 1) * per]
            npeer = (per - 2) // 2
            self.members.append(
                Member(
                    i,
                    {
                        "client": p[0],
                        "client_proxy": p[1],
                        "peers": p[2 : 2 + npeer],
                        "peer_proxies": p[2 + npeer :],
                    },
                )
            )
        self.args = args
        self.conns = set()
        self.servers = []
        self.token = f"leader-cluster-{os.getpid()}-{int(time.time())}"

    # -- processes ----------------------------------------------------------------------------

    def command(self, m):
        data = os.path.join(self.dir, "data", m.name)
        if self.kind == "etcd":
            cluster = ",".join(
                f"{o.name}=http://127.0.0.1:{o.peer_proxies[0]}" for o in self.members
            )
            return [
                self.args.etcd,
                "--name", m.name,
                "--data-dir", data,
                "--listen-client-urls", f"http://127.0.0.1:{m.client}",
                "--advertise-client-urls", f"http://127.0.0.1:{m.client_proxy}",
                "--listen-peer-urls", f"http://127.0.0.1:{m.peers[0]}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{m.peer_proxies[0]}",
                "--initial-cluster", cluster,
                "--initial-cluster-state", "new",
                "--initial-cluster-token", self.token,
                # The settings docs/etcd-zookeeper.md recommends for a cluster under a lease.
                "--pre-vote=true",
                "--logger", "zap", "--log-outputs", "stderr",
            ] + self.args.extra
        conf = os.path.join(self.dir, m.name)
        os.makedirs(conf, exist_ok=True)
        os.makedirs(data, exist_ok=True)
        with open(os.path.join(data, "myid"), "w") as f:
            f.write(f"{m.index + 1}\n")
        lines = [
            "clientPortAddress=127.0.0.1",
            f"clientPort={m.client}",
            f"dataDir={data}",
            "tickTime=200",
            "initLimit=25",
            "syncLimit=5",
            "minSessionTimeout=400",
            "maxSessionTimeout=120000",
            "admin.enableServer=false",
            "4lw.commands.whitelist=ruok,srvr,stat,mntr",
            "reconfigEnabled=false",
            "standaloneEnabled=false",
        ]
        for o in self.members:
            # Its own line: the ports it binds. The others': their proxies.
            q, e = (o.peers if o is m else o.peer_proxies)
            lines.append(f"server.{o.index + 1}=127.0.0.1:{q}:{e}")
        with open(os.path.join(conf, "zoo.cfg"), "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(os.path.join(conf, "log4j.properties"), "w") as f:
            f.write(
                "log4j.rootLogger=INFO, CONSOLE\n"
                "log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender\n"
                "log4j.appender.CONSOLE.Target=System.out\n"
                "log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout\n"
                "log4j.appender.CONSOLE.layout.ConversionPattern="
                "%d{ISO8601} %-5p [%t:%C{1}@%L] - %m%n\n"
            )
        return [
            self.args.java, "-Xmx192m", "-Xms32m", "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData",
            "-Djava.net.preferIPv4Stack=true", "-Dzookeeper.jmx.log4j.disable=true",
            f"-Dlog4j.configuration=file:{conf}/log4j.properties",
            "-cp", self.args.classpath,
        ] + self.args.extra + [
            "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            os.path.join(conf, "zoo.cfg"),
        ]

    def start_member(self, m):
        if m.running():
            return
        cmd = self.command(m)
        path = os.path.join(self.dir, f"{m.name}.log")
        m.log = open(path, "ab")
        m.log.write(f"[cluster] {time.strftime('%FT%T')} {' '.join(cmd)}\n".encode())
        m.log.flush()
        m.proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=m.log, stderr=m.log, start_new_session=True
        )
        m.paused = False
        log(f"{m.name} started (pid {m.proc.pid})")

    def stop_member(self, m, sig=signal.SIGTERM, wait=10.0):
        if not m.running():
            return
        if m.paused:
            m.proc.send_signal(signal.SIGCONT)
            m.paused = False
        m.proc.send_signal(sig)
        try:
            m.proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            m.proc.kill()
            m.proc.wait()
        log(f"{m.name} stopped ({signal.Signals(sig).name})")

    # -- proxies ------------------------------------------------------------------------------

    def peer_pids(self):
        return [(m.index, m.proc.pid) for m in self.members if m.running()]

    def blocked(self, conn):
        target = self.members[conn.target]
        if conn.kind == "client":
            return target.cut_clients
        if target.cut_peers:
            return True
        if conn.source is None:
            # Of no member we can find (one already closed by its opener, say): cut while any
            # member is, never let through by mistake.
            return any(m.cut_peers for m in self.members)
        return self.members[conn.source].cut_peers

    async def listen(self, port, upstream, target, kind):
        async def handle(reader, writer):
            conn = Conn(self, reader, writer, target, kind)
            if kind == "election":
                try:
                    conn.first, conn.source = await self.election_hello(reader)
                except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError):
                    writer.transport.abort()
                    return
            elif kind == "peer":
                peer = writer.get_extra_info("peername")
                for _ in range(3):
                    inode = socket_inode(peer[1], port) if peer else None
                    conn.source = owner_of(inode, self.peer_pids()) if inode else None
                    if conn.source is not None:
                        break
                    await asyncio.sleep(0.01)
            self.conns.add(conn)
            try:
                await conn.run(upstream)
            finally:
                self.conns.discard(conn)

        server = await asyncio.start_server(handle, "127.0.0.1", port, reuse_address=True)
        self.servers.append(server)

    async def election_hello(self, reader):
        """Reads a ZooKeeper server's first message on an election port: (the bytes to send on
        instead, the sender's index). The message names the sender's id and its own election
        address, which the receiver dials back when the sender's id is the lower one: that
        address (its real port) is replaced by the sender's election proxy, so that the
        connection back goes through the proxies too."""
        head = await asyncio.wait_for(reader.readexactly(8), 10)
        (version,) = struct.unpack(">q", head)
        if version >= 0:  # the oldest protocol: just the sender's id
            index = version - 1
            return head, index if 0 <= index < MEMBERS else None
        rest = await asyncio.wait_for(reader.readexactly(12), 10)
        sid, length = struct.unpack(">qi", rest)
        if not 0 <= length <= 4096:
            raise OSError(f"an election hello of {length} bytes")
        await asyncio.wait_for(reader.readexactly(length), 10)
        index = sid - 1
        if not 0 <= index < MEMBERS:
            return head + rest, None
        addr = f"127.0.0.1:{self.members[index].peer_proxies[1]}".encode()
        return head + struct.pack(">qi", sid, len(addr)) + addr, index

    def apply_cuts(self):
        """Cuts every open connection that the current isolation forbids."""
        for conn in list(self.conns):
            if self.blocked(conn):
                conn.cut()

    def heal(self, m):
        m.cut_peers = m.cut_clients = False
        for conn in list(self.conns):
            if conn.is_cut and not self.blocked(conn):
                conn.abort()

    # -- control ------------------------------------------------------------------------------

    def act(self, index, action):
        m = self.members[index]
        if action == "stop":
            self.stop_member(m)
        elif action == "kill":
            self.stop_member(m, signal.SIGKILL)
        elif action == "start":
            self.start_member(m)
        elif action == "pause":
            if m.running():
                m.proc.send_signal(signal.SIGSTOP)
                m.paused = True
        elif action == "resume":
            if m.running():
                m.proc.send_signal(signal.SIGCONT)
            m.paused = False
        elif action == "isolate":
            m.cut_peers = m.cut_clients = True
            self.apply_cuts()
        elif action == "isolate-peers":
            m.cut_peers = True
            self.apply_cuts()
        elif action == "heal":
            self.heal(m)
        log(f"{m.name}: {action}")
        return m.describe()

    def roles(self):
        """Each live, unpaused member's own view: (role, the leader's index or None)."""
        views = {}
        for m in self.members:
            if not m.running() or m.paused:
                continue
            views[m.index] = (
                etcd_view(m, self.members) if self.kind == "etcd" else zk_view(m)
            )
        return views

    def status(self):
        views = self.roles()
        members = []
        votes = {}
        for m in self.members:
            d = m.describe()
            role, leader = views.get(m.index, (None, None))
            d["role"] = role
            members.append(d)
            if leader is not None and not m.cut_peers:
                votes[leader] = votes.get(leader, 0) + 1
        if self.kind == "zookeeper":
            # Only a leader names itself (`srvr`); one cut from the others is leaving.
            leaders = [m["index"] for m in members if m["role"] == "leader"
                       and not m["isolated_peers"]]
            leader = leaders[0] if len(leaders) == 1 else None
        else:
            # The leader as the connected majority sees it.
            leader = max(votes, key=votes.get) if votes else None
            if leader is not None and votes[leader] < 2:
                leader = None
        return {"kind": self.kind, "members": members, "leader": leader}

    async def control(self, reader, writer):
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            method, path = head.split(b"\r\n", 1)[0].decode().split(" ")[:2]
            code, body = 200, None
            parts = path.strip("/").split("/")
            loop = asyncio.get_running_loop()
            if method == "GET" and path == "/status":
                body = await loop.run_in_executor(None, self.status)
            elif method == "POST" and path == "/shutdown":
                body = {"ok": True}
                asyncio.get_running_loop().call_soon(self.done.set)
            elif (
                method == "POST"
                and len(parts) == 3
                and parts[0] == "member"
                and parts[1].isdigit()
                and int(parts[1]) < MEMBERS
                and parts[2] in ACTIONS
            ):
                if parts[2] in ("stop", "start", "kill"):
                    # They wait for the process: off the loop. They touch no connection.
                    body = await loop.run_in_executor(None, self.act, int(parts[1]), parts[2])
                else:
                    # Cuts and heals change the loop's transports: on the loop itself.
                    body = self.act(int(parts[1]), parts[2])
            else:
                code, body = 404, {"error": f"no such request: {method} {path}"}
        except Exception as e:  # an answer, whatever went wrong
            code, body = 500, {"error": repr(e)}
        data = json.dumps(body).encode()
        writer.write(
            f"HTTP/1.0 {code} X\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n".encode() + data
        )
        try:
            await writer.drain()
        finally:
            writer.close()

    # -- life ---------------------------------------------------------------------------------

    async def serve(self):
        self.done = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.done.set)
        os.makedirs(os.path.join(self.dir, "data"), exist_ok=True)
        for m in self.members:
            await self.listen(m.client_proxy, m.client, m.index, "client")
            kinds = ["peer"] if self.kind == "etcd" else ["peer", "election"]
            for real, proxy, kind in zip(m.peers, m.peer_proxies, kinds):
                await self.listen(proxy, real, m.index, kind)
        control = await asyncio.start_server(self.control, "127.0.0.1", self.control_port)
        self.servers.append(control)
        for m in self.members:
            self.start_member(m)
        ready = loop.create_task(self.wait_ready())
        owner = loop.create_task(self.watch_owner())
        await self.done.wait()
        ready.cancel()
        owner.cancel()
        for server in self.servers:
            server.close()
        for conn in list(self.conns):
            conn.abort()
        await loop.run_in_executor(None, self.stop_all)

    def stop_all(self):
        for m in self.members:
            if m.running():
                if m.paused:
                    m.proc.send_signal(signal.SIGCONT)
                m.proc.send_signal(signal.SIGTERM)
        for m in self.members:
            self.stop_member(m, signal.SIGTERM, wait=5.0)

    async def watch_owner(self):
        owner = self.args.owner
        while owner:
            try:
                os.kill(owner, 0)
            except ProcessLookupError:
                log(f"the owner (pid {owner}) is gone: stopping")
                self.done.set()
                return
            except PermissionError:
                pass
            await asyncio.sleep(0.5)

    async def wait_ready(self):
        loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        while True:
            status = await loop.run_in_executor(None, self.status)
            if status["leader"] is not None and all(m["role"] for m in status["members"]):
                break
            for m in self.members:
                if not m.running():
                    log(f"{m.name} exited during start-up (see {m.name}.log)")
                    self.done.set()
                    return
            await asyncio.sleep(0.1)
        if self.kind == "etcd":
            endpoints = ",".join(f"http://127.0.0.1:{m.client_proxy}" for m in self.members)
        else:
            endpoints = ",".join(f"127.0.0.1:{m.client_proxy}" for m in self.members)
        info = {
            "kind": self.kind,
            "pid": os.getpid(),
            "control": f"http://127.0.0.1:{self.control_port}",
            "endpoints": endpoints,
            "members": [m.describe() for m in self.members],
        }
        path = os.path.join(self.dir, "cluster.json")
        with open(path + ".tmp", "w") as f:
            json.dump(info, f)
        os.replace(path + ".tmp", path)
        log(f"ready in {time.monotonic() - t0:.1f} s, leader m{status['leader']}")


class Conn:
    """One proxied connection: two pumps, cut or aborted as a whole."""

    def __init__(self, cluster, reader, writer, target, kind):
        self.cluster, self.reader, self.writer = cluster, reader, writer
        self.target, self.kind, self.source = target, kind, None
        self.up = None
        self.first = b""
        self.is_cut = False
        self.finished = asyncio.Event()

    async def run(self, upstream):
        if self.cluster.blocked(self):
            self.cut()
        else:
            # A peer port may not listen yet (a ZooKeeper server opens its quorum port only
            # once it leads, and its followers may dial a moment before): the peer would see a
            # refused connection and try again; behind the proxy it would see its accepted
            # connection close, which a ZooKeeper follower takes for a failed leader. So the
            # proxy tries again for up to 2 s, as the peer would. A client's connection to a
            # member that is down fails at once, as it would without the proxy.
            tries = 40 if self.kind != "client" else 1
            for attempt in range(tries):
                try:
                    up_reader, self.up = await asyncio.open_connection("127.0.0.1", upstream)
                    break
                except OSError:
                    if attempt + 1 == tries:
                        self.abort()
                        return
                    await asyncio.sleep(0.05)
            if self.cluster.blocked(self):
                self.cut()
            else:
                self.up.write(self.first)
                asyncio.ensure_future(self.pump(self.reader, self.up))
                asyncio.ensure_future(self.pump(up_reader, self.writer))
        await self.finished.wait()

    async def pump(self, reader, writer):
        try:
            while not self.is_cut:
                data = await reader.read(65536)
                if not data or self.is_cut:
                    break
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        if not self.is_cut:
            self.abort()

    def cut(self):
        """Blackholed: nothing forwarded, nothing closed, nothing read (the sender's buffers
        fill as on a lost network)."""
        self.is_cut = True
        for w in (self.writer, self.up):
            if w is not None:
                try:
                    w.transport.pause_reading()
                except (AttributeError, RuntimeError):
                    pass

    def abort(self):
        for w in (self.writer, self.up):
            if w is not None:
                w.transport.abort()
        self.finished.set()


# ---------------------------------------------------------------------------------------------
# Who leads


def etcd_view(m, members):
    """(role, leader index) as member `m` sees it, from its maintenance status."""
    try:
        req = urllib.request.Request(
            f"http://127.0.0.1:{m.client}/v3/maintenance/status", data=b"{}", method="POST"
        )
        with urllib.request.urlopen(req, timeout=0.5) as r:
            status = json.load(r)
    except Exception:
        return (None, None)
    me, leader = status.get("header", {}).get("member_id"), status.get("leader")
    if not leader or leader == "0":
        return ("no-leader", None)
    ids = member_ids(members)
    return ("leader" if me == leader else "follower", ids.get(leader))


_IDS = {}


def member_ids(members):
    """etcd member id -> index (asked once of each member: its id never changes)."""
    for m in members:
        if m.index in _IDS.values() or not m.running() or m.paused:
            continue
        try:
            req = urllib.request.Request(
                f"http://127.0.0.1:{m.client}/v3/maintenance/status", data=b"{}", method="POST"
            )
            with urllib.request.urlopen(req, timeout=0.5) as r:
                me = json.load(r).get("header", {}).get("member_id")
            if me:
                _IDS[me] = m.index
        except Exception:
            pass
    return _IDS


def zk_view(m):
    """(role, own index if leader) from the four-letter word `srvr`."""
    try:
        with socket.create_connection(("127.0.0.1", m.client), timeout=0.5) as s:
            s.sendall(b"srvr")
            s.settimeout(0.5)
            data = b""
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
    except OSError:
        return (None, None)
    for line in data.decode(errors="replace").splitlines():
        if line.startswith("Mode:"):
            mode = line.split(":", 1)[1].strip()
            return (mode, m.index if mode == "leader" else None)
    return ("not-serving", None)


# ---------------------------------------------------------------------------------------------


def ctl(directory, method, path):
    with open(os.path.join(directory, "cluster.json")) as f:
        control = json.load(f)["control"]
    req = urllib.request.Request(control + path, data=b"" if method == "POST" else None,
                                 method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            print(r.read().decode())
    except urllib.error.HTTPError as e:
        print(e.read().decode())
        return 1
    return 0


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--kind", choices=("etcd", "zookeeper"), required=True)
    s.add_argument("--dir", required=True)
    s.add_argument("--ports", required=True)
    s.add_argument("--owner", type=int, default=0)
    s.add_argument("--etcd")
    s.add_argument("--java")
    s.add_argument("--classpath")
    s.add_argument("--extra", default="")
    c = sub.add_parser("ctl")
    c.add_argument("dir")
    c.add_argument("method", choices=("GET", "POST"))
    c.add_argument("path")
    args = parser.parse_args()
    if args.cmd == "ctl":
        return ctl(args.dir, args.method, args.path)
    args.extra = args.extra.split()
    asyncio.run(Cluster(args).serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
