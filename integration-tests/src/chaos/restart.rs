//! The store of a restart round: a dedicated emulator or server instance (its own loopback port
//! and data folder) that the driver stops and starts again mid-term.
//!
//! The instance is started, stopped and started again by `scripts/emulators instance`, the one
//! place that knows the emulators' command lines, their persistence flags and how to tell that
//! one answers; this module only runs it. `instance start` returns once the instance answers as
//! the shared ones do when `scripts/emulators start` reports them ready. How it stops (SIGKILL, a
//! crash; SIGTERM for an Azurite that keeps its data, which saves its database only on the way
//! out) is the script's choice, documented there.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use leader_core::backend::Stored;
use leader_core::{LeaseKey, Timing};

use super::measure::Measured;
use super::place::create_place;
use super::process::{Proc, logs, term_after, terms_started_while_cut_off, wait_for};
use super::scenario::SLACK;
use super::{
    BackendKind, EV_TERM_ENDED, EV_TERM_STARTED, EV_WRITE, OUT_ACCEPTED, duration_us, mono_us,
    open_store_patiently,
};
use crate::proxy::ProxyFaults;

/// `scripts/emulators` of this checkout.
fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/emulators")
}

/// The name `scripts/emulators instance` knows the emulator of `kind` by.
fn emulator_name(kind: BackendKind) -> Option<&'static str> {
    match kind {
        BackendKind::File | BackendKind::QuorumFile | BackendKind::Raft => None,
        BackendKind::Azure => Some("azurite"),
        BackendKind::Dynamo => Some("moto"),
        BackendKind::Gcs => Some("gcs"),
        BackendKind::S3 => Some("moto"),
        BackendKind::S3LocalStack => Some("localstack"),
        BackendKind::Etcd => Some("etcd"),
        BackendKind::ZooKeeper => Some("zookeeper"),
    }
}

/// Runs `scripts/emulators ARGS...`; its stdout on success, a message with its stderr
/// otherwise. Blocking: call it through [`run_script`] from async code.
fn run_script_blocking(args: &[String]) -> Result<String, String> {
    let script = script();
    let output: Output = Command::new(&script)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    } else {
        Err(format!(
            "`scripts/emulators {}` failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

async fn run_script(args: Vec<String>) -> Result<String, String> {
    tokio::task::spawn_blocking(move || run_script_blocking(&args))
        .await
        .map_err(|e| format!("running scripts/emulators: {e}"))?
}

/// A dedicated instance of the emulator or server of one backend.
#[derive(Debug)]
pub(super) struct Instance {
    kind: BackendKind,
    name: &'static str,
    dir: PathBuf,
    keep_data: bool,
    url: String,
    place: String,
    key: String,
    running: bool,
    restarted_at: Option<u64>,
}

impl Instance {
    /// Starts an instance for `kind` with its state in `dir`; with `keep_data`, it keeps its
    /// data across restarts (not every emulator can: moto cannot).
    ///
    /// # Errors
    /// A message if the backend has no server to run or the instance did not come up.
    pub(super) async fn start(
        kind: BackendKind,
        dir: &Path,
        keep_data: bool,
    ) -> Result<Self, String> {
        let name = emulator_name(kind)
            .ok_or_else(|| format!("the {} store has no server to restart", kind.name()))?;
        let mut instance = Self {
            kind,
            name,
            dir: dir.to_path_buf(),
            keep_data,
            url: String::new(),
            place: String::new(),
            key: String::new(),
            running: false,
            restarted_at: None,
        };
        instance.url = instance.launch().await?;
        Ok(instance)
    }

    async fn launch(&mut self) -> Result<String, String> {
        let mut args = vec![
            "instance".to_owned(),
            "start".to_owned(),
            self.name.to_owned(),
            self.dir.display().to_string(),
            // Killed with this process if the drill dies without dropping it.
            "--owner".to_owned(),
            std::process::id().to_string(),
        ];
        if !self.keep_data {
            args.push("--empty".to_owned());
        }
        let url = run_script(args).await?;
        self.running = true;
        if url.is_empty() {
            return Err(format!(
                "the {} instance did not say its endpoint",
                self.name
            ));
        }
        Ok(url)
    }

    /// Its endpoint, in the form of the shared emulator's (see [`crate::Endpoint::url`]).
    pub(super) fn url(&self) -> &str {
        &self.url
    }

    /// The backend it serves.
    pub(super) fn kind(&self) -> BackendKind {
        self.kind
    }

    /// Whether it runs (it was started and not stopped since).
    pub(super) fn is_running(&self) -> bool {
        self.running
    }

    /// Whether it comes back with its data.
    pub(super) fn keeps_data(&self) -> bool {
        self.keep_data
    }

    /// The round's container, table, bucket, prefix or parent node in it.
    pub(super) fn place(&self) -> &str {
        &self.place
    }

    /// Sets the round's place (created by the caller) and lease key.
    pub(super) fn set_round(&mut self, place: String, key: String) {
        self.place = place;
        self.key = key;
    }

    /// The round's lease record as the store holds it now (read directly, not through a
    /// proxy): `None` if it is absent.
    ///
    /// # Errors
    /// A message if it cannot be read.
    pub(super) async fn lease_record(&self) -> Result<Option<Stored>, String> {
        let (backend, _) = open_store_patiently(self.kind, &self.url, &self.place, false)
            .await
            .map_err(|e| format!("opening the restarted store: {e}"))?;
        let key = LeaseKey::new(self.key.clone()).map_err(|e| e.to_string())?;
        backend
            .read(&key)
            .await
            .map_err(|e| format!("reading the lease record from the restarted store: {e}"))
    }

    /// When the driver began to start it again after stopping it mid-round ([`mono_us`]), if
    /// it did: every request sent after it went to the restarted store (the stopped one
    /// answered none after its stop).
    pub(super) fn restarted_at(&self) -> Option<u64> {
        self.restarted_at
    }

    /// The arguments of `scripts/emulators` that stop it.
    fn stop_args(&self) -> Vec<String> {
        vec![
            "instance".to_owned(),
            "stop".to_owned(),
            self.dir.display().to_string(),
        ]
    }

    /// Stops it (see the module docs for how).
    ///
    /// # Errors
    /// A message if it could not be stopped.
    pub(super) async fn stop(&mut self) -> Result<(), String> {
        if !self.running {
            return Ok(());
        }
        run_script(self.stop_args()).await?;
        self.running = false;
        Ok(())
    }

    /// Starts it again on the same port, with its data or empty (as it was started), and
    /// returns when it answers. The time is [`mono_us`] right after it answered.
    ///
    /// # Errors
    /// A message if it did not come up, or came up elsewhere.
    pub(super) async fn start_again(&mut self) -> Result<u64, String> {
        self.restarted_at = Some(mono_us());
        let url = self.launch().await?;
        let at = mono_us();
        if url != self.url {
            return Err(format!(
                "the {} instance came back at {url}, not at {}",
                self.name, self.url
            ));
        }
        Ok(at)
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if self.running {
            let _ = run_script_blocking(&self.stop_args());
        }
    }
}

/// What [`outage`] works on.
pub(super) struct Outage<'a> {
    /// The round's store.
    pub(super) store: &'a mut Instance,
    /// The candidates.
    pub(super) procs: &'a mut [Proc],
    /// Their timing.
    pub(super) timing: &'a Timing,
    /// The leader (its index in `procs`) and its term's token.
    pub(super) leader: (usize, u64),
    /// The bound on the time from the store being back to a new term.
    pub(super) bound: Option<Duration>,
}

/// Whether `p` logged an acknowledged write of term `token` sent after `after`.
fn acknowledged(p: &Proc, token: u64, after: u64) -> bool {
    p.read()
        .events
        .iter()
        .any(|e| e.ev == EV_WRITE && e.token == token && e.outcome == OUT_ACCEPTED && e.t1 > after)
}

/// The restart drill, once a leader is established:
///
/// 1. The leader has had a write acknowledged in its term.
/// 2. The store's instance stops (a crash, see the module docs).
/// 3. It stays down until the leader has logged the end of its term and that term's last
///    deadline has passed: the rest of the term's validity runs out while the store is away, so
///    the leader, unable to renew, must step down by its deadline on its own clock (the checker
///    then judges every write against that end). No longer than that, to keep the drill short;
///    at most `ttl` + slack after the stop, since a term lasts at most `ttl - margin` after its
///    last renew was sent, and that was before the stop. Ending the term more than the slack
///    after its deadline is a violation.
/// 4. No term begins while the store is down or the candidates are held off (once the
///    requests in flight at the stop have timed out).
/// 5. It starts again on its port, with its data or empty, while the candidates' proxies hold
///    them off (new connections refused, requests held): empty, the round's place (container,
///    table, bucket, ZooKeeper's parent node) is created again first, as an operator would - a
///    candidate that found its place missing would end its campaign by design (a missing
///    container needs a person), so the re-creation must be one step for them. Then the lease
///    record is read directly: it must be there (with the data) or absent (empty), so that a
///    store that silently kept or lost its data is caught; that needs the candidates held off
///    too (a stepped-down holder may remove its record as soon as it can). Then the proxies
///    open; that is when the store is back.
/// 6. A new term begins within the scenario's bound of the store being back (measured from
///    then), with a token above every earlier one: after an empty restart the lease record and
///    anything the store kept to raise tokens are gone, and only what the candidates remember
///    keeps them rising (the checker also checks token order). A write of that term is
///    acknowledged by the restarted store (which the final-object check then relies on, see
///    `run_round`).
/// 7. Every candidate still runs: the outage was a transient failure for them.
///
/// # Errors
/// A message if the drill could not go on (the store did not stop or come back, no new term).
pub(super) async fn outage(
    round: Outage<'_>,
    violations: &mut Vec<String>,
    measured: &mut Measured,
) -> Result<(), String> {
    let Outage {
        store,
        procs,
        timing,
        leader: (l, token),
        bound,
    } = round;
    let id = procs[l].id.clone();
    let empty = !store.keeps_data();
    let what = if empty { "empty restart" } else { "restart" };
    wait_for(Duration::from_secs(5), || {
        acknowledged(&procs[l], token, 0).then_some(())
    })
    .await
    .ok_or_else(|| format!("the leader {id} had no write acknowledged in term {token}"))?;
    let highest_before = logs(procs)
        .iter()
        .flat_map(|log| log.events.iter())
        .filter(|e| e.ev == EV_TERM_STARTED)
        .map(|e| e.token)
        .max()
        .unwrap_or(token);

    let stopped = mono_us();
    store.stop().await?;
    let limit = timing.ttl + SLACK;
    let ended = wait_for(limit, || {
        procs[l]
            .read()
            .events
            .iter()
            .find(|e| e.ev == EV_TERM_ENDED && e.token == token)
            .map(|e| e.deadline)
    })
    .await;
    match ended {
        Some(deadline) => {
            // When the drive sees the end logged says little about when the candidate
            // stopped (its log is polled, and a loaded machine delays both): that it acted
            // only within its deadline is the checker's to judge, from its writes.
            // The whole validity of the term runs out with the store away.
            let left = deadline.saturating_sub(mono_us());
            tokio::time::sleep(Duration::from_micros(left)).await;
        }
        None => violations.push(format!(
            "{id} did not end term {token} within {limit:?} of the store's stop (it cannot \
             have renewed it)"
        )),
    }

    // The candidates are held off (new connections refused, requests held) from just before
    // the start until the store is as the variant says and verified: then they meet it at once.
    let gate = |procs: &[Proc], on: bool| {
        for p in procs {
            if let Some(proxy) = &p.proxy {
                if on {
                    proxy.set(ProxyFaults {
                        refuse_new: true,
                        blackhole: true,
                        ..ProxyFaults::default()
                    });
                } else {
                    proxy.heal();
                }
            }
        }
    };
    gate(procs, true);
    let started = store.start_again().await;
    let starting = store.restarted_at().unwrap_or_else(mono_us);
    if let Err(e) = started {
        gate(procs, false);
        return Err(e);
    }
    let prepared = if empty {
        create_place(store.kind(), store.url(), store.place()).await
    } else {
        Ok(())
    };
    // It came back as the variant says: with the lease record of before the stop, or without.
    let found = match prepared {
        Ok(()) => store.lease_record().await,
        Err(e) => Err(e),
    };
    let back = mono_us();
    gate(procs, false);
    match (found, empty) {
        (Err(e), _) => return Err(e),
        // ZooKeeper's lease record is an ephemeral node of the term's session: the restarted
        // server keeps it only until it expires that (dead) session, so its absence shows
        // nothing about the data (seen in 3 of 43 rounds under load).
        (Ok(None), false) if store.kind() != BackendKind::ZooKeeper => violations.push(format!(
            "the store came back from the {what} without the lease record: it did not keep its \
             data"
        )),
        (Ok(Some(r)), false) if r.record.token.get() < token => violations.push(format!(
            "the store came back from the {what} with the lease record of token {}, older than \
             term {token}",
            r.record.token.get()
        )),
        (Ok(Some(r)), true) => violations.push(format!(
            "the store came back from the {what} with a lease record (token {}): it was not \
             empty",
            r.record.token.get()
        )),
        _ => {}
    }

    // Nothing answered between the stop (once the requests in flight timed out) and the
    // candidates' release.
    violations.extend(terms_started_while_cut_off(
        procs,
        stopped,
        timing.request_timeout,
        back,
        "while the store was down or held off",
    ));

    let wait_limit = bound.unwrap_or(timing.ttl) + Duration::from_secs(5);
    let (n, new_token, began) = wait_for(wait_limit, || term_after(procs, back, None))
        .await
        .ok_or_else(|| format!("no leader within {wait_limit:?} of the {what}"))?;
    let took = began.saturating_sub(back);
    measured.value = Some(ms(took));
    if let Some(b) = bound
        && took > duration_us(b)
    {
        measured.late.push(format!(
            "recovery after the {what} took {:.0} ms, more than {b:?}",
            ms(took)
        ));
    }
    if new_token <= highest_before {
        violations.push(format!(
            "the first term after the {what} ({}) has token {new_token}, not above {highest_before}, \
             the highest before it",
            procs[n].id
        ));
    }
    wait_for(Duration::from_secs(5), || {
        acknowledged(&procs[n], new_token, starting).then_some(())
    })
    .await
    .ok_or_else(|| {
        format!(
            "no write of term {new_token} ({}) was acknowledged within 5 s after the {what}",
            procs[n].id
        )
    })?;
    for p in procs.iter_mut() {
        if p.exited() {
            violations.push(format!(
                "{} exited during the {what}: its campaign ended (see {}.stderr)",
                p.id, p.id
            ));
        }
    }
    Ok(())
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}
