//! The data folder and its files: created owner-only, never opened through a symlink, replaced
//! atomically, locked against a second member.

use std::fs::{self, DirBuilder, File, OpenOptions, Permissions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::RaftError;

/// The permission bits of the data folder when this crate creates it.
pub(crate) const DIR_MODE: u32 = 0o700;
/// The permission bits of every file this crate creates.
pub(crate) const FILE_MODE: u32 = 0o600;

/// The open data folder, locked for this process until dropped.
#[derive(Debug)]
pub(crate) struct Folder {
    dir: PathBuf,
    _lock: File,
}

impl Folder {
    /// Opens `dir`, creating it (mode `0700`) if missing. Refuses a symlink, something that is
    /// not a folder, a folder that group or others may write, and a folder another member has
    /// locked.
    pub(crate) fn open(dir: &Path) -> Result<Self, RaftError> {
        match fs::symlink_metadata(dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                DirBuilder::new()
                    .recursive(true)
                    .mode(DIR_MODE)
                    .create(dir)
                    .and_then(|()| fs::set_permissions(dir, Permissions::from_mode(DIR_MODE)))
                    .map_err(|e| RaftError::folder(dir, "cannot create it", Some(e)))?;
            }
            Err(e) => return Err(RaftError::folder(dir, "cannot inspect it", Some(e))),
            Ok(_) => {}
        }
        let meta = fs::symlink_metadata(dir)
            .map_err(|e| RaftError::folder(dir, "cannot inspect it", Some(e)))?;
        if meta.file_type().is_symlink() || !meta.is_dir() {
            return Err(RaftError::folder(
                dir,
                "it is not a folder (or is a symbolic link); give the path of a real folder",
                None,
            ));
        }
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o022 != 0 {
            return Err(RaftError::folder(
                dir,
                format!(
                    "its mode {mode:#o} lets group or others write it, and whoever writes it can \
                     forge the member's vote and log; run `chmod 700` on it"
                ),
                None,
            ));
        }
        let lock_path = dir.join("lock");
        let lock = open_file(
            &lock_path,
            OpenOptions::new().read(true).write(true).create(true),
        )
        .map_err(|e| RaftError::folder(&lock_path, "cannot open the lock file", Some(e)))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                return Err(RaftError::FolderInUse {
                    path: dir.to_owned(),
                });
            }
            Err(fs::TryLockError::Error(e)) => {
                return Err(RaftError::folder(&lock_path, "cannot lock it", Some(e)));
            }
        }
        Ok(Self {
            dir: dir.to_owned(),
            _lock: lock,
        })
    }

    /// The path of `name` in the folder.
    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// Opens `path` with `options`, never through a symlink, creating it with exactly mode `0600`;
/// refuses anything but a regular file.
pub(crate) fn open_file(path: &Path, options: &mut OpenOptions) -> io::Result<File> {
    let file = options
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file; remove it",
        ));
    }
    if meta.permissions().mode() & 0o777 != FILE_MODE {
        file.set_permissions(Permissions::from_mode(FILE_MODE))?;
    }
    Ok(file)
}

/// The content of `path`, or `None` if there is no such file.
pub(crate) fn read_optional(path: &Path) -> io::Result<Option<Vec<u8>>> {
    let mut file = match open_file(path, OpenOptions::new().read(true)) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(Some(bytes))
}

/// Replaces `path` with `bytes` atomically and durably: a temporary file beside it, written and
/// synced, renamed over it, then the folder synced. The folder lock keeps the temporary name
/// ours alone.
pub(crate) fn replace(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp"));
    match fs::remove_file(&tmp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let written =
        open_file(&tmp, OpenOptions::new().write(true).create_new(true)).and_then(|mut file| {
            file.write_all(bytes)?;
            file.sync_all()
        });
    if let Err(e) = written.and_then(|()| fs::rename(&tmp, path)) {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_new_folder_is_owner_only_and_locked() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a/b");
        let folder = Folder::open(&dir).unwrap();
        let mode = fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        assert!(matches!(
            Folder::open(&dir),
            Err(RaftError::FolderInUse { .. })
        ));
        replace(&folder.path("f"), b"x").unwrap();
        let mode = fs::metadata(folder.path("f")).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        drop(folder);
        fs::set_permissions(&dir, Permissions::from_mode(0o770)).unwrap();
        let err = Folder::open(&dir).unwrap_err().to_string();
        assert!(err.contains("chmod 700"), "{err}");
    }
}
