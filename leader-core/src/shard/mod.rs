//! Sharded leadership: one leader per shard, the shards of a key spread over every instance
//! that runs, with store writes that grow with the number of instances, not shards.
//!
//! Each instance holds one *membership* lease (an ordinary lease, renewed as any other) whose
//! record publishes the shards it claims. A shard's record names its owner and the owner's
//! membership term; it is written only when the shard changes hands, and it counts only while
//! that membership term lasts. So while nothing changes hands, an instance writes its one
//! membership record every `renew_every`, whatever the number of shards. `docs/sharding.md`
//! has the rules and the argument for their safety.
//!
//! ```
//! use std::sync::Arc;
//! use leader_core::{LeaseKey, MemoryStore, ShardedElector};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = Arc::new(MemoryStore::new());
//! let handle = ShardedElector::builder(store, LeaseKey::new("queues")?, 8).build()?.spawn();
//! // Alone, this instance leads all 8 shards; each term has its own token.
//! let term = handle.next_term().await?;
//! println!("leading shard {:?} with token {}", term.shard(), term.token());
//! drop(term);
//! handle.shutdown().await;
//! # Ok(())
//! # }
//! ```

mod driver;
mod plan;
pub(crate) mod records;
mod status;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use crate::backend::ShardStore;
use crate::backend::{FencedCas, LeaseBackend};
use crate::config::{ClockRate, Timing, TimingOverrides};
use crate::elector::{ElectorTask, Problem, Stopped};
use crate::error::ConfigError;
use crate::lease::LeaseClient;
use crate::model::{HolderId, LeaseKey};
use crate::rand::Rng;
use crate::term::{Term, TermSlot};
use crate::token::FencingToken;

pub use records::{MAX_SHARDS, ShardSet};
pub use status::{MemberStatus, ShardedStatus, read_status};

/// What a sharded instance does now, published on every change.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Assignment {
    /// The shards this instance leads now, with their tokens.
    pub led: BTreeMap<u32, FencingToken>,
    /// The live members this instance counted at its last look, itself included (0 before
    /// it joined).
    pub members: usize,
    /// Whether this instance holds its membership lease.
    pub member: bool,
    /// The last store error, if the last attempt failed.
    pub problem: Option<Problem>,
    /// Set once the elector has stopped: `Some(None)` on request, `Some(Some(p))` for an error
    /// that retrying cannot fix.
    pub stopped: Option<Option<Problem>>,
}

/// A deliberate flaw in the sharded protocol, for the simulation's negative controls
/// (`leader_core::simulation::ShardFlaw`, feature `simulation`; without it no flaw can be
/// planted, and the flawed branches are dead code the optimiser drops).
#[cfg_attr(not(feature = "simulation"), allow(dead_code, unreachable_pub))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ShardFlaw {
    /// None: the rules as documented.
    #[default]
    None,
    /// A taker judges the owner's membership term from the cheap (possibly lagging) read,
    /// and takes any other token (not only a greater one) for a later term.
    LaggingOwnerRead,
    /// An absent shard record is free even if a live member claims the shard.
    IgnoreClaims,
    /// A taker writes `previous token + 1` without reserving it in the high-water mark.
    NoReservation,
    /// Ownership by id alone: a member adopts a shard record that names it by id, whatever
    /// membership term it names, and takes any other term of its id as one of its own that
    /// ended (so a restart under the same id inherits the shards of the process before it).
    OwnerById,
    /// A shard taken from an absent record begins without checking, after the renew that
    /// publishes it, that no other live member claims it (the review's finding F1).
    NoClaimsRecheck,
    /// A shard taken from an absent record begins with the token its write carried, even if
    /// a token was reserved after it (another member may have taken, led and released the
    /// shard before the write landed on an operator's delete): the second review's R1.
    NoTokenRecheck,
    /// The coordinator prunes a member from the roster by id, judging the member's latest
    /// term rather than the listed one (F2).
    PruneById,
    /// The coordinator never reads a shard that stays unclaimed, so a record that names a live
    /// term that does not claim it is never adopted (F3).
    NoUnclaimedNet,
    /// The coordinator judges members live by its own ttl, not the member's (F4).
    ObserverTtl,
    /// A member takes a shard its plan gives it without ending its owner's term first: a
    /// stale plan acted on.
    TrustThePlan,
    /// Claims block only takes of absent records and adoptions: a released record, or one
    /// whose owner's term is over, is taken although another live member claims the shard
    /// (it may act on it after an operator's delete met a late write).
    ClaimsForAbsentOnly,
    /// A roster written again after a delete takes the creation mark the history mark names
    /// (that of the key's first roster), so that it passes for the first: nobody waits for
    /// live members to list themselves again.
    RosterFromMark,
}

/// Configures a [`ShardedElector`]. Durations left unset are derived from `ttl` as in
/// [`Timing::from_ttl`].
#[derive(Debug)]
#[must_use]
pub struct ShardedElectorBuilder {
    leases: Arc<dyn LeaseBackend>,
    objects: Arc<dyn FencedCas>,
    key: LeaseKey,
    shards: u32,
    holder: Option<HolderId>,
    ttl: Duration,
    set: TimingOverrides,
    seed: Option<u64>,
    clock: ClockRate,
    flaw: ShardFlaw,
}

impl ShardedElectorBuilder {
    crate::config::timing_setters!("each membership");

    /// This instance's id (default [`HolderId::generate`]).
    pub fn holder_id(mut self, holder: HolderId) -> Self {
        self.holder = Some(holder);
        self
    }

    /// Seeds the jitter of polls and backoff, for reproducible tests (default: random).
    pub fn jitter_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Simulation only: run this instance's timers as if its clock ran at `rate`.
    #[cfg(feature = "simulation")]
    pub fn simulated_clock_rate(mut self, rate: f64) -> Self {
        self.clock = ClockRate(rate);
        self
    }

    /// Simulation only: plant a flaw, to show that the checkers catch it.
    #[cfg(feature = "simulation")]
    pub fn flaw(mut self, flaw: ShardFlaw) -> Self {
        self.flaw = flaw;
        self
    }

    /// Validates the settings and builds the elector.
    ///
    /// # Errors
    /// A [`ConfigError`]: no shards or more than [`MAX_SHARDS`], a key too long for its
    /// records' names (over 96 bytes), or a timing rule broken (as for
    /// [`Elector`](crate::Elector)).
    pub fn build(self) -> Result<ShardedElector, ConfigError> {
        if self.shards == 0 || self.shards > MAX_SHARDS {
            return Err(ConfigError::InvalidShards(format!(
                "{} shards; a sharded election has 1 to {MAX_SHARDS} shards",
                self.shards
            )));
        }
        if !(self.clock.0.is_finite() && self.clock.0 > 0.0) {
            return Err(ConfigError::ZeroDuration {
                field: "simulated clock rate",
            });
        }
        let timing = Timing::resolve(self.ttl, &self.set);
        let names = records::Names::new(&self.key)?;
        let holder = self.holder.unwrap_or_else(HolderId::generate);
        // The store calls count under the sharded key.
        let member = LeaseClient::counted_as(
            self.leases.clone(),
            names.member(&holder),
            holder.clone(),
            timing,
            &self.key,
        )?
        .with_clock(self.clock, self.seed.map(|s| s ^ 0x5eed));
        let tokens = LeaseClient::counted_as(
            self.leases.clone(),
            names.tokens().clone(),
            holder.clone(),
            timing,
            &self.key,
        )?
        .with_clock(self.clock, self.seed.map(|s| s ^ 0x70c3));
        let coord = LeaseClient::counted_as(
            self.leases.clone(),
            names.coord().clone(),
            holder.clone(),
            timing,
            &self.key,
        )?
        .with_clock(self.clock, self.seed.map(|s| s ^ 0xc00d));
        Ok(ShardedElector {
            driver: driver::Driver::new(driver::Parts {
                leases: self.leases,
                objects: self.objects,
                names,
                shards: self.shards,
                holder,
                member,
                tokens,
                coord,
                timing,
                clock: self.clock,
                rng: self.seed.map_or_else(Rng::from_entropy, Rng::seeded),
                flaw: self.flaw,
            }),
        })
    }
}

/// Leads a share of a key's shards, one [`Term`] per led shard.
///
/// Instances of one key find each other through the store (a roster object and one
/// membership lease each), and balance the shards to within one of each other: an instance
/// takes free shards while below its fair share `ceil(shards / members)` and releases (never
/// lets expire) the ones above it. Every shard term has the single-key guarantees: it ends by
/// its deadline on the local clock whether or not the elector's task runs, its token is
/// higher than every earlier term of the shard, and [`Term::fence`] fences writes.
///
/// The store needs both the lease contract ([`LeaseBackend`]) and conditional objects
/// ([`FencedCas`]): a [`ShardStore`]; every store of the suite is one.
#[derive(Debug)]
pub struct ShardedElector {
    driver: driver::Driver,
}

impl ShardedElector {
    /// Starts configuring an instance of the `shards` shards of `key` on `store`.
    pub fn builder(
        store: Arc<dyn ShardStore>,
        key: LeaseKey,
        shards: u32,
    ) -> ShardedElectorBuilder {
        ShardedElectorBuilder {
            leases: store.clone().leases(),
            objects: store.objects(),
            key,
            shards,
            holder: None,
            ttl: Timing::DEFAULT_TTL,
            set: TimingOverrides::default(),
            seed: None,
            clock: ClockRate(1.0),
            flaw: ShardFlaw::None,
        }
    }

    /// The timing in force.
    pub fn timing(&self) -> &Timing {
        self.driver.timing()
    }

    /// Spawns the instance on the current tokio runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime, like [`tokio::spawn`].
    pub fn spawn(self) -> ShardedHandle {
        let (mut handle, task) = self.into_parts();
        handle.task = Some(tokio::spawn(task));
        handle
    }

    /// The handle and the instance's future, which the caller must run to completion.
    pub fn into_parts(self) -> (ShardedHandle, ElectorTask) {
        let (shared, task) = self.driver.start();
        let rx = shared.tx.subscribe();
        (
            ShardedHandle {
                shared,
                rx,
                task: None,
            },
            task,
        )
    }
}

#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) tick: Duration,
    pub(crate) key: LeaseKey,
    pub(crate) holder: HolderId,
    pub(crate) shards: u32,
    pub(crate) shutdown: CancellationToken,
    pub(crate) slots: Mutex<BTreeMap<u32, TermSlot>>,
    pub(crate) tx: watch::Sender<Assignment>,
    /// The metric of how many shards are led, set with every publication.
    pub(crate) shards_led: ::metrics::Gauge,
    pub(crate) answered: crate::metrics::StoreContact,
}

impl Shared {
    pub(crate) fn slots(&self) -> MutexGuard<'_, BTreeMap<u32, TermSlot>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publishes the led shards as the slots say, with `change` applied.
    pub(crate) fn publish(&self, change: impl FnOnce(&mut Assignment)) {
        let led: BTreeMap<u32, FencingToken> = self
            .slots()
            .iter()
            .filter(|(_, slot)| !slot.cancel.is_cancelled())
            .map(|(s, slot)| (*s, slot.fence.token))
            .collect();
        self.shards_led.set(led.len() as f64);
        self.tx.send_if_modified(|a| {
            let mut next = a.clone();
            next.led = led;
            change(&mut next);
            if next == *a {
                false
            } else {
                *a = next;
                true
            }
        });
    }
}

/// Controls a running [`ShardedElector`]. Dropping it shuts the instance down (releasing its
/// shards and membership in the background, if the runtime lives on).
#[derive(Debug)]
pub struct ShardedHandle {
    shared: Arc<Shared>,
    rx: watch::Receiver<Assignment>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl ShardedHandle {
    /// A receiver of every change of this instance's [`Assignment`].
    pub fn assignment(&self) -> watch::Receiver<Assignment> {
        self.rx.clone()
    }

    /// The shards this instance leads now (a shard whose deadline has passed is not led,
    /// even if nothing has published it yet).
    pub fn led(&self) -> BTreeMap<u32, FencingToken> {
        self.shared
            .slots()
            .iter()
            .filter(|(_, slot)| slot.live())
            .map(|(s, slot)| (*s, slot.fence.token))
            .collect()
    }

    /// This instance's id.
    pub fn holder_id(&self) -> &HolderId {
        &self.shared.holder
    }

    /// When the store last answered this instance's membership calls (follows it as it
    /// runs): the input of a readiness check.
    pub fn store_contact(&self) -> crate::metrics::StoreContact {
        self.shared.answered.clone()
    }

    /// The key.
    pub fn key(&self) -> &LeaseKey {
        &self.shared.key
    }

    /// The number of shards of the key.
    pub fn shards(&self) -> u32 {
        self.shared.shards
    }

    /// Waits for a shard term that has not been handed out yet; see [`ShardTerms::next`].
    ///
    /// # Errors
    /// [`Stopped`] once the elector has stopped.
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn next_term(&self) -> Result<Term, Stopped> {
        self.terms().next().await
    }

    /// A source of this instance's shard terms that another task can own (it does not keep
    /// the instance running).
    pub fn terms(&self) -> ShardTerms {
        ShardTerms {
            shared: self.shared.clone(),
            rx: self.rx.clone(),
        }
    }

    /// Stops: ends every shard term, waits for their [`Term`]s to be dropped (at most
    /// until the deadline), releases the shards whose work stopped, then the membership, and
    /// returns when the instance has stopped.
    ///
    /// # Cancel safety
    /// Cancel-safe; the shutdown goes on.
    pub async fn shutdown(mut self) {
        self.shared.shutdown.cancel();
        let mut rx = self.rx.clone();
        let _ = rx.wait_for(|a| a.stopped.is_some()).await;
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for ShardedHandle {
    fn drop(&mut self) {
        self.shared.shutdown.cancel();
    }
}

/// Hands out the shard terms of one [`ShardedHandle`]; cheap to clone.
#[derive(Clone, Debug)]
pub struct ShardTerms {
    shared: Arc<Shared>,
    rx: watch::Receiver<Assignment>,
}

impl ShardTerms {
    /// Waits for a shard term that has not been handed out yet and returns it. Each term is
    /// handed out once. Drop the [`Term`] when its work has stopped: a release (to
    /// rebalance, or at shutdown) waits for that, up to the deadline, before it lets another
    /// instance take the shard.
    ///
    /// # Errors
    /// [`Stopped`] once the elector has stopped.
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn next(&self) -> Result<Term, Stopped> {
        let mut rx = self.rx.clone();
        loop {
            let stopped = rx.borrow_and_update().stopped.clone();
            if let Some(problem) = stopped {
                return Err(Stopped { problem });
            }
            let handed = self
                .shared
                .slots()
                .iter_mut()
                .find_map(|(shard, slot)| slot.hand_out(Some(*shard), None));
            if let Some(term) = handed {
                return Ok(term);
            }
            rx.changed().await.map_err(|_| Stopped { problem: None })?;
        }
    }
}
