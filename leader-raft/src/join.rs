//! The first start of a member whose data folder is empty: before its Raft node exists, it asks
//! every other member whether the group already has history.
//!
//! An empty folder is either a new group forming, a founding member slower than the others, or
//! a member that lost its data. The last must not vote as if it remembered nothing: it may have
//! voted in the current term already, and its acknowledgements may have made entries committed
//! that it no longer holds. To tell them apart, an empty folder first gets an incarnation (a
//! random name, written durably), and a group forms only once every member has answered with
//! its own (a majority is not enough: the members holding the history may be the ones that are
//! down); the members keep the incarnations they formed with, the founders. Then:
//! - if every member is empty too, the group forms with these founders;
//! - if every member with history knows this member by this incarnation, it is a founder that
//!   was slow to start and never stored anything: it joins as usual;
//! - otherwise its folder was emptied since: it refuses to start, unless rejoining was allowed;
//!   then it records the highest vote any member reported as its own, granted to no one (so
//!   that it follows no leader older than the ones it may have helped before, and deposes
//!   none), and takes no part in elections until it has caught up (see [`Gate`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep};

use openraft::Vote;
use openraft::storage::RaftLogStorage;

use crate::config::{Members, RaftConfig, RaftTiming};
use crate::error::RaftError;
use crate::files::{Folder, read_optional, replace};
use crate::net::{CallError, Failure, Founders, Handler, History, Peers, Reply, Request, serve};
use crate::storage::{LogStore, MachineStore};
use crate::tls::Tls;

/// The file whose presence says that a member is catching up after a rejoin.
pub(crate) const MARKER: &str = "rejoining";

/// How often the wait for the other members is logged.
const NOTE_EVERY: Duration = Duration::from_secs(5);

/// The file of the founders' incarnations.
const FOUNDERS: &str = "founders";

/// What the other members said.
pub(crate) enum Survey {
    /// This member founds the group, or joins it as the founder it was: it joins as usual.
    Founder(Founders),
    /// A member has history and does not know this folder: the highest vote reported (its
    /// term the highest term), one such member, and the founders it knows.
    Emptied {
        vote: Vote<u64>,
        peer: String,
        founders: Founders,
    },
}

/// Whether `folder` is empty (a new member, or one whose folder was emptied). A folder that
/// lost part of its state is refused: a vote without the log it was given with, or a log
/// without the vote, cannot be trusted, and only an empty folder can rejoin.
pub(crate) fn is_empty(
    folder: &Folder,
    log: &LogStore,
    machine: &MachineStore,
    gate: &Gate,
) -> Result<bool, RaftError> {
    let snapshot = machine.has_snapshot();
    // A member writes its vote file (with the default vote) before anything else: the default
    // vote means it never voted and never took a leader's entries.
    let voted = log.vote().is_some_and(|v| v != Vote::default());
    if !voted && !log.has_log() && !snapshot {
        return Ok(true);
    }
    if log.vote().is_none() || (!voted && (log.has_entries() || snapshot)) {
        return Err(RaftError::damaged(
            folder.path("vote"),
            "it is missing while the log holds entries: this member forgot its vote",
        ));
    }
    if !log.has_log() && !snapshot && !gate.is_closed() {
        return Err(RaftError::damaged(
            folder.path("log"),
            "it is missing or empty while a vote is stored: this member forgot the entries it \
             acknowledged",
        ));
    }
    Ok(false)
}

/// Refuses a folder written by a group of other members than `members`: the ids number the
/// sorted list, so another list would silently renumber the members the log knows.
pub(crate) fn same_members(
    folder: &Folder,
    log: &LogStore,
    machine: &MachineStore,
    members: &Members,
) -> Result<(), RaftError> {
    let Some(stored) = log
        .last_membership()
        .or_else(|| machine.applied_membership())
    else {
        return Ok(());
    };
    let configured: BTreeMap<u64, String> = members
        .nodes()
        .into_iter()
        .map(|(id, n)| (id, n.addr))
        .collect();
    if stored == configured {
        return Ok(());
    }
    Err(RaftError::config(format!(
        "data folder {} belongs to a group of the members {:?}, but this member was started \
         with {:?}; start every member with the group's list (the member set is fixed), or give \
         a new group new folders",
        folder.path("").display(),
        stored.values().collect::<Vec<_>>(),
        members.sorted()
    )))
}

/// What a starting member needs to join.
pub(crate) struct Joiner<'a> {
    pub(crate) folder: &'a Folder,
    pub(crate) gate: &'a Gate,
    pub(crate) listener: &'a TcpListener,
    pub(crate) peers: &'a Arc<Peers>,
    pub(crate) members: &'a Members,
    pub(crate) tls: Option<Tls>,
    pub(crate) config: &'a RaftConfig,
}

impl Joiner<'_> {
    /// The first start of a member whose folder is empty: asks the others, then founds or
    /// joins the group, rejoins it if allowed, or refuses. Returns this folder's incarnation,
    /// the founders, and whether to propose the initial membership.
    ///
    /// # Errors
    /// [`RaftError::EmptyFolder`] for an emptied folder without `rejoin`; a folder or
    /// configuration error.
    pub(crate) async fn first_start(
        self,
        log: &mut LogStore,
    ) -> Result<(String, Founders, bool), RaftError> {
        let Joiner {
            folder,
            gate,
            listener,
            peers,
            members,
            tls,
            config,
        } = self;
        // The incarnation lives in the vote file: a folder that kept it never voted (its vote
        // is the default one), so it is still the founder it was (a restart during the first
        // start); a folder that lost it gets a new one and passes for no founder.
        let incarnation = match log.incarnation() {
            Some(name) if !name.is_empty() => name,
            _ => new_incarnation(log, folder)?,
        };
        let survey = survey(listener, peers, members, tls, &config.timing, &incarnation).await?;
        let (vote, peer, founders) = match survey {
            Survey::Founder(founders) => {
                write_founders(folder, &founders)?;
                return Ok((incarnation, founders, true));
            }
            Survey::Emptied {
                vote,
                peer,
                founders,
            } => (vote, peer, founders),
        };
        let term = vote.leader_id.term;
        if !config.rejoin {
            return Err(RaftError::EmptyFolder {
                path: config.dir.clone(),
                peer,
                term,
            });
        }
        // The marker first: a crash after it restarts gated, whatever follows.
        gate.close()?;
        write_founders(folder, &founders)?;
        // The highest vote any member holds, granted to no one: this member then follows no
        // leader older than one it may have acknowledged before, and deposes none.
        let vote = Vote {
            leader_id: vote.leader_id,
            committed: false,
        };
        log.save_vote(&vote).await.map_err(|e| {
            RaftError::folder(&config.dir, format!("cannot save the vote: {e}"), None)
        })?;
        tracing::warn!(
            term,
            %peer,
            "rejoining with an emptied data folder: this member takes no part in elections \
             until it has caught up with the group"
        );
        Ok((incarnation, founders, false))
    }
}

/// A new incarnation for this folder, written durably into its vote file.
fn new_incarnation(log: &LogStore, folder: &Folder) -> Result<String, RaftError> {
    // Host, process and 32 random bits: never the same name twice for one folder.
    let name = leader_core::HolderId::generate().as_str().to_owned();
    log.set_incarnation(&name)
        .map_err(|e| RaftError::folder(folder.path("vote"), "cannot write it", Some(e)))?;
    Ok(name)
}

/// The founders this member knows (none if the file is missing).
pub(crate) fn read_founders(folder: &Folder) -> Result<Founders, RaftError> {
    let path = folder.path(FOUNDERS);
    match read_optional(&path) {
        Ok(None) => Ok(Founders::new()),
        Ok(Some(bytes)) => serde_json::from_slice(&bytes)
            .map_err(|e| RaftError::damaged(&path, format!("not a founders list: {e}"))),
        Err(e) => Err(RaftError::folder(&path, "cannot read it", Some(e))),
    }
}

/// Keeps `founders` (durably).
pub(crate) fn write_founders(folder: &Folder, founders: &Founders) -> Result<(), RaftError> {
    let path = folder.path(FOUNDERS);
    let bytes = serde_json::to_vec(founders)
        .map_err(|e| RaftError::folder(&path, format!("cannot encode it: {e}"), None))?;
    replace(&path, &bytes).map_err(|e| RaftError::folder(&path, "cannot write it", Some(e)))
}

/// Answers other members while this member surveys: empty, with its incarnation, and nothing
/// else yet.
struct Joining {
    incarnation: String,
}

impl Handler for Joining {
    async fn handle(&self, _from: u64, body: Request) -> Reply {
        match body {
            Request::History => Reply::History(History {
                entries: false,
                vote: Vote::default(),
                incarnation: self.incarnation.clone(),
                founders: Founders::new(),
            }),
            // A member whose metrics still name this one as the leader: not a refusal (that
            // would end a campaign), only the wrong member.
            Request::Write { .. } => Reply::Write(Err(Failure::NotLeader { leader: None })),
            Request::Read { .. } => Reply::Read(Err(Failure::NotLeader { leader: None })),
            _ => Reply::NotReady,
        }
    }
}

/// Asks every other member for its history, answering theirs meanwhile, until all have
/// answered.
///
/// # Errors
/// [`RaftError::InvalidConfig`] if a member refuses us (another member set, a certificate).
pub(crate) async fn survey(
    listener: &TcpListener,
    peers: &Arc<Peers>,
    members: &Members,
    tls: Option<Tls>,
    timing: &RaftTiming,
    incarnation: &str,
) -> Result<Survey, RaftError> {
    let joining = Arc::new(Joining {
        incarnation: incarnation.to_owned(),
    });
    let answers = tokio::select! {
        () = serve(listener, joining, members.clone(), tls) => {
            return Err(RaftError::Raft { message: "the listener stopped".to_owned() });
        }
        answers = ask_everyone(peers, members, timing) => answers?,
    };
    Ok(judge(&answers, members, incarnation))
}

/// What the answers of every other member mean for this member, of `incarnation`.
fn judge(answers: &BTreeMap<u64, History>, members: &Members, incarnation: &str) -> Survey {
    let me = members.me();
    let knows_me = |h: &History| h.founders.get(&me).is_some_and(|i| i == incarnation);
    let with_history = || answers.iter().filter(|(_, h)| !h.is_empty());
    match with_history().find(|(_, h)| !knows_me(h)) {
        Some((id, _)) => Survey::Emptied {
            vote: answers
                .values()
                .map(|h| h.vote)
                .fold(Vote::default(), |a, b| if b > a { b } else { a }),
            peer: members.address(*id).unwrap_or_default().to_owned(),
            founders: with_history()
                .map(|(_, h)| h.founders.clone())
                .find(|f| !f.is_empty())
                .unwrap_or_default(),
        },
        None => Survey::Founder(match with_history().next() {
            Some((_, h)) => h.founders.clone(),
            None => answers
                .iter()
                .map(|(id, h)| (*id, h.incarnation.clone()))
                .chain([(me, incarnation.to_owned())])
                .collect(),
        }),
    }
}

async fn ask_everyone(
    peers: &Arc<Peers>,
    members: &Members,
    timing: &RaftTiming,
) -> Result<BTreeMap<u64, History>, RaftError> {
    let others: Vec<u64> = (1..=members.sorted().len() as u64)
        .filter(|id| *id != members.me())
        .collect();
    let mut answers: BTreeMap<u64, History> = BTreeMap::new();
    let mut noted = Instant::now();
    loop {
        let mut calls = JoinSet::new();
        for id in others
            .iter()
            .copied()
            .filter(|id| !answers.contains_key(id))
        {
            let peers = peers.clone();
            let budget = timing.request_timeout;
            calls.spawn(async move { (id, peers.call(id, Request::History, budget).await) });
        }
        while let Some(joined) = calls.join_next().await {
            match joined {
                Ok((id, Ok(Reply::History(history)))) => {
                    answers.insert(id, history);
                }
                Ok((_, Err(CallError::Refused(message)))) => {
                    return Err(RaftError::config(message));
                }
                Ok(_) | Err(_) => {}
            }
        }
        let missing: Vec<&str> = others
            .iter()
            .filter(|id| !answers.contains_key(id))
            .filter_map(|id| members.address(*id))
            .collect();
        if missing.is_empty() {
            break;
        }
        if noted.elapsed() >= NOTE_EVERY {
            noted = Instant::now();
            tracing::info!(
                ?missing,
                "this member's data folder is empty: waiting for every other member to answer \
                 before joining"
            );
        }
        sleep(timing.heartbeat).await;
    }
    Ok(answers)
}

/// Whether a rejoined member is still catching up, kept in memory and, for restarts, as the
/// marker file in its folder.
pub(crate) struct Gate {
    closed: AtomicBool,
    marker: PathBuf,
}

impl Gate {
    /// The gate of a member whose folder is `marker`'s: closed if the marker file exists.
    ///
    /// # Errors
    /// [`RaftError::DataFolder`] if the marker's presence cannot be known.
    pub(crate) fn open_or_closed(marker: PathBuf) -> Result<Self, RaftError> {
        let closed = marker
            .try_exists()
            .map_err(|e| RaftError::folder(&marker, "cannot inspect it", Some(e)))?;
        Ok(Self {
            closed: AtomicBool::new(closed),
            marker,
        })
    }

    /// Closes the gate durably (the marker is written before the member's vote).
    pub(crate) fn close(&self) -> Result<(), RaftError> {
        replace(
            &self.marker,
            b"catching up after a rejoin; this member does not vote yet\n",
        )
        .map_err(|e| RaftError::folder(&self.marker, "cannot write it", Some(e)))?;
        self.closed.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Whether the member is still catching up.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Opens the gate: removes the marker durably, then lets the member vote. Returns whether
    /// it was closed until now; on an error the gate stays closed.
    pub(crate) fn open(&self) -> std::io::Result<bool> {
        if !self.is_closed() {
            return Ok(false);
        }
        match std::fs::remove_file(&self.marker) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        if let Some(dir) = self.marker.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(self.closed.swap(false, Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn history(term: u64, incarnation: &str, founders: &[(u64, &str)]) -> History {
        History {
            entries: term > 0,
            vote: Vote::new(term, 2),
            incarnation: incarnation.to_owned(),
            founders: founders
                .iter()
                .map(|(id, i)| (*id, (*i).to_owned()))
                .collect(),
        }
    }

    #[test]
    fn an_emptied_folder_is_told_apart_from_a_new_group_and_a_slow_founder() {
        let members = Members::new(&["a:1".into(), "b:2".into(), "c:3".into()], "a:1").unwrap();
        let founders = [(1, "x1"), (2, "x2"), (3, "x3")];
        // Everyone empty: the group forms with every incarnation, ours included.
        let empty = BTreeMap::from([(2, history(0, "x2", &[])), (3, history(0, "x3", &[]))]);
        let Survey::Founder(formed) = judge(&empty, &members, "x1") else {
            panic!("a new group must form");
        };
        assert_eq!(formed, history(0, "", &founders).founders);
        // The others formed without waiting for us, knowing us as x1: a slow founder.
        let formed = BTreeMap::from([(2, history(4, "x2", &founders)), (3, history(0, "x3", &[]))]);
        assert!(matches!(judge(&formed, &members, "x1"), Survey::Founder(f) if f.len() == 3));
        // The same answers to another incarnation: the folder was emptied since.
        let Survey::Emptied {
            vote,
            peer,
            founders: known,
        } = judge(&formed, &members, "y1")
        else {
            panic!("an emptied folder must be told");
        };
        assert_eq!(
            (vote.leader_id.term, peer.as_str(), known.len()),
            (4, "b:2", 3)
        );
        assert_eq!(vote, Vote::new(4, 2));
    }
}
