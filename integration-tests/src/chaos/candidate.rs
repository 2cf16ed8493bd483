//! The candidate process: campaigns, writes to the protected object while its term is valid,
//! and logs every step as a JSON [`Event`] line on stdout.

use std::io::Write;
use std::time::Duration;

use leader_core::backend::within;
use leader_core::{
    ElectorHandle, Error, ErrorKind, FencedStore, HolderId, LeaseKey, ObjectName, Term, Timing,
};
use tokio::signal::unix::{Signal, SignalKind, signal};

use super::{
    BackendKind, END_SIGTERM, EV_EXIT, EV_READY, EV_RELEASING, EV_RENEWED, EV_TERM_ENDED,
    EV_TERM_STARTED, EV_WRITE, Event, OUT_ACCEPTED, OUT_FAILED, OUT_FENCED, OUT_UNKNOWN,
    instant_us, mono_us, open_election, write_value,
};

/// A candidate's settings, given as `name=value` arguments.
#[derive(Clone, Debug)]
pub struct CandidateArgs {
    /// The backend.
    pub backend: BackendKind,
    /// The endpoint (its own proxy's URL) or, for the file store, the directory (for the
    /// quorum of folders, the directory of its members' folders).
    pub endpoint: String,
    /// Container, table or bucket.
    pub place: String,
    /// The lease key; the protected object is `KEY-object`.
    pub key: String,
    /// The holder id.
    pub id: String,
    /// The elector's timing.
    pub timing: Timing,
    /// Pause between fenced writes, at least; up to twice as long with jitter.
    pub write_every: Duration,
    /// Time between the validity check and the write's send, like slow work between the
    /// decision and the act: a SIGSTOP there makes the write stale, for the store to reject.
    pub act_delay: Duration,
}

impl CandidateArgs {
    /// The arguments that [`parse`](Self::parse) reads back.
    pub fn to_args(&self) -> Vec<String> {
        let ms = |d: Duration| d.as_millis().to_string();
        vec![
            format!("backend={}", self.backend.name()),
            format!("endpoint={}", self.endpoint),
            format!("place={}", self.place),
            format!("key={}", self.key),
            format!("id={}", self.id),
            format!("ttl_ms={}", ms(self.timing.ttl)),
            format!("renew_ms={}", ms(self.timing.renew_every)),
            format!("retry_ms={}", ms(self.timing.retry_every)),
            format!("timeout_ms={}", ms(self.timing.request_timeout)),
            format!("margin_ms={}", ms(self.timing.margin)),
            format!("write_ms={}", ms(self.write_every)),
            format!("act_ms={}", ms(self.act_delay)),
            format!("poll_ms={}", ms(self.timing.poll_every)),
        ]
    }

    /// Parses `name=value` arguments; durations default to the backend's drill timing.
    ///
    /// # Errors
    /// A message naming the bad or missing argument.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Self, String> {
        let mut backend = None;
        let (mut endpoint, mut place, mut key, mut id) = (None, None, None, None);
        let mut ms: [Option<u64>; 8] = [None; 8];
        const MS: [&str; 8] = [
            "ttl_ms",
            "renew_ms",
            "retry_ms",
            "timeout_ms",
            "margin_ms",
            "write_ms",
            "act_ms",
            "poll_ms",
        ];
        for arg in args {
            let Some((name, value)) = arg.split_once('=') else {
                return Err(format!("argument {arg:?} is not name=value"));
            };
            match name {
                "backend" => {
                    backend = Some(
                        BackendKind::parse(value)
                            .ok_or_else(|| format!("unknown backend {value:?}"))?,
                    );
                }
                "endpoint" => endpoint = Some(value.to_owned()),
                "place" => place = Some(value.to_owned()),
                "key" => key = Some(value.to_owned()),
                "id" => id = Some(value.to_owned()),
                _ => {
                    let Some(i) = MS.iter().position(|m| *m == name) else {
                        return Err(format!("unknown argument {name:?}"));
                    };
                    ms[i] = Some(
                        value
                            .parse()
                            .map_err(|_| format!("{name}: {value:?} is not a number"))?,
                    );
                }
            }
        }
        let backend = backend.ok_or("backend= is missing")?;
        let mut timing = backend.timing();
        let d = Duration::from_millis;
        if let Some(v) = ms[0] {
            timing = Timing::from_ttl(d(v));
        }
        for (slot, field) in [
            (ms[1], &mut timing.renew_every),
            (ms[2], &mut timing.retry_every),
            (ms[3], &mut timing.request_timeout),
            (ms[4], &mut timing.margin),
            (ms[7], &mut timing.poll_every),
        ] {
            if let Some(v) = slot {
                *field = d(v);
            }
        }
        Ok(Self {
            backend,
            endpoint: endpoint.ok_or("endpoint= is missing")?,
            place: place.unwrap_or_default(),
            key: key.ok_or("key= is missing")?,
            id: id.ok_or("id= is missing")?,
            timing,
            write_every: d(ms[5].unwrap_or(100)),
            act_delay: d(ms[6].unwrap_or(0)),
        })
    }
}

struct Log {
    id: String,
}

impl Log {
    fn emit(&self, mut event: Event) {
        event.id.clone_from(&self.id);
        if event.t == 0 {
            event.t = mono_us();
        }
        if let Ok(line) = serde_json::to_string(&event) {
            let mut out = std::io::stdout().lock();
            // A candidate whose stdout is gone has nobody to tell; it keeps its term rules.
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
    }
}

/// The `main` of a candidate binary called `name`: the elector's warnings (`LEADER_LOG`,
/// default `warn`) go to stderr, next to the events on stdout; the arguments are read by
/// `parse` (exit 2 if they are bad) and handed to `run` (exit 1 if it fails).
#[allow(
    clippy::print_stderr,
    reason = "a command-line program reports its errors"
)]
pub async fn candidate_main<A, F>(
    name: &str,
    parse: impl FnOnce(std::iter::Skip<std::env::Args>) -> Result<A, String>,
    run: impl FnOnce(A) -> F,
) -> std::process::ExitCode
where
    F: std::future::Future<Output = Result<(), String>>,
{
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LEADER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .try_init();
    let args = match parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{name}: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    match run(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs a candidate until SIGTERM (graceful: the term's work stops, the lease is released).
///
/// # Errors
/// A message if the store or the elector cannot be set up.
pub async fn run(args: CandidateArgs) -> Result<(), String> {
    let key = LeaseKey::new(args.key.clone()).map_err(|e| e.to_string())?;
    let (builder, fenced) = open_election(args.backend, &args.endpoint, &args.place, key)
        .await
        .map_err(|e| format!("opening the store: {e}"))?;
    let object = ObjectName::new(format!("{}-object", args.key)).map_err(|e| e.to_string())?;
    let elector = builder
        .timing(args.timing)
        .holder_id(HolderId::new(args.id.clone()).map_err(|e| e.to_string())?)
        .build()
        .map_err(|e| e.to_string())?;
    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let handle = elector.spawn();
    let log = Log {
        id: args.id.clone(),
    };
    log.emit(Event {
        ev: EV_READY.into(),
        ..Event::default()
    });
    let mut worker = Worker {
        log: &log,
        fenced: &*fenced,
        object,
        seq: 0,
        write_every: args.write_every,
        act_delay: args.act_delay,
        request_timeout: args.timing.request_timeout,
    };
    loop {
        let term = tokio::select! {
            _ = sigterm.recv() => break,
            term = handle.wait_for_term() => match term {
                Ok(term) => term,
                Err(_) => break,
            },
        };
        let stop = worker.term(&term, &handle, &mut sigterm).await;
        drop(term);
        if stop {
            break;
        }
    }
    log.emit(Event {
        ev: EV_RELEASING.into(),
        ..Event::default()
    });
    handle.shutdown().await;
    log.emit(Event {
        ev: EV_EXIT.into(),
        ..Event::default()
    });
    Ok(())
}

struct Worker<'a> {
    log: &'a Log,
    fenced: &'a dyn FencedStore,
    object: ObjectName,
    seq: u64,
    write_every: Duration,
    act_delay: Duration,
    /// Each fenced write's time, as the elector's store calls have.
    request_timeout: Duration,
}

impl Worker<'_> {
    /// Works through one term; `true` if SIGTERM came.
    async fn term(&mut self, term: &Term, handle: &ElectorHandle, sigterm: &mut Signal) -> bool {
        let token = term.token().get();
        let mut deadline = term.deadline();
        self.log.emit(Event {
            ev: EV_TERM_STARTED.into(),
            token,
            deadline: instant_us(deadline),
            ..Event::default()
        });
        let mut changes = handle.leadership();
        let mut fenced_out = false;
        let mut sigterm_came = false;
        let why = loop {
            let jitter = Duration::from_millis(self.seq.wrapping_mul(37) % 100);
            let pause = self.write_every + self.write_every.mul_f64(jitter.as_secs_f64() * 10.0);
            let pause = tokio::time::sleep(pause);
            tokio::pin!(pause);
            let woke = loop {
                tokio::select! {
                    biased;
                    _ = sigterm.recv() => break END_SIGTERM,
                    _ = term.cancelled() => break "cancelled",
                    _ = changes.changed() => {
                        if term.deadline() != deadline {
                            deadline = term.deadline();
                            self.log.emit(Event {
                                ev: EV_RENEWED.into(),
                                token,
                                deadline: instant_us(deadline),
                                ..Event::default()
                            });
                        }
                    }
                    _ = &mut pause => break "",
                }
            };
            if !woke.is_empty() {
                sigterm_came = woke == END_SIGTERM;
                break woke;
            }
            if fenced_out {
                continue; // a newer term exists: wait for the elector to notice
            }
            let t0 = mono_us();
            if !term.is_valid() {
                break "invalid";
            }
            let now_deadline = term.deadline();
            if now_deadline != deadline {
                deadline = now_deadline;
                self.log.emit(Event {
                    ev: EV_RENEWED.into(),
                    token,
                    deadline: instant_us(deadline),
                    ..Event::default()
                });
            }
            self.seq += 1;
            let value = write_value(&self.log.id, token, self.seq);
            if !self.act_delay.is_zero() {
                tokio::time::sleep(self.act_delay).await;
            }
            let t1 = mono_us();
            let write = self
                .fenced
                .fenced_write(term.fence(), &self.object, value.as_bytes());
            let result = within(self.request_timeout, write)
                .await
                .unwrap_or_else(|_| Err(Error::indeterminate("no answer in time")));
            let outcome = match &result {
                Ok(_) => OUT_ACCEPTED,
                Err(Error::Fenced { .. }) => {
                    fenced_out = true;
                    OUT_FENCED
                }
                Err(e) if e.kind() == ErrorKind::Indeterminate => OUT_UNKNOWN,
                Err(e) if e.kind() == ErrorKind::Timeout => OUT_UNKNOWN,
                Err(_) => OUT_FAILED,
            };
            self.log.emit(Event {
                ev: EV_WRITE.into(),
                token,
                deadline: instant_us(deadline),
                seq: self.seq,
                t0,
                t1,
                outcome: outcome.into(),
                ..Event::default()
            });
        };
        let deadline_us = instant_us(term.deadline());
        self.log.emit(Event {
            ev: EV_TERM_ENDED.into(),
            t: mono_us().min(deadline_us),
            token,
            deadline: deadline_us,
            outcome: why.into(),
            ..Event::default()
        });
        sigterm_came
    }
}
