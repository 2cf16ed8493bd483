//! The help texts beyond each option's own: a short page for `leader --help`, and the details
//! under the subcommand they belong to. `docs/cli.md` is their output, kept in sync by a test
//! (`tests/help.rs`).

/// The stores and their credentials: for `run` and `status`, which open a store.
macro_rules! stores {
    () => {
        "\
Stores:
  file:///absolute/path/KEY   leases in files, for processes on one host (the embedded default)
  azblob://CONTAINER/[FOLDER/]KEY, dynamodb://TABLE/KEY, s3://BUCKET/[FOLDER/]KEY,
  gs://BUCKET/[FOLDER/]KEY,
  etcd://HOST:PORT[,HOST:PORT...]/[FOLDER/]KEY (etcds:// for TLS), zk://HOST:PORT[,...]/[PATH/]KEY
  raft://HOST:PORT,HOST:PORT,HOST:PORT/KEY (rafts:// for mutual TLS): no store at all; the
    instances are the Raft group (3 or 5), each with --raft-listen (its own HOST:PORT of the
    URL) and --raft-dir (its data folder, kept across restarts)
  (the cloud stores, etcd, ZooKeeper and Raft when compiled in: all are by default)

Credentials (each cloud's usual chain; nothing to pass on the command line):
  azblob://   AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT with AZURE_STORAGE_KEY
              or AZURE_STORAGE_SAS_TOKEN; else workload identity (AZURE_FEDERATED_TOKEN_FILE,
              AZURE_TENANT_ID, AZURE_CLIENT_ID), else the managed identity (AZURE_CLIENT_ID
              picks a user-assigned one)
  dynamodb://, s3://
              the AWS chain: AWS_ACCESS_KEY_ID..., AWS_PROFILE and the shared files, web
              identity (AWS_WEB_IDENTITY_TOKEN_FILE, AWS_ROLE_ARN), ECS, the EC2 instance
              profile (IMDSv2); region from AWS_REGION or the profile
  gs://       Application Default Credentials: GOOGLE_APPLICATION_CREDENTIALS, the gcloud
              login, or the metadata server (GCE, GKE, Cloud Run)
  etcd://     LEADER_ETCD_USER and LEADER_ETCD_PASSWORD if the cluster has auth on;
              LEADER_ETCD_CA_FILE adds a CA to trust for etcds://
  zk://       none (open ACLs on the parent node; each term's node is writable only by its
              own session)
  rafts://    --raft-ca, --raft-cert, --raft-key: the CA that signed every member's
              certificate, and this member's certificate (naming its host) and key, PEM
  TLS trusts the system's roots; SSL_CERT_FILE (a PEM bundle) replaces them.
  --endpoint URL moves the store (credentials unchanged; for etcd:// and zk:// it replaces
  the hosts). Emulators: --emulator, or their own variables (STORAGE_EMULATOR_HOST, an
  Azurite connection string)."
    };
}

/// After `leader --help`: what to read next.
pub(crate) const TOP: &str = "\
Examples:
  leader run --store file:///var/lib/leases/nightly -- ./nightly.sh
  leader run --store dynamodb://leases/nightly --ttl 30s -- ./nightly.sh
  leader status --store gs://my-leases/nightly --watch

Stores: file://, azblob://, dynamodb://, s3://, gs://, etcd://, zk://, raft:// (`leader run --help` has
the URLs and credentials). `leader run --help` also has the timing, the signals, the command's
environment and every exit code; the whole reference, with the protocol behind it, is in the
repository's docs/cli.md and docs/protocol.md.";

/// After `leader run --help`.
pub(crate) const RUN: &str = concat!(
    "\
Timing (measured on this machine's clocks, never another machine's):
  A term is valid until (send time of its last successful renew) + ttl - margin: the deadline.
  The command gets SIGTERM at deadline - grace and SIGKILL at the deadline, whether or not the
  store answered, together with every process it started. A follower takes over only after
  seeing the lease unchanged for a full ttl, which is after the deadline. A released lease is
  taken over within one --poll-every. The defaults of the options above all derive from
  --ttl; docs/protocol.md has their table.

How the command runs:
  A supervisor process, in a session of its own (Ctrl-C, `kill -- -PGID`, `timeout` and
  SIGSTOP of leader's group do not reach it), starts the command in its own process group
  and keeps every process it starts below itself (child subreaper), even one that calls
  setsid or daemonizes. The command is killed by the kernel if the supervisor dies
  (PR_SET_PDEATHSIG), and is never started once the term's deadline has passed (checked on
  CLOCK_BOOTTIME right before exec). The lease is released only after the command and
  everything it started are gone. The command shares leader's stdin, stdout and stderr but
  has no controlling terminal: keys typed at the terminal reach leader, which passes the
  signals on.
  Where the kernel allows it (--pid-namespace auto, the default), the command runs in a PID
  namespace of its own whose init is leader's: if the supervisor dies, the kernel kills that
  init and every process of the namespace with it; leader says at start-up whether it does.
  Inside, pids are the namespace's ($$ is 2 for the command) while /proc stays the host's,
  so a pid file, `pgrep` or `ps` does not name the same process inside and outside: use
  --pid-namespace off for a command that relies on that. For a user other than root the
  namespace sits in a user namespace that maps the user to itself: the same uid, no
  capability; setuid and setcap programs (sudo, fusermount, newuidmap for rootless podman)
  gain nothing in it, other users' files show as 65534, and the command's parent pid is 1.
  Covered: every process the command forks, not one it has a service manager start
  (systemd-run, at). A supervisor refused a namespace later than the start-up check runs
  that term without one (an error in the log; with --pid-namespace on, the term does not
  start the command).

Signals:
  SIGTERM, SIGINT, SIGHUP, SIGQUIT to leader (or its whole process group): passed on to the
    command and everything it started; SIGKILL after --grace (or at the deadline, if sooner);
    then the lease is released and leader exits 128+N. Another such signal a second or more
    later kills at once.
  SIGUSR1, SIGUSR2: passed on to the command's process group; nothing else changes. With
    --step-down-on USR1 (or USR2) that signal instead stops the command as a stop signal
    does, releases the lease and keeps following: another instance takes over within a poll
    (this one does not campaign for one ttl).
  SIGTERM etc. sent to the supervisor too (systemd's stop, pkill leader): handled the same.
  SIGKILL of leader (or its group): the supervisor stops the command (SIGTERM, SIGKILL after
    --grace or at the deadline); the lease expires after its ttl.
  SIGKILL of the supervisor: the kernel kills the command; leader kills whatever the command
    started, leaves the lease to expire and exits 75. A supervisor that does not act (frozen)
    is killed by leader the same way, half a margin after the deadline or a second after the
    grace period of a requested stop.
  SIGSTOP of leader (or its group, Ctrl-Z): the supervisor still stops the command at the
    deadline; resumed, leader exits 75 (or campaigns again with --supervise).
  SIGKILL of leader and the supervisor at once (pkill -9 leader): in a PID namespace, the
    kernel kills the command and everything it started with the namespace's init. Without
    one (--pid-namespace off, or refused: the start-up line says so) it kills the command
    but not what it started: run it under `unshare --pid --fork --kill-child`, or systemd.
  Not covered: SIGSTOP of the supervisor and leader at once leaves the command running.

Environment of the command:
  LEADER_FENCING_TOKEN  the term's fencing token (pass it to the protected resource)
  LEADER_HOLDER_ID      this instance's id     LEADER_KEY      the lease key
  LEADER_STORE          the store URL(s)       LEADER_TTL_MS   the lease duration, in ms
  LEADER_GRACE_MS       time between the stop signal and SIGKILL, in ms
  LEADER_SHARD          with --shards: the shard, 0 to N-1 (LEADER_FENCING_TOKEN is its token)
  LEADER_SHARDS         with --shards: N

Sharded runs (--shards N):
  Every instance of one store URL and N shares the N shards: each leads its share (within
  one of the others'), rebalanced as instances come and go, and runs one command per led
  shard, each under its own supervisor by the rules above (started only within the term,
  SIGTERM at deadline - grace, SIGKILL at the deadline, every process it starts). A shard
  moves to another instance only after its command and everything it started have exited.
  A command that exits by itself while its shard is still led is started again in the same
  term (same token) after a pause: 1s, doubled while it keeps exiting within 30s, at most
  30s; so is one whose supervisor was killed. Stop signals reach every shard's command;
  then leader releases the shards and exits 128+N; a notice hands every shard over the same
  way. --supervise is implied; --wait, --meta, --protect-leader and --step-down-on do not
  apply (64); another N than the key's instances use is refused (78). Exit codes:
  128+N, 69, 78 as below, never a command's own. The shards are not in `leader status` but
  in `leader status --shards`.

Quorum (--store given 3 or 5 times):
  One leader over a majority of independent stores, each named by its URL (every URL ends
  with the same key; give every instance the same URLs). The term lives while a majority
  carries it: the outage of any minority of the stores costs nothing (no failover, no stop),
  the outage of a majority ends the term by its deadline. LEADER_FENCING_TOKEN is the
  quorum's token; LEADER_STORE holds the URLs, space-separated. Not with --shards or
  --endpoint (each store's endpoint comes from its own environment, or --emulator). An even
  number of stores, one given twice, or one store under two names is refused (64, 78). The
  stores must be durable and independent (no replication between them, no shared account or
  region), and never restored in place from a backup: docs/quorum.md.

Autoscalers (--watch-notices, --protect-leader, --complete-lifecycle-hook):
  --watch-notices aws|azure|gcp|auto reads this machine's metadata service from start-up:
  EC2 Spot interruptions and Auto Scaling's target lifecycle state `Terminated` (every 5s),
  Azure Scheduled Events Preempt and Terminate for this VM (every 1s),
  GCE preemption and terminating host maintenance (a waiting request). On a notice the
  leader stops the command (the grace period) and releases at once; a follower takes over
  within a poll. This instance then never campaigns again: it approves its own Azure event
  (StartRequests, only when the event names it alone), completes the Auto Scaling hook named
  by --complete-lifecycle-hook (CONTINUE), and waits for its stop signal (exit 128+N). A
  metadata service that is absent, slow or wrong is logged and never affects leadership.
  --protect-leader aws|azure|k8s sets this instance's scale-in protection while it leads
  (Auto Scaling instance protection, VMSS protectFromScaleIn, the pod deletion cost), and
  clears it when the term ends, at start-up, at exit and every --protect-every while
  following, so a scale-in removes a follower. A protection call never delays a term; it is
  retried in the background. Protection does not cover Spot interruptions, manual deletes or
  health replacements. Not with --shards. Permissions per cloud: docs/autoscalers.md.

Logging: LEADER_LOG sets the filter (tracing syntax, e.g. `warn`, `leader_core=debug`, or
  `debug` for everything, the SDKs included). The default is `info` for leader's own lines and
  only errors (AWS) or warnings (Azure, Google) from the cloud SDKs. --log-format text|json
  (LEADER_LOG_FORMAT). Logs go to stderr through a buffer that drops lines rather than block,
  so a stuck stderr never delays a stop.

Exit codes:
  the command's own code (128+N if it died of signal N)
  64   bad arguments or durations, malformed store URL, unknown scheme, backend not compiled in
  69   the store cannot be used and retrying will not help: missing folder, container, table
       or bucket, rejected credentials, permission denied, read-only folder
  73   --wait ran out before becoming leader
  75   leadership lost while the command ran, or the term ended before it could start
       (without --supervise)
  78   configuration error: timing rules, --grace, metadata, a record path that is a folder,
       --protect-leader on an instance that is not in a group, scale set or pod,
       --pid-namespace on where the kernel refuses a PID namespace
  126  the command cannot be executed      127  the command was not found
  128+N  leader was stopped by signal N before or while running the command
  Errors that may pass (store unreachable, throttled, timeouts) are retried, not fatal.

",
    stores!()
);

/// After `leader status --help`.
pub(crate) const STATUS: &str = concat!(
    "\
Exit codes:
  0    the record was read (whoever holds it, or nobody); with several --store, a majority
       of them answered (each member's record is printed, and the term a majority carries)
  64   bad arguments, malformed store URL, unknown scheme, backend not compiled in, an
       --interval outside 50ms..1h
  69   the store cannot be read: unreachable, throttling or too slow (a single status is
       not retried), a missing folder, container, table or bucket, rejected credentials,
       permission denied, a malformed record; with several --store, fewer than a majority
       answered
  74   --watch: stdout cannot be written (a full disk; a closed pipe exits 0)
  78   configuration error: an invalid store setting, a record path that is a folder
  leader status --watch exits 0 when stopped by SIGINT, SIGTERM or SIGHUP or when its reader
  goes away; store errors that may pass print an `unknown` line and it goes on.

",
    stores!()
);
