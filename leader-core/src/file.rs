//! The embedded default: leases in files, for processes on one host.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;

use crate::backend::{
    Expected, Fence, FencedObject, FencedStore, LeaseBackend, Stored, WriteOutcome, WriteRequest,
};
use crate::error::Error;
use crate::model::{FencingToken, LeaseKey, LeaseRecord, ObjectName, Revision};

/// Leases in a folder: one file per key, safe across processes on one host.
///
/// Each conditional write runs under an exclusive OS file lock (`flock`) on a companion
/// `.lock` file, which the kernel releases when a process dies, so a crash never leaves it
/// held. The record is replaced atomically (written to a temporary file, synced, renamed over
/// the old one, and the folder synced), so a reader sees the old record or the new one, never
/// a torn one; reads take no lock. The revision is a hash of the file's bytes; every record
/// carries a random nonce, so two writes never share a revision.
///
/// Files: `KEY.lease` (the JSON record), `KEY.lease.lock`, and for fenced objects
/// `NAME.fenced` and `NAME.fenced.lock`.
#[derive(Clone, Debug)]
pub struct FileStore {
    dir: PathBuf,
    lock_wait: Duration,
}

impl FileStore {
    /// How long a write waits for another process's lock by default.
    pub const DEFAULT_LOCK_WAIT: Duration = Duration::from_millis(500);

    /// A store in the existing folder `dir`.
    ///
    /// # Errors
    /// [`Error::NotFound`] if `dir` does not exist or is not a folder.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, Error> {
        let dir = dir.into();
        match fs::metadata(&dir) {
            Ok(m) if m.is_dir() => Ok(Self {
                dir,
                lock_wait: Self::DEFAULT_LOCK_WAIT,
            }),
            Ok(_) => Err(Error::InvalidConfig {
                message: format!("{} is not a folder", dir.display()),
                source: None,
            }),
            Err(e) => Err(map_io(&format!("lease folder {}", dir.display()), e)),
        }
    }

    /// A store in `dir`, creating the folder (and its parents) if missing.
    ///
    /// # Errors
    /// A store [`Error`] if the folder cannot be created.
    pub fn create(dir: impl Into<PathBuf>) -> Result<Self, Error> {
        let dir = dir.into();
        fs::create_dir_all(&dir)
            .map_err(|e| map_io(&format!("lease folder {}", dir.display()), e))?;
        Self::open(dir)
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
}

/// Maps an I/O error on `what` to the store's error kinds, in one place.
fn map_io(what: &str, e: io::Error) -> Error {
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

fn read_optional(path: &Path) -> Result<Option<Vec<u8>>, Error> {
    match fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            // A missing file is an absent record, but a missing folder is a setup error.
            match path.parent().map(fs::metadata) {
                Some(Err(e)) => Err(map_io(&format!("lease folder {}", path.display()), e)),
                _ => Ok(None),
            }
        }
        Err(e) => Err(map_io(&path.display().to_string(), e)),
    }
}

/// Holds an exclusive `flock` on `path` until dropped (the kernel also drops it if the
/// process dies).
struct Locked(File);

impl Drop for Locked {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}

fn lock(path: &Path, wait: Duration) -> Result<Locked, Error> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| map_io(&path.display().to_string(), e))?;
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

/// Replaces `path` with `bytes` atomically. Errors before the rename mean nothing changed;
/// an error after it leaves the outcome unknown.
fn replace(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp"));
    let what = tmp.display().to_string();
    let mut file = File::create(&tmp).map_err(|e| map_io(&what, e))?;
    file.write_all(bytes).map_err(|e| map_io(&what, e))?;
    file.sync_all().map_err(|e| map_io(&what, e))?;
    drop(file);
    fs::rename(&tmp, path).map_err(|e| map_io(&path.display().to_string(), e))?;
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

    async fn write(&self, request: WriteRequest) -> Result<WriteOutcome, Error> {
        let path = self.lease_path(&request.key);
        let wait = self.lock_wait;
        self.blocking(move || {
            let _lock = lock(&lock_path(&path), wait)?;
            let current = read_optional(&path)?;
            let matches = match (&request.expected, &current) {
                (Expected::Absent, None) => true,
                (Expected::Revision(want), Some(bytes)) => *want == revision_of(bytes),
                _ => false,
            };
            if !matches {
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
            let bytes = request.record.to_json();
            replace(&path, &bytes)?;
            Ok(WriteOutcome::Written(Stored {
                record: request.record,
                revision: revision_of(&bytes),
            }))
        })
        .await
    }
}

const FENCE_HEADER: &str = "leader-fence v1 ";

fn decode_object(name: &str, bytes: &[u8]) -> Result<FencedObject, Error> {
    let malformed = |detail: &str| Error::MalformedRecord {
        key: name.to_owned(),
        detail: detail.to_owned(),
    };
    let newline = bytes
        .iter()
        .position(|b| *b == b'\n')
        .ok_or_else(|| malformed("no header line"))?;
    let header =
        std::str::from_utf8(&bytes[..newline]).map_err(|_| malformed("header is not UTF-8"))?;
    let token = header
        .strip_prefix(FENCE_HEADER)
        .and_then(|t| t.parse::<u64>().ok())
        .ok_or_else(|| malformed("header is not `leader-fence v1 <token>`"))?;
    Ok(FencedObject {
        fence: FencingToken(token),
        value: bytes[newline + 1..].to_vec(),
        revision: revision_of(bytes),
    })
}

#[async_trait]
impl FencedStore for FileStore {
    async fn fenced_write(
        &self,
        fence: &Fence,
        object: &ObjectName,
        value: &[u8],
    ) -> Result<FencedObject, Error> {
        let path = self.object_path(object);
        let wait = self.lock_wait;
        let name = object.to_string();
        let token = fence.token;
        let value = value.to_vec();
        self.blocking(move || {
            let _lock = lock(&lock_path(&path), wait)?;
            if let Some(bytes) = read_optional(&path)? {
                let current = decode_object(&name, &bytes)?;
                if current.fence > token {
                    return Err(Error::Fenced {
                        object: name,
                        presented: token,
                        highest: Some(current.fence),
                    });
                }
            }
            let mut bytes = format!("{FENCE_HEADER}{token}\n").into_bytes();
            bytes.extend_from_slice(&value);
            replace(&path, &bytes)?;
            Ok(FencedObject {
                fence: token,
                value,
                revision: revision_of(&bytes),
            })
        })
        .await
    }

    async fn fenced_read(&self, object: &ObjectName) -> Result<Option<FencedObject>, Error> {
        let path = self.object_path(object);
        let name = object.to_string();
        self.blocking(move || {
            read_optional(&path)?
                .map(|bytes| decode_object(&name, &bytes))
                .transpose()
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let held = lock(&p, Duration::from_millis(10)).unwrap();
        let err = lock(&p, Duration::from_millis(20)).err().unwrap();
        assert!(err.is_retryable(), "{err}");
        drop(held);
        assert!(lock(&p, Duration::from_millis(20)).is_ok());
    }

    #[test]
    fn damaged_fenced_object_names_the_object() {
        let err = decode_object("orders", b"nonsense").unwrap_err();
        assert!(err.to_string().contains("orders"), "{err}");
        let ok = decode_object("o", b"leader-fence v1 7\npayload").unwrap();
        assert_eq!(ok.fence, FencingToken(7));
        assert_eq!(ok.value, b"payload");
    }
}
