//! openraft's v2 storage on disk: the log ([`LogStore`]: vote file and append-only log file)
//! and the state machine ([`MachineStore`]: in memory, with its snapshot file).
//!
//! Files, all in the data folder:
//! - `vote`: the vote and the folder's incarnation (see `join`), JSON, replaced atomically.
//! - `log`: records of `u32 length | u32 !length | u32 CRC-32 of the payload | JSON payload`
//!   (little-endian), each an operation: an entry, a
//!   truncation, a purge, the committed log id. Replayed at start-up. The torn end of the last
//!   append (a crash in the middle of a write: a record cut short, or zeros where the file was
//!   extended but not written) is dropped; any other damage is an error naming the file. The
//!   file is rewritten atomically (compacted) when the log is purged.
//! - `snapshot`: the last snapshot (metadata and state), replaced atomically.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io::{self, Cursor, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use leader_core::backend::ChangeNotifier;
use openraft::storage::{LogFlushed, RaftLogStorage, RaftStateMachine};
use openraft::{
    AnyError, BasicNode, Entry, EntryPayload, LogId, LogState, RaftLogReader, RaftSnapshotBuilder,
    Snapshot, SnapshotMeta, StorageError, StorageIOError, StoredMembership, Vote,
};
use serde::{Deserialize, Serialize};

use crate::error::RaftError;
use crate::files::{Folder, open_file, read_optional, replace};
use crate::state::{Machine, Response, TypeConfig};

type Result<T> = std::result::Result<T, StorageError<u64>>;

/// The largest frame of the log file (and of the wire): 64 MiB.
pub(crate) const MAX_FRAME: usize = 64 << 20;

/// One operation of the log file.
#[derive(Serialize, Deserialize)]
enum LogOp {
    Entry(Entry<TypeConfig>),
    /// Every entry from this index on is gone.
    Truncate(u64),
    /// Every entry up to this log id is gone.
    Purge(LogId<u64>),
    Committed(Option<LogId<u64>>),
}

/// The log as replayed.
#[derive(Default)]
struct LogMem {
    entries: BTreeMap<u64, Entry<TypeConfig>>,
    purged: Option<LogId<u64>>,
    committed: Option<LogId<u64>>,
}

impl LogMem {
    fn apply(&mut self, op: LogOp) {
        match op {
            LogOp::Entry(e) => {
                self.entries.insert(e.log_id.index, e);
            }
            LogOp::Truncate(since) => {
                self.entries.split_off(&since);
            }
            LogOp::Purge(upto) => {
                self.entries = self.entries.split_off(&(upto.index + 1));
                self.purged = Some(upto);
            }
            LogOp::Committed(c) => self.committed = c,
        }
    }

    fn last_log_id(&self) -> Option<LogId<u64>> {
        self.entries
            .values()
            .next_back()
            .map(|e| e.log_id)
            .or(self.purged)
    }
}

/// CRC-32 (IEEE) of `bytes`.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for b in bytes {
        crc ^= u32::from(*b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// The bytes before a record's payload: its length, the length's complement, the payload's
/// CRC-32.
const HEADER: usize = 12;

fn frame(op: &LogOp, out: &mut Vec<u8>) -> io::Result<()> {
    let payload = serde_json::to_vec(op).map_err(io::Error::other)?;
    if payload.len() > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a log entry of {} bytes exceeds {MAX_FRAME} bytes",
                payload.len()
            ),
        ));
    }
    let len = payload.len() as u32;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&(!len).to_le_bytes());
    out.extend_from_slice(&crc32(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
    Ok(())
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut b = [0; 4];
    b.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(b)
}

/// Where the intact records of a log file end: `Ok(None)` if the record at `at` is whole,
/// `Ok(Some(why))` if it is the torn end of the last append (a crash mid-write: cut short, or
/// followed only by the zeros of a file extended but not written), `Err` if it is damaged.
fn torn_at(bytes: &[u8], at: usize) -> std::result::Result<Option<&'static str>, String> {
    let rest = &bytes[at..];
    let zeros_from = |from: usize| bytes[from.min(bytes.len())..].iter().all(|b| *b == 0);
    if rest.len() < HEADER {
        return Ok(Some("its header is cut short"));
    }
    let len = u32_at(bytes, at);
    if u32_at(bytes, at + 4) != !len {
        return if zeros_from(at) {
            Ok(Some("only zeros follow"))
        } else {
            Err(format!("the record header at byte {at} is corrupt"))
        };
    }
    let end = at + HEADER + len as usize;
    if len as usize > MAX_FRAME {
        return Err(format!(
            "the record at byte {at} claims {len} bytes, beyond the limit"
        ));
    }
    if end > bytes.len() {
        return Ok(Some("it is cut short"));
    }
    if crc32(&bytes[at + HEADER..end]) != u32_at(bytes, at + 8) {
        return if zeros_from(end) {
            Ok(Some("its checksum fails and nothing but zeros follows"))
        } else {
            Err(format!(
                "the record at byte {at} fails its checksum and is not the last one"
            ))
        };
    }
    Ok(None)
}

/// Replays the log file's `bytes`: the log and the length of the intact prefix (shorter than
/// `bytes` if the last append was torn).
fn replay(path: &Path, bytes: &[u8]) -> std::result::Result<(LogMem, usize), RaftError> {
    let mut mem = LogMem::default();
    let mut at = 0;
    while at < bytes.len() {
        match torn_at(bytes, at) {
            Ok(None) => {}
            Ok(Some(why)) => {
                tracing::warn!(
                    file = %path.display(),
                    offset = at,
                    dropped_bytes = bytes.len() - at,
                    "dropping the torn end of the log: {why}"
                );
                break;
            }
            Err(detail) => return Err(RaftError::damaged(path, detail)),
        }
        let end = at + HEADER + u32_at(bytes, at) as usize;
        let op: LogOp = serde_json::from_slice(&bytes[at + HEADER..end]).map_err(|e| {
            RaftError::damaged(
                path,
                format!("the record at byte {at} is not a log record: {e}"),
            )
        })?;
        mem.apply(op);
        at = end;
    }
    // A committed id beyond the log (it cannot be, but never trust it) is not re-applied.
    if mem.committed > mem.last_log_id() {
        mem.committed = mem.last_log_id();
    }
    Ok((mem, at))
}

fn io_err(e: &io::Error) -> AnyError {
    AnyError::new(e)
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| io::Error::other(format!("a storage task failed: {e}")))?
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update under these locks is a whole-value change: a poisoned lock is usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct LogShared {
    path: PathBuf,
    vote_path: PathBuf,
    file: Mutex<File>,
    mem: Mutex<LogMem>,
    /// The vote file as stored, if there is one.
    vote_file: Mutex<Option<VoteFile>>,
}

/// The content of the vote file: the vote, and the folder's incarnation (kept with the vote,
/// so that whatever loses the one loses the other too).
#[derive(Clone, Serialize, Deserialize)]
struct VoteFile {
    vote: Vote<u64>,
    incarnation: String,
}

impl LogShared {
    /// Changes the vote file by `change` (from the stored one, else the default vote and no
    /// incarnation) and replaces it on disk, under its lock, before the change is seen.
    fn update_vote_file(&self, change: impl FnOnce(&mut VoteFile)) -> io::Result<()> {
        let mut stored = lock(&self.vote_file);
        let mut file = stored.clone().unwrap_or_else(|| VoteFile {
            vote: Vote::default(),
            incarnation: String::new(),
        });
        change(&mut file);
        let bytes = serde_json::to_vec(&file).map_err(io::Error::other)?;
        replace(&self.vote_path, &bytes)?;
        *stored = Some(file);
        Ok(())
    }
}

/// The Raft log and vote, on disk. Clones share the same log.
#[derive(Clone)]
pub(crate) struct LogStore {
    shared: Arc<LogShared>,
}

impl LogStore {
    /// Opens (and replays) the log and vote of `folder`.
    pub(crate) fn open(folder: &Folder) -> std::result::Result<Self, RaftError> {
        let vote_path = folder.path("vote");
        let vote_file = match read_optional(&vote_path)
            .map_err(|e| RaftError::folder(&vote_path, "cannot read the vote", Some(e)))?
        {
            None => None,
            Some(bytes) => Some(serde_json::from_slice::<VoteFile>(&bytes).map_err(|e| {
                RaftError::damaged(&vote_path, format!("the vote is not readable ({e})"))
            })?),
        };
        let path = folder.path("log");
        let cannot = |e| RaftError::folder(&path, "cannot read or repair the log", Some(e));
        let bytes = read_optional(&path).map_err(cannot)?.unwrap_or_default();
        let (mem, intact) = replay(&path, &bytes)?;
        let file =
            open_file(&path, OpenOptions::new().append(true).create(true)).map_err(cannot)?;
        if intact < bytes.len() {
            file.set_len(intact as u64)
                .and_then(|()| file.sync_all())
                .map_err(cannot)?;
        }
        Ok(Self {
            shared: Arc::new(LogShared {
                path,
                vote_path,
                file: Mutex::new(file),
                mem: Mutex::new(mem),
                vote_file: Mutex::new(vote_file),
            }),
        })
    }

    /// The stored vote, if any.
    pub(crate) fn vote(&self) -> Option<Vote<u64>> {
        lock(&self.shared.vote_file).as_ref().map(|f| f.vote)
    }

    /// The folder's incarnation, if it has one.
    pub(crate) fn incarnation(&self) -> Option<String> {
        lock(&self.shared.vote_file)
            .as_ref()
            .map(|f| f.incarnation.clone())
    }

    /// Gives the folder the incarnation `name` (durably, in the vote file, with the vote it
    /// has or the default one).
    pub(crate) fn set_incarnation(&self, name: &str) -> io::Result<()> {
        self.shared
            .update_vote_file(|f| f.incarnation = name.to_owned())
    }

    /// Whether the log holds anything at all (the initial membership included).
    pub(crate) fn has_log(&self) -> bool {
        let mem = lock(&self.shared.mem);
        !mem.entries.is_empty() || mem.purged.is_some()
    }

    /// The members (id and address) of the last membership entry in the log, if any.
    pub(crate) fn last_membership(&self) -> Option<BTreeMap<u64, String>> {
        let mem = lock(&self.shared.mem);
        mem.entries.values().rev().find_map(|e| match &e.payload {
            EntryPayload::Membership(m) => {
                Some(m.nodes().map(|(id, n)| (*id, n.addr.clone())).collect())
            }
            _ => None,
        })
    }

    /// Whether the log holds anything beyond the initial membership (index 0), which only a
    /// member that has voted for a leader can have received.
    pub(crate) fn has_entries(&self) -> bool {
        let mem = lock(&self.shared.mem);
        mem.purged.is_some() || mem.entries.keys().any(|i| *i > 0)
    }

    /// Writes `ops` at the end of the log file, synced if `sync`, then applies them in memory.
    async fn write_ops(&self, ops: Vec<LogOp>, sync: bool) -> io::Result<()> {
        let shared = self.shared.clone();
        blocking(move || {
            let mut buf = Vec::new();
            for op in &ops {
                frame(op, &mut buf)?;
            }
            let mut file = lock(&shared.file);
            file.write_all(&buf)?;
            if sync {
                file.sync_data()?;
            }
            drop(file);
            let mut mem = lock(&shared.mem);
            for op in ops {
                mem.apply(op);
            }
            Ok(())
        })
        .await
    }

    /// Rewrites the log file with only what `mem` holds (after a purge).
    fn compact(shared: &LogShared) -> io::Result<()> {
        let mut file = lock(&shared.file);
        let mem = lock(&shared.mem);
        let mut buf = Vec::new();
        if let Some(purged) = mem.purged {
            frame(&LogOp::Purge(purged), &mut buf)?;
        }
        for entry in mem.entries.values() {
            frame(&LogOp::Entry(entry.clone()), &mut buf)?;
        }
        frame(&LogOp::Committed(mem.committed), &mut buf)?;
        drop(mem);
        replace(&shared.path, &buf)?;
        *file = open_file(&shared.path, OpenOptions::new().append(true))?;
        Ok(())
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>> {
        let mem = lock(&self.shared.mem);
        Ok(mem.entries.range(range).map(|(_, e)| e.clone()).collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>> {
        let mem = lock(&self.shared.mem);
        Ok(LogState {
            last_purged_log_id: mem.purged,
            last_log_id: mem.last_log_id(),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<()> {
        let shared = self.shared.clone();
        let v = *vote;
        blocking(move || shared.update_vote_file(|f| f.vote = v))
            .await
            .map_err(|e| StorageIOError::write_vote(io_err(&e)).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>> {
        Ok(self.vote())
    }

    async fn save_committed(&mut self, committed: Option<LogId<u64>>) -> Result<()> {
        // Synced: a leader that restarts computes its read index from it, and a stale one
        // could let it answer a read that misses a write it had acknowledged.
        self.write_ops(vec![LogOp::Committed(committed)], true)
            .await
            .map_err(|e| StorageIOError::write_logs(io_err(&e)).into())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<u64>>> {
        Ok(lock(&self.shared.mem).committed)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let ops = entries.into_iter().map(LogOp::Entry).collect();
        match self.write_ops(ops, true).await {
            Ok(()) => {
                // Durable now: only then tell openraft.
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(io::Error::new(e.kind(), e.to_string())));
                Err(StorageIOError::write_logs(io_err(&e)).into())
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<()> {
        self.write_ops(vec![LogOp::Truncate(log_id.index)], true)
            .await
            .map_err(|e| StorageIOError::write_logs(io_err(&e)).into())
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<()> {
        let shared = self.shared.clone();
        blocking(move || {
            lock(&shared.mem).apply(LogOp::Purge(log_id));
            Self::compact(&shared)
        })
        .await
        .map_err(|e| StorageIOError::write_logs(io_err(&e)).into())
    }
}

/// The snapshot file's content.
#[derive(Serialize, Deserialize)]
struct SnapshotFile {
    meta: SnapshotMeta<u64, BasicNode>,
    machine: Machine,
}

/// A snapshot as kept in memory: its metadata and its data.
type StoredSnapshot = (SnapshotMeta<u64, BasicNode>, Vec<u8>);

struct MachineShared {
    machine: RwLock<Machine>,
    snapshot: Mutex<Option<StoredSnapshot>>,
    path: PathBuf,
    notifier: ChangeNotifier,
}

/// The state machine: the replicated state in memory, its snapshot on disk. Clones share it.
#[derive(Clone)]
pub(crate) struct MachineStore {
    shared: Arc<MachineShared>,
}

impl MachineStore {
    /// The state machine of `folder`, from its snapshot if it has one.
    pub(crate) fn open(
        folder: &Folder,
        notifier: ChangeNotifier,
    ) -> std::result::Result<Self, RaftError> {
        let path = folder.path("snapshot");
        let read = read_optional(&path)
            .map_err(|e| RaftError::folder(&path, "cannot read the snapshot", Some(e)))?;
        let (machine, snapshot) = match read {
            None => (Machine::default(), None),
            Some(bytes) => {
                let file: SnapshotFile = serde_json::from_slice(&bytes).map_err(|e| {
                    RaftError::damaged(&path, format!("the snapshot is not readable ({e})"))
                })?;
                let data = serde_json::to_vec(&file.machine)
                    .map_err(|e| RaftError::damaged(&path, e.to_string()))?;
                (file.machine, Some((file.meta, data)))
            }
        };
        Ok(Self {
            shared: Arc::new(MachineShared {
                machine: RwLock::new(machine),
                snapshot: Mutex::new(snapshot),
                path,
                notifier,
            }),
        })
    }

    /// The members (id and address) of the membership last applied, if any.
    pub(crate) fn applied_membership(&self) -> Option<BTreeMap<u64, String>> {
        let nodes: BTreeMap<u64, String> = self.read(|m| {
            m.membership
                .membership()
                .nodes()
                .map(|(id, n)| (*id, n.addr.clone()))
                .collect()
        });
        (!nodes.is_empty()).then_some(nodes)
    }

    /// Whether a snapshot was stored.
    pub(crate) fn has_snapshot(&self) -> bool {
        lock(&self.shared.snapshot).is_some()
    }

    /// Runs `f` on the current state.
    pub(crate) fn read<T>(&self, f: impl FnOnce(&Machine) -> T) -> T {
        let machine = self
            .shared
            .machine
            .read()
            .unwrap_or_else(|e| e.into_inner());
        f(&machine)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Machine> {
        self.shared
            .machine
            .write()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Stores `machine` as the snapshot `meta`, on disk then in memory.
    async fn save_snapshot(
        &self,
        meta: SnapshotMeta<u64, BasicNode>,
        machine: Machine,
    ) -> io::Result<Vec<u8>> {
        let shared = self.shared.clone();
        blocking(move || {
            let data = serde_json::to_vec(&machine).map_err(io::Error::other)?;
            let file = SnapshotFile { meta, machine };
            let bytes = serde_json::to_vec(&file).map_err(io::Error::other)?;
            replace(&shared.path, &bytes)?;
            *lock(&shared.snapshot) = Some((file.meta, data.clone()));
            Ok(data)
        })
        .await
    }
}

impl RaftSnapshotBuilder<TypeConfig> for MachineStore {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>> {
        let machine = self.read(Clone::clone);
        let snapshot_id = match machine.last_applied {
            Some(id) => format!(
                "{}-{}-{}",
                id.leader_id.term, id.leader_id.node_id, id.index
            ),
            None => "empty".to_owned(),
        };
        let meta = SnapshotMeta {
            last_log_id: machine.last_applied,
            last_membership: machine.membership.clone(),
            snapshot_id,
        };
        let data = self
            .save_snapshot(meta.clone(), machine)
            .await
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), io_err(&e)))?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for MachineStore {
    type SnapshotBuilder = MachineStore;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<u64>>, StoredMembership<u64, BasicNode>)> {
        Ok(self.read(|m| (m.last_applied, m.membership.clone())))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut machine = self.write();
        let mut answers = Vec::new();
        let mut changed = false;
        for entry in entries {
            machine.last_applied = Some(entry.log_id);
            let answer = match &entry.payload {
                EntryPayload::Blank => Response::Done,
                EntryPayload::Normal(command) => {
                    changed = true;
                    machine.leases.apply(entry.log_id.index, command)
                }
                EntryPayload::Membership(m) => {
                    machine.membership = StoredMembership::new(Some(entry.log_id), m.clone());
                    Response::Done
                }
            };
            answers.push(answer);
        }
        drop(machine);
        if changed {
            self.shared.notifier.notify();
        }
        Ok(answers)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<()> {
        tracing::info!(snapshot = %meta, "installing a snapshot from the leader");
        let signature = Some(meta.signature());
        let mut machine: Machine = serde_json::from_slice(snapshot.get_ref())
            .map_err(|e| StorageIOError::read_snapshot(signature.clone(), AnyError::new(&e)))?;
        machine.last_applied = meta.last_log_id;
        machine.membership = meta.last_membership.clone();
        self.save_snapshot(meta.clone(), machine.clone())
            .await
            .map_err(|e| StorageIOError::write_snapshot(signature, io_err(&e)))?;
        *self.write() = machine;
        self.shared.notifier.notify();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>> {
        Ok(lock(&self.shared.snapshot)
            .as_ref()
            .map(|(meta, data)| Snapshot {
                meta: meta.clone(),
                snapshot: Box::new(Cursor::new(data.clone())),
            }))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use leader_core::backend::Changes;
    use openraft::testing::{StoreBuilder, Suite};

    use super::*;

    /// Builds stores in fresh temporary folders, for openraft's own storage suite.
    struct Builder;

    impl StoreBuilder<TypeConfig, LogStore, MachineStore, (tempfile::TempDir, Folder)> for Builder {
        async fn build(&self) -> Result<((tempfile::TempDir, Folder), LogStore, MachineStore)> {
            let dir = tempfile::tempdir().expect("temp dir");
            let folder = Folder::open(&dir.path().join("data")).expect("folder");
            let log = LogStore::open(&folder).expect("log");
            let sm = MachineStore::open(&folder, Changes::channel().0).expect("machine");
            Ok(((dir, folder), log, sm))
        }
    }

    #[test]
    fn openraft_storage_suite() {
        Suite::test_all(Builder).unwrap();
    }

    fn log_of(ops: &[LogOp]) -> Vec<u8> {
        let mut bytes = Vec::new();
        for op in ops {
            frame(op, &mut bytes).unwrap();
        }
        bytes
    }

    #[test]
    fn only_the_end_of_the_last_append_may_be_torn() {
        let path = Path::new("/data/log");
        let ops = [
            LogOp::Truncate(5),
            LogOp::Committed(None),
            LogOp::Truncate(7),
        ];
        let whole = log_of(&ops);
        let (_, intact) = replay(path, &whole).unwrap();
        assert_eq!(intact, whole.len());
        let first = log_of(&ops[..1]).len();
        // Cut anywhere inside the last records, or followed by zeros: dropped.
        for cut in [whole.len() - 1, first + 3, first + HEADER + 1] {
            let (_, intact) = replay(path, &whole[..cut]).unwrap();
            assert!(intact <= cut && intact >= first, "{cut}: {intact}");
        }
        let mut zeros = whole.clone();
        zeros.extend_from_slice(&[0; 100]);
        assert_eq!(replay(path, &zeros).unwrap().1, whole.len());
        // Damage before the end: an error naming the file.
        for at in [1, 5, 9, HEADER + 1] {
            let mut damaged = whole.clone();
            damaged[at] ^= 0x40;
            let err = replay(path, &damaged).map(|r| r.1).unwrap_err().to_string();
            assert!(err.contains("/data/log"), "{at}: {err}");
        }
    }

    #[test]
    fn crc_is_the_standard_one() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
    }
}
