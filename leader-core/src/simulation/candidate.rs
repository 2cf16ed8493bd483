//! One candidate: its elector, the observer of its leadership and the worker that writes to
//! the protected resource while its term allows.

use super::*;

pub(super) struct Running {
    pub(super) gate: Arc<Gate>,
    pub(super) control: Arc<FaultControl>,
    pub(super) process: Arc<Process>,
    pub(super) driver: JoinHandle<()>,
    pub(super) worker: JoinHandle<()>,
    pub(super) observer: JoinHandle<()>,
    pub(super) resign: mpsc::Sender<()>,
}

pub(super) const WORK_EVERY: Duration = Duration::from_millis(250);

pub(super) fn start(world: &Arc<World>, cand: Cand, rng: &mut Rng) -> Option<Running> {
    let control = FaultControl::new();
    let gate = Arc::new(Gate::default());
    let late_logger = || {
        let world = world.clone();
        move |late: Late| match late {
            Late::Held { fenced, until } => world.log(Event::Held {
                cand,
                at: world.now(),
                until: world.since_start(until),
                fenced,
            }),
            Late::Applying { fenced } => world.log(Event::Delivered {
                cand,
                at: world.now(),
                fenced,
            }),
        }
    };
    let lease_store = FaultyStore::new(
        Recorder(world.clone()),
        rng.next_u64(),
        vec![world.global.clone(), control.clone()],
    )
    .on_late(late_logger());
    let process = Arc::new(Process {
        store: lease_store,
        world: world.clone(),
        cand,
        gate: gate.clone(),
        control: control.clone(),
        pause: Mutex::new(None),
    });
    let resource = Arc::new(
        FaultyStore::new(
            Resource {
                world: world.clone(),
                cand,
            },
            rng.next_u64(),
            vec![
                world.global.clone(),
                world.resource.clone(),
                control.clone(),
            ],
        )
        .on_late(late_logger()),
    );
    let (handle, task) = elector(world, cand, process.clone(), rng)?.into_parts();
    let granted = Arc::new(Notify::new());
    let observer = tokio::spawn(observe(
        world.clone(),
        cand,
        handle.leadership(),
        granted.clone(),
    ));
    let (resign_tx, resign_rx) = mpsc::channel(1);
    let driver = tokio::spawn(Freezable {
        inner: task,
        gate: gate.clone(),
    });
    let worker = tokio::spawn(Freezable {
        inner: Box::pin(work(
            world.clone(),
            cand,
            handle,
            resource,
            granted,
            resign_rx,
        )),
        gate: gate.clone(),
    });
    world.log(Event::Started {
        cand,
        at: world.now(),
    });
    Some(Running {
        gate,
        control,
        process,
        driver,
        worker,
        observer,
        resign: resign_tx,
    })
}

/// The candidate's elector on its process's store, with a clock drawn within the drift (or
/// the planted negative control's timing).
fn elector(world: &World, cand: Cand, process: Arc<Process>, rng: &mut Rng) -> Option<Elector> {
    let drift = (rng.next_f64() * 2.0 - 1.0) * world.config.max_drift;
    let rate = match world.config.negative {
        NegativeControl::ExcessiveDrift if cand == 0 => 0.5,
        _ => 1.0 + drift,
    };
    let mut timing = world.config.timing;
    if world.config.negative == NegativeControl::LazyFollowers {
        timing.poll_every = timing.ttl * 2;
        timing.retry_every = timing.ttl * 2;
    }
    Elector::builder(process, LeaseKey::new("sim").ok()?)
        .timing(timing)
        .holder_id(HolderId::new(format!("cand-{cand}")).ok()?)
        .jitter_seed(rng.next_u64())
        .simulated_clock_rate(rate)
        .build()
        .ok()
}

/// Records grants and revocations as the elector publishes them, and tells the worker of each
/// new term; runs outside the frozen process, like a log shipper. It is the only task that
/// waits on the candidate's `Leadership` channel (see the module's "Determinism").
pub(super) async fn observe(
    world: Arc<World>,
    cand: Cand,
    mut rx: tokio::sync::watch::Receiver<Leadership>,
    granted: Arc<Notify>,
) {
    let mut current: Option<u64> = None;
    loop {
        let token = rx.borrow_and_update().token().map(|t| t.0);
        if token != current {
            if let Some(old) = current {
                world.log(Event::Revoked {
                    cand,
                    token: old,
                    at: world.now(),
                });
            }
            if let Some(new) = token {
                world.log(Event::Granted {
                    cand,
                    token: new,
                    at: world.now(),
                });
                granted.notify_one();
            }
            current = token;
        }
        if rx.changed().await.is_err() {
            if let Some(old) = current {
                world.log(Event::Revoked {
                    cand,
                    token: old,
                    at: world.now(),
                });
            }
            return;
        }
    }
}

/// Takes the term `wait_for_term` has ready, without waiting for one: `None` if there is
/// none right now.
pub(super) async fn term_ready(handle: &ElectorHandle) -> Option<Result<Term, ()>> {
    tokio::select! {
        biased;
        t = handle.wait_for_term() => Some(t.map_err(|_| ())),
        () = std::future::ready(()) => None,
    }
}

/// A candidate's work: whenever it leads, write to the protected resource every
/// `WORK_EVERY`, only while the term allows it. Each write goes through the fault store and
/// may reach the resource late, after the term has ended.
pub(super) async fn work(
    world: Arc<World>,
    cand: Cand,
    handle: ElectorHandle,
    resource: Arc<FaultyStore<Resource>>,
    granted: Arc<Notify>,
    mut resign: mpsc::Receiver<()>,
) {
    let Ok(object) = ObjectName::new("resource") else {
        return;
    };
    let ignore_deadline = world.config.negative == NegativeControl::IgnoreDeadline;
    let request_timeout = world.config.timing.request_timeout;
    let ttl = world.config.timing.ttl;
    loop {
        tokio::select! {
            biased;
            Some(()) = resign.recv() => { let _ = handle.resign().await; continue; }
            () = granted.notified() => {}
        }
        let term = match term_ready(&handle).await {
            Some(Ok(term)) => term,
            Some(Err(())) => return,
            // The term ended before this process could look (it was frozen).
            None => continue,
        };
        let token = term.token().0;
        world.log(Event::TermStarted {
            cand,
            token,
            at: world.now(),
        });
        lock(&world.leaders).insert(cand, token);
        // Logs the end of the belief when dropped: normally, or when the task is aborted
        // (a crash).
        let belief = Belief {
            world: world.clone(),
            cand,
            term,
            ignore_deadline,
        };
        let mut resigning = false;
        loop {
            let acting = if ignore_deadline {
                Instant::now() < belief.term.deadline() + ttl
            } else {
                belief.term.is_valid()
            };
            if !acting {
                break;
            }
            // The resource logs what it does with the write when (if) it gets there.
            let _ = timeout(
                request_timeout,
                resource.fenced_write(belief.term.fence(), &object, format!("{cand}").as_bytes()),
            )
            .await;
            tokio::select! {
                biased;
                _ = belief.term.cancelled(), if !ignore_deadline => break,
                Some(()) = resign.recv() => { resigning = true; break; }
                _ = sleep(WORK_EVERY) => {}
            }
        }
        drop(belief);
        if resigning {
            world.log(Event::Resigned {
                cand,
                at: world.now(),
            });
            let _ = handle.resign().await;
        }
    }
}
