//! The embedded default: leases in files, for processes on one host.

use std::fs::{self, DirBuilder, File, OpenOptions, Permissions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;

use crate::backend::{
    Changes, Expected, FencedCas, FencedObject, FencedPut, LeaseBackend, ObjectWrite, Stored,
    WriteKind, WriteOutcome, WriteRequest, decode_fenced, encode_fenced,
};
use crate::error::Error;
use crate::model::{LeaseKey, LeaseRecord, ObjectName, Revision};
use crate::rand::Rng;
use crate::token::FencingToken;

/// Leases in a folder: one file per key, safe across processes on one host.
///
/// Each conditional write runs under an exclusive OS file lock (`flock`) on a companion
/// `.lock` file, which the kernel releases when a process dies, so a crash never leaves it
/// held. The record is replaced atomically (written to a temporary file, synced, renamed over
/// the old one, and the folder synced), so a reader sees the old record or the new one, never
/// a torn one; reads take no lock. The revision is a hash of the file's bytes; every record
/// carries a random nonce, so two writes never share a revision.
///
/// # Files
/// For a lease key `KEY`:
/// - `KEY.lease`: the JSON record;
/// - `KEY.lease.lock`: the lock, empty;
/// - `KEY.lease.high-water`: the highest fencing token ever issued for the key (see below);
/// - `.KEY.lease.<random>.tmp`: a record being written, for an instant (left behind only by a
///   crash, and then safe to delete).
///
/// A fenced object `NAME` lives in `NAME.fenced`, with `NAME.fenced.lock`.
///
/// # Tokens survive deletion
/// Deleting `KEY.lease` is the usual recovery from a stuck lease, and the next term still gets a
/// token above every earlier one: an acquire mints above the high-water file, which only ever
/// rises. The mark is raised (written and synced, under the same lock) *before* the record
/// that carries the new token, so a crash between the two writes skips a token but never
/// issues one twice. Deleting `KEY.lease.high-water` as well is a deliberate reset: tokens may
/// then start again from 1, and every resource fenced with this key must be reset with it.
/// (A record written by a version without the mark is covered from its next write on.)
///
/// # Security
/// Anyone who can write the folder can disturb the election (delete a record, hold a lock),
/// but cannot make the store write anywhere else: files are never opened through a symbolic
/// link (a symlink at the record, lock or high-water path is refused with
/// [`Error::InvalidConfig`] naming it), temporary files get fresh random names created
/// exclusively, and only regular files are read. Files are created with mode `0600` and
/// folders made by [`FileStore::create`] with `0700`; the builder changes both
/// ([`FileStoreBuilder::with_file_mode`], [`FileStoreBuilder::with_dir_mode`]), for example
/// to share the leases with a group. The modes are applied exactly, whatever the umask. Keep
/// the folder writable only by the users that run candidates.
#[derive(Clone, Debug)]
pub struct FileStore {
    dir: PathBuf,
    lock_wait: Duration,
    file_mode: u32,
    /// Test hook: fail every write right after the high-water mark is raised, as a crash
    /// between the two writes would.
    #[cfg(test)]
    crash_after_high_water: bool,
}

/// Settings of a [`FileStore`]: the folder, file and folder modes, the lock wait, and whether
/// to create the folder. From [`FileStore::builder`].
///
/// ```
/// # fn main() -> Result<(), leader_core::Error> {
/// # let tmp = tempfile::tempdir().map_err(|e| leader_core::Error::backend("tempdir", e))?;
/// // Leases shared with the group of the folder.
/// let store = leader_core::FileStore::builder(tmp.path().join("leases"))
///     .with_dir_mode(0o770)
///     .with_file_mode(0o660)
///     .create_if_missing(true)
///     .build()?;
/// # let _ = store;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct FileStoreBuilder {
    dir: PathBuf,
    lock_wait: Duration,
    file_mode: u32,
    dir_mode: u32,
    create_if_missing: bool,
}

impl FileStoreBuilder {
    /// How long a write waits for another process's lock before failing as unavailable
    /// (default [`FileStore::DEFAULT_LOCK_WAIT`]).
    pub fn with_lock_wait(mut self, wait: Duration) -> Self {
        self.lock_wait = wait;
        self
    }

    /// The permission bits of every file the store creates (default
    /// [`FileStore::DEFAULT_FILE_MODE`], `0o600`). Must include owner read and write
    /// (`0o600`) and nothing beyond `0o777`.
    pub fn with_file_mode(mut self, mode: u32) -> Self {
        self.file_mode = mode;
        self
    }

    /// The permission bits of the folders that [`create_if_missing`](Self::create_if_missing)
    /// makes (default [`FileStore::DEFAULT_DIR_MODE`], `0o700`); folders that exist keep
    /// theirs. Must include owner read, write and search (`0o700`) and nothing beyond `0o777`.
    pub fn with_dir_mode(mut self, mode: u32) -> Self {
        self.dir_mode = mode;
        self
    }

    /// Whether [`build`](Self::build) creates the folder and its missing parents (default
    /// `false`: a missing folder is an error).
    pub fn create_if_missing(mut self, create: bool) -> Self {
        self.create_if_missing = create;
        self
    }

    /// Checks the settings, creates the folder if asked, and opens the store.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a mode outside the rules above or a path that is not a
    /// folder; [`Error::NotFound`] if the folder is missing (and not to be created); another
    /// store [`Error`] if it cannot be created.
    pub fn build(self) -> Result<FileStore, Error> {
        check_mode("file", self.file_mode, 0o600)?;
        check_mode("folder", self.dir_mode, 0o700)?;
        if self.create_if_missing {
            create_folders(&self.dir, self.dir_mode)?;
        }
        match fs::metadata(&self.dir) {
            Ok(m) if m.is_dir() => Ok(FileStore {
                dir: self.dir,
                lock_wait: self.lock_wait,
                file_mode: self.file_mode,
                #[cfg(test)]
                crash_after_high_water: false,
            }),
            Ok(_) => Err(Error::InvalidConfig {
                message: format!("{} is not a folder", self.dir.display()),
                source: None,
            }),
            Err(e) => Err(map_io(&format!("lease folder {}", self.dir.display()), e)),
        }
    }
}

fn check_mode(what: &str, mode: u32, owner: u32) -> Result<(), Error> {
    if mode & !0o777 != 0 || mode & owner != owner {
        return Err(Error::InvalidConfig {
            message: format!(
                "{what} mode {mode:#o} is not allowed: use permission bits only (at most 0o777) \
                 including {owner:#o} for the owner"
            ),
            source: None,
        });
    }
    Ok(())
}

/// Creates `dir` and its missing parents with exactly `mode`, never through a symlink planted
/// in place of a folder it just made.
fn create_folders(dir: &Path, mode: u32) -> Result<(), Error> {
    let mut missing = Vec::new();
    let mut next = Some(dir);
    while let Some(p) = next {
        if p.as_os_str().is_empty() {
            break;
        }
        match fs::symlink_metadata(p) {
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                missing.push(p);
                next = p.parent();
            }
            Err(e) => return Err(map_io(&format!("lease folder {}", p.display()), e)),
        }
    }
    for p in missing.into_iter().rev() {
        let what = format!("lease folder {}", p.display());
        match DirBuilder::new().mode(mode).create(p) {
            Ok(()) => OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
                .open(p)
                .and_then(|d| d.set_permissions(Permissions::from_mode(mode)))
                .map_err(|e| map_io(&what, e))?,
            // Made by someone else meanwhile: it keeps its own mode.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(map_io(&what, e)),
        }
    }
    Ok(())
}

impl FileStore {
    /// How long a write waits for another process's lock by default.
    pub const DEFAULT_LOCK_WAIT: Duration = Duration::from_millis(500);
    /// The permission bits of the files the store creates, by default: owner only.
    pub const DEFAULT_FILE_MODE: u32 = 0o600;
    /// The permission bits of the folders [`FileStore::create`] makes, by default: owner only.
    pub const DEFAULT_DIR_MODE: u32 = 0o700;

    /// Settings for a store in `dir`, with the defaults; see [`FileStoreBuilder`].
    pub fn builder(dir: impl Into<PathBuf>) -> FileStoreBuilder {
        FileStoreBuilder {
            dir: dir.into(),
            lock_wait: Self::DEFAULT_LOCK_WAIT,
            file_mode: Self::DEFAULT_FILE_MODE,
            dir_mode: Self::DEFAULT_DIR_MODE,
            create_if_missing: false,
        }
    }

    /// A store in the existing folder `dir`, with the default settings.
    ///
    /// # Errors
    /// [`Error::NotFound`] if `dir` does not exist; [`Error::InvalidConfig`] if it is not a
    /// folder.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, Error> {
        Self::builder(dir).build()
    }

    /// A store in `dir`, creating the folder (and its parents) with mode `0700` if missing.
    ///
    /// # Errors
    /// A store [`Error`] if the folder cannot be created.
    pub fn create(dir: impl Into<PathBuf>) -> Result<Self, Error> {
        Self::builder(dir).create_if_missing(true).build()
    }

    /// How long a write waits for another process's lock before failing as unavailable.
    pub fn with_lock_wait(mut self, wait: Duration) -> Self {
        self.lock_wait = wait;
        self
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file that holds the record of `key`.
    pub fn lease_path(&self, key: &LeaseKey) -> PathBuf {
        self.dir.join(format!("{}.lease", key.as_str()))
    }

    /// The file that holds the highest token ever issued for `key`. Deleting it (with the
    /// record) resets the key's tokens; see [Tokens survive deletion](FileStore#tokens-survive-deletion).
    pub fn high_water_path(&self, key: &LeaseKey) -> PathBuf {
        self.dir.join(format!("{}.lease.high-water", key.as_str()))
    }

    fn object_path(&self, object: &ObjectName) -> PathBuf {
        self.dir.join(format!("{}.fenced", object.as_str()))
    }

    async fn blocking<T, F>(&self, f: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T, Error> + Send + 'static,
    {
        tokio::task::spawn_blocking(f)
            .await
            .map_err(|e| Error::Indeterminate {
                message: "a file operation was cancelled or panicked".to_owned(),
                source: Some(Box::new(e)),
            })?
    }

    /// The conditional write, on a blocking thread; `rng` names the temporary files.
    fn write_blocking(&self, request: WriteRequest, rng: &mut Rng) -> Result<WriteOutcome, Error> {
        let path = self.lease_path(&request.key);
        let _lock = lock(&lock_path(&path), self.lock_wait, self.file_mode)?;
        let current = read_optional(&path)?;
        if !request
            .expected
            .matches(current.as_deref().map(revision_of).as_ref())
        {
            let current = current.and_then(|bytes| {
                LeaseRecord::from_json(request.key.as_str(), &bytes)
                    .ok()
                    .map(|record| Stored {
                        record,
                        revision: revision_of(&bytes),
                    })
            });
            return Ok(WriteOutcome::Conflict { current });
        }
        let high_path = self.high_water_path(&request.key);
        let high = read_high_water(&request.key, &high_path)?;
        let mut record = request.record;
        if request.kind == WriteKind::Acquire
            && let Some(high) = high.filter(|h| record.token <= *h)
        {
            // The record was deleted (or never seen): mint above every token of the key.
            let minted = high.next().ok_or_else(|| Error::InvalidConfig {
                message: format!(
                    "the fencing token of {} reached u64::MAX in {}; reset the key deliberately \
                     (delete the record and that file)",
                    request.key,
                    high_path.display()
                ),
                source: None,
            })?;
            tracing::info!(
                key = %request.key,
                proposed = %record.token,
                token = %minted,
                "the key issued higher tokens before (its record was deleted): minting above them"
            );
            record.token = minted;
        }
        if high.is_none_or(|h| record.token > h) {
            // Durable before the record: a crash in between skips a token, never reissues one.
            let bytes = format!("{HIGH_WATER_HEADER}{}\n", record.token).into_bytes();
            replace(&high_path, &bytes, self.file_mode, rng)?;
        }
        #[cfg(test)]
        if self.crash_after_high_water {
            return Err(Error::unavailable(
                "simulated crash after the high-water mark",
            ));
        }
        let bytes = record.to_json();
        replace(&path, &bytes, self.file_mode, rng)?;
        Ok(WriteOutcome::Written(Stored {
            record,
            revision: revision_of(&bytes),
        }))
    }

    /// The conditional write of a protected object, on a blocking thread, under the object's
    /// lock; `rng` names the temporary files.
    fn put_fenced_blocking(
        &self,
        token: FencingToken,
        object: &ObjectName,
        expected: &Expected,
        value: &[u8],
        rng: &mut Rng,
    ) -> Result<ObjectWrite, Error> {
        let path = self.object_path(object);
        let _lock = lock(&lock_path(&path), self.lock_wait, self.file_mode)?;
        let current = read_optional(&path)?.map(|bytes| revision_of(&bytes));
        if !expected.matches(current.as_ref()) {
            return Ok(ObjectWrite::Conflict);
        }
        let bytes = encode_fenced(token, value);
        replace(&path, &bytes, self.file_mode, rng)?;
        Ok(ObjectWrite::Written(revision_of(&bytes)))
    }
}

/// Maps an I/O error on `what` to the store's error kinds, in one place.
fn map_io(what: &str, e: io::Error) -> Error {
    if e.raw_os_error() == Some(libc::ELOOP) {
        // Only `O_NOFOLLOW` opens meet a symlink here; following it could write anywhere.
        return Error::InvalidConfig {
            message: format!(
                "{what} is a symbolic link, and the file store never reads or writes through \
                 one; remove the link, and let only the users that run candidates write the folder"
            ),
            source: Some(Box::new(e)),
        };
    }
    match e.kind() {
        io::ErrorKind::NotFound => Error::NotFound {
            what: what.to_owned(),
            source: Some(Box::new(e)),
        },
        io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => {
            Error::PermissionDenied {
                message: format!("{what}: {e}"),
                source: Some(Box::new(e)),
            }
        }
        io::ErrorKind::IsADirectory | io::ErrorKind::NotADirectory => Error::InvalidConfig {
            message: format!(
                "{what} is a folder where a file belongs (or the reverse); remove it or choose another key"
            ),
            source: Some(Box::new(e)),
        },
        _ => Error::Unavailable {
            message: format!("I/O error on {what}"),
            source: Some(Box::new(e)),
        },
    }
}

/// FNV-1a over the bytes: a revision that changes with every write (each carries a nonce).
fn revision_of(bytes: &[u8]) -> Revision {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    Revision::new(format!("{h:016x}-{}", bytes.len()))
}

/// Flags for opening a file that may exist: never through a symlink, never blocking on a FIFO.
const OPEN_EXISTING: i32 = libc::O_NOFOLLOW | libc::O_NONBLOCK;

/// Refuses anything but a regular file (a FIFO or socket planted in the folder). A folder is
/// let through if `folder_ok` (reading it then fails with `EISDIR`), else refused like one.
fn check_regular(file: &File, path: &Path, folder_ok: bool) -> Result<(), Error> {
    let what = path.display().to_string();
    let meta = file.metadata().map_err(|e| map_io(&what, e))?;
    if meta.is_file() || (folder_ok && meta.is_dir()) {
        return Ok(());
    }
    if meta.is_dir() {
        return Err(map_io(&what, io::Error::from(io::ErrorKind::IsADirectory)));
    }
    Err(Error::InvalidConfig {
        message: format!(
            "{what} is not a regular file (a FIFO, socket or device); remove it, and let only \
             the users that run candidates write the folder"
        ),
        source: None,
    })
}

fn read_optional(path: &Path) -> Result<Option<Vec<u8>>, Error> {
    let what = path.display().to_string();
    let mut file = match OpenOptions::new()
        .read(true)
        .custom_flags(OPEN_EXISTING)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            // A missing file is an absent record, but a missing folder is a setup error.
            return match path.parent().map(fs::metadata) {
                Some(Err(e)) => Err(map_io(&format!("lease folder {}", path.display()), e)),
                _ => Ok(None),
            };
        }
        Err(e) => return Err(map_io(&what, e)),
    };
    check_regular(&file, path, true)?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(|e| map_io(&what, e))?;
    Ok(Some(bytes))
}

const HIGH_WATER_HEADER: &str = "leader-high-water v1 ";

/// The key's high-water mark, or `None` if it has none.
fn read_high_water(key: &LeaseKey, path: &Path) -> Result<Option<FencingToken>, Error> {
    let Some(bytes) = read_optional(path)? else {
        return Ok(None);
    };
    std::str::from_utf8(&bytes)
        .ok()
        .and_then(|s| s.strip_suffix('\n'))
        .and_then(|s| s.strip_prefix(HIGH_WATER_HEADER))
        .and_then(|t| t.parse::<u64>().ok())
        .map(|t| Some(FencingToken(t)))
        .ok_or_else(|| Error::MalformedRecord {
            key: key.to_string(),
            detail: format!(
                "its high-water file {} is not `{HIGH_WATER_HEADER}<token>`; restore the highest \
                 token issued, or delete the file to reset the key's tokens deliberately",
                path.display()
            ),
        })
}

/// Holds an exclusive `flock` on `path` until dropped (the kernel also drops it if the
/// process dies).
struct Locked(File);

impl Drop for Locked {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}

/// Opens the lock file, creating it with exactly `mode` if missing; never through a symlink.
fn open_lock(path: &Path, mode: u32) -> Result<File, Error> {
    let what = path.display().to_string();
    let mut last = None;
    // Two tries: the file may vanish between the failed create and the open.
    for _ in 0..2 {
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
        {
            Ok(file) => {
                file.set_permissions(Permissions::from_mode(mode))
                    .map_err(|e| map_io(&what, e))?;
                return Ok(file);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(map_io(&what, e)),
        }
        // `flock` needs no write access; reading also opens a planted FIFO without blocking,
        // so that it is refused below.
        match OpenOptions::new()
            .read(true)
            .custom_flags(OPEN_EXISTING)
            .open(path)
        {
            Ok(file) => {
                check_regular(&file, path, false)?;
                return Ok(file);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => last = Some(e),
            Err(e) => return Err(map_io(&what, e)),
        }
    }
    Err(map_io(
        &what,
        last.unwrap_or_else(|| io::Error::from(io::ErrorKind::NotFound)),
    ))
}

fn lock(path: &Path, wait: Duration, mode: u32) -> Result<Locked, Error> {
    let file = open_lock(path, mode)?;
    #[allow(clippy::disallowed_methods)] // a bounded wait for a lock, on a blocking thread
    let start = std::time::Instant::now();
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(Locked(file)),
            Err(fs::TryLockError::WouldBlock) => {
                if start.elapsed() >= wait {
                    return Err(Error::unavailable(format!(
                        "{} is locked by another process for over {wait:?}",
                        path.display()
                    )));
                }
                #[allow(clippy::disallowed_methods)] // on a blocking thread, not the runtime
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(fs::TryLockError::Error(e)) => {
                return Err(map_io(&format!("lock {}", path.display()), e));
            }
        }
    }
}

/// How many fresh names a temporary file may try. Names carry 64 random bits, so a clash is
/// either a planted file or a broken random source.
const TEMP_TRIES: usize = 8;

/// Creates a new temporary file beside `path` with exactly `mode`: a fresh random name, created
/// exclusively, so that nothing planted in the folder can redirect the write.
fn create_temp(path: &Path, mode: u32, rng: &mut Rng) -> Result<(PathBuf, File), Error> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    for _ in 0..TEMP_TRIES {
        let tmp = dir.join(format!(".{name}.{:016x}.tmp", rng.next_u64()));
        let what = tmp.display().to_string();
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
        {
            Ok(file) => {
                if let Err(e) = file.set_permissions(Permissions::from_mode(mode)) {
                    drop(file);
                    let _ = fs::remove_file(&tmp);
                    return Err(map_io(&what, e));
                }
                return Ok((tmp, file));
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                tracing::warn!(path = %what, "a temporary file name is taken; trying another");
            }
            Err(e) => return Err(map_io(&what, e)),
        }
    }
    Err(Error::InvalidConfig {
        message: format!(
            "{TEMP_TRIES} fresh temporary names beside {} were all taken: something is planting \
             files in the folder; let only the users that run candidates write it",
            path.display()
        ),
        source: None,
    })
}

/// Replaces `path` with `bytes` atomically, through a fresh temporary file that is removed if
/// anything fails before the rename. Errors before the rename mean nothing changed; an error
/// after it leaves the outcome unknown.
fn replace(path: &Path, bytes: &[u8], mode: u32, rng: &mut Rng) -> Result<(), Error> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let (tmp, mut file) = create_temp(path, mode, rng)?;
    let written = file.write_all(bytes).and_then(|()| file.sync_all());
    drop(file);
    let renamed = written
        .map_err(|e| map_io(&tmp.display().to_string(), e))
        .and_then(|()| fs::rename(&tmp, path).map_err(|e| map_io(&path.display().to_string(), e)));
    if let Err(e) = renamed {
        if let Err(cleanup) = fs::remove_file(&tmp) {
            tracing::warn!(path = %tmp.display(), error = %cleanup, "could not remove a temporary file");
        }
        return Err(e);
    }
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::Indeterminate {
            message: format!("could not sync folder {} after a write", dir.display()),
            source: Some(Box::new(e)),
        })
}

fn lock_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".lock");
    PathBuf::from(p)
}

#[async_trait]
impl LeaseBackend for FileStore {
    fn name(&self) -> &'static str {
        "file"
    }

    async fn read(&self, key: &LeaseKey) -> Result<Option<Stored>, Error> {
        let path = self.lease_path(key);
        let key = key.clone();
        self.blocking(move || {
            read_optional(&path)?
                .map(|bytes| {
                    Ok(Stored {
                        record: LeaseRecord::from_json(key.as_str(), &bytes)?,
                        revision: revision_of(&bytes),
                    })
                })
                .transpose()
        })
        .await
    }

    /// Change hints from the operating system's file notifications (inotify on Linux) on
    /// the record's folder, for events on the record file: a follower on this host learns
    /// of a release at once instead of at its next poll. `None` (polling only) if the
    /// watch cannot be set up, e.g. when the inotify limits are reached. Changes made on
    /// another host of a network file system raise no event there: the poll covers them.
    fn changes(&self, key: &LeaseKey) -> Option<Changes> {
        let path = self.lease_path(key);
        let (folder, name) = (path.parent()?.to_owned(), path.file_name()?.to_owned());
        let (notifier, changes) = Changes::channel();
        let handler = move |event: notify::Result<notify::Event>| {
            // Only what changes the record: a rename onto it, a write, a delete. Opening and
            // reading it (every follower's read) is not a change, and hinting it would wake
            // the followers into reading each other's reads forever.
            if let Ok(event) = event
                && matches!(
                    event.kind,
                    notify::EventKind::Create(_)
                        | notify::EventKind::Modify(_)
                        | notify::EventKind::Remove(_)
                )
                && event
                    .paths
                    .iter()
                    .any(|p| p.file_name() == Some(name.as_os_str()))
            {
                notifier.notify();
            }
        };
        let watcher = notify::recommended_watcher(handler).and_then(|mut w| {
            notify::Watcher::watch(&mut w, &folder, notify::RecursiveMode::NonRecursive)?;
            Ok(w)
        });
        match watcher {
            Ok(watcher) => Some(changes.keep_alive(watcher)),
            Err(e) => {
                tracing::debug!(folder = %folder.display(), error = %e, "no file change hints; followers poll");
                None
            }
        }
    }

    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        let store = self.clone();
        self.blocking(move || store.write_blocking(request, &mut Rng::from_entropy()))
            .await
    }
}

#[async_trait]
impl FencedCas for FileStore {
    async fn get_fenced(&self, object: &ObjectName) -> Result<Option<FencedObject>, Error> {
        let path = self.object_path(object);
        let name = object.to_string();
        self.blocking(move || {
            read_optional(&path)?
                .map(|bytes| decode_fenced(&name, &bytes, revision_of(&bytes)))
                .transpose()
        })
        .await
    }

    async fn put_fenced_if(&self, put: FencedPut<'_>) -> Result<ObjectWrite, Error> {
        let store = self.clone();
        let (object, expected, value) =
            (put.object.clone(), put.expected.clone(), put.value.to_vec());
        let token = put.fence.token;
        self.blocking(move || {
            store.put_fenced_blocking(token, &object, &expected, &value, &mut Rng::from_entropy())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{HolderId, Metadata, TermId, WriteNonce};

    fn key() -> LeaseKey {
        LeaseKey::new("job").unwrap()
    }

    fn request(expected: Expected, token: u64, kind: WriteKind) -> WriteRequest {
        let record = LeaseRecord::held(
            HolderId::new("a").unwrap(),
            FencingToken(token),
            Duration::from_secs(10),
            Metadata::new(),
            WriteNonce(token),
        );
        WriteRequest::new(key(), expected, record, kind, TermId(u128::from(token)))
    }

    fn written_token(outcome: WriteOutcome) -> FencingToken {
        match outcome {
            WriteOutcome::Written(stored) => stored.record.token,
            other => panic!("expected a write, got {other:?}"),
        }
    }

    /// Names of the temporary files left in `dir`.
    fn leftovers(dir: &Path) -> Vec<String> {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect()
    }

    /// A crash between raising the mark and writing the record skips a token; it never lets
    /// the next term reuse the one the crashed write carried.
    #[test]
    fn the_mark_is_durable_before_the_record() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = FileStore::open(dir.path()).unwrap();
        let mut rng = Rng::seeded(1);
        store.crash_after_high_water = true;
        let err = store
            .write_blocking(request(Expected::Absent, 5, WriteKind::Acquire), &mut rng)
            .unwrap_err();
        assert!(err.to_string().contains("simulated crash"), "{err}");
        assert!(
            !store.lease_path(&key()).exists(),
            "the record was not written"
        );
        assert_eq!(
            read_high_water(&key(), &store.high_water_path(&key())).unwrap(),
            Some(FencingToken(5))
        );
        // Recovery: a candidate that never saw token 5 proposes 1 and gets 6.
        store.crash_after_high_water = false;
        let token = written_token(
            store
                .write_blocking(request(Expected::Absent, 1, WriteKind::Acquire), &mut rng)
                .unwrap(),
        );
        assert_eq!(token, FencingToken(6));
    }

    #[test]
    fn a_renew_keeps_its_token_and_never_lowers_the_mark() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::open(dir.path()).unwrap();
        let mut rng = Rng::seeded(2);
        let mark = store.high_water_path(&key());
        fs::write(&mark, format!("{HIGH_WATER_HEADER}9\n")).unwrap();
        let first = store
            .write_blocking(request(Expected::Absent, 3, WriteKind::Acquire), &mut rng)
            .unwrap();
        let WriteOutcome::Written(first) = first else {
            panic!("{first:?}")
        };
        assert_eq!(first.record.token, FencingToken(10));
        // A renew carrying a lower token (not what the core sends) is stored as given and
        // leaves the mark where it was.
        let renew = request(Expected::Revision(first.revision), 4, WriteKind::Renew);
        assert_eq!(
            written_token(store.write_blocking(renew, &mut rng).unwrap()),
            FencingToken(4)
        );
        assert_eq!(
            read_high_water(&key(), &mark).unwrap(),
            Some(FencingToken(10))
        );
    }

    #[test]
    fn a_damaged_mark_is_reported_and_blocks_the_write() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::open(dir.path()).unwrap();
        let mark = store.high_water_path(&key());
        fs::write(&mark, b"seven").unwrap();
        let err = store
            .write_blocking(
                request(Expected::Absent, 1, WriteKind::Acquire),
                &mut Rng::seeded(3),
            )
            .unwrap_err();
        assert!(matches!(err, Error::MalformedRecord { .. }), "{err}");
        assert!(err.to_string().contains("job.lease.high-water"), "{err}");
        assert!(!store.lease_path(&key()).exists());
        assert_eq!(fs::read(&mark).unwrap(), b"seven");
    }

    #[test]
    fn a_mark_at_the_top_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::open(dir.path()).unwrap();
        let mark = store.high_water_path(&key());
        fs::write(&mark, format!("{HIGH_WATER_HEADER}{}\n", u64::MAX)).unwrap();
        let err = store
            .write_blocking(
                request(Expected::Absent, 1, WriteKind::Acquire),
                &mut Rng::seeded(4),
            )
            .unwrap_err();
        assert!(matches!(err, Error::InvalidConfig { .. }), "{err}");
        assert!(err.to_string().contains("u64::MAX"), "{err}");
        assert!(!store.lease_path(&key()).exists());
    }

    /// Symlinks planted at the very names the next temporary files will get (the generator is
    /// seeded here, so the test knows them) cannot redirect a write: each name is skipped, the
    /// victim is untouched, and the planted links are left alone.
    #[test]
    fn symlinks_at_the_next_temporary_names_cannot_redirect_a_write() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::open(dir.path()).unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, b"precious").unwrap();
        let path = store.lease_path(&key());
        let mut names = Rng::seeded(7);
        let planted: Vec<PathBuf> = (0..TEMP_TRIES - 1)
            .map(|_| {
                dir.path()
                    .join(format!(".job.lease.{:016x}.tmp", names.next_u64()))
            })
            .collect();
        for p in &planted {
            std::os::unix::fs::symlink(&victim, p).unwrap();
        }
        replace(&path, b"record", 0o600, &mut Rng::seeded(7)).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"record");
        assert_eq!(fs::read(&victim).unwrap(), b"precious");
        for p in &planted {
            assert!(fs::symlink_metadata(p).unwrap().file_type().is_symlink());
        }

        // Every name taken: the write gives up with a clear error and changes nothing.
        for p in &planted {
            fs::remove_file(p).unwrap();
        }
        let mut names = Rng::seeded(8);
        for _ in 0..TEMP_TRIES {
            let p = dir
                .path()
                .join(format!(".job.lease.{:016x}.tmp", names.next_u64()));
            std::os::unix::fs::symlink(&victim, p).unwrap();
        }
        let err = replace(&path, b"other", 0o600, &mut Rng::seeded(8)).unwrap_err();
        assert!(matches!(err, Error::InvalidConfig { .. }), "{err}");
        assert!(err.to_string().contains("planting"), "{err}");
        assert_eq!(fs::read(&path).unwrap(), b"record");
        assert_eq!(fs::read(&victim).unwrap(), b"precious");
    }

    #[test]
    fn a_failed_replace_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        // The target is a folder that is not empty: the rename fails after the temporary file
        // was written.
        let target = dir.path().join("job.lease");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("inside"), b"x").unwrap();
        let err = replace(&target, b"record", 0o600, &mut Rng::seeded(9)).unwrap_err();
        assert!(!err.is_retryable(), "{err}");
        assert!(
            leftovers(dir.path()).is_empty(),
            "{:?}",
            leftovers(dir.path())
        );
        // And a successful one leaves none either.
        let ok = dir.path().join("other.lease");
        replace(&ok, b"record", 0o600, &mut Rng::seeded(9)).unwrap();
        assert!(
            leftovers(dir.path()).is_empty(),
            "{:?}",
            leftovers(dir.path())
        );
    }

    #[tokio::test]
    async fn missing_folder_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let err = FileStore::open(&missing).unwrap_err();
        assert!(matches!(err, Error::NotFound { .. }), "{err}");
        assert!(err.to_string().contains("nope"), "{err}");

        // A folder removed after opening: reads say so instead of "no record".
        let store = FileStore::create(&missing).unwrap();
        fs::remove_dir(&missing).unwrap();
        let err = store.read(&LeaseKey::new("k").unwrap()).await.unwrap_err();
        assert!(matches!(err, Error::NotFound { .. }), "{err}");
    }

    #[test]
    fn a_held_lock_makes_writers_wait_then_fail_as_unavailable() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.lock");
        let held = lock(&p, Duration::from_millis(10), 0o600).unwrap();
        let err = lock(&p, Duration::from_millis(20), 0o600).err().unwrap();
        assert!(err.is_retryable(), "{err}");
        drop(held);
        assert!(lock(&p, Duration::from_millis(20), 0o600).is_ok());
    }
}
