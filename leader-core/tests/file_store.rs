//! The file store against a hostile folder (symlinks, FIFOs, planted names), its file and
//! folder modes, and its high-water mark as operators meet it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use leader_core::{
    Acquisition, Error, Fence, FencedStore, FencingToken, FileStore, HolderId, LeaseBackend,
    LeaseClient, LeaseKey, ObjectName, Timing,
};

fn key() -> LeaseKey {
    LeaseKey::new("job").unwrap()
}

fn client(store: &FileStore, who: &str) -> LeaseClient {
    let store: Arc<dyn LeaseBackend> = Arc::new(store.clone());
    LeaseClient::new(
        store,
        key(),
        HolderId::new(who).unwrap(),
        Timing::from_ttl(Duration::from_secs(10)),
    )
    .unwrap()
}

async fn acquire(store: &FileStore, who: &str) -> Result<FencingToken, Error> {
    match client(store, who).try_acquire().await? {
        Acquisition::Acquired(grant) => Ok(grant.token),
        other => panic!("{who} should have acquired, got {other:?}"),
    }
}

/// A file outside the store that a planted link points at.
/// The fence of holder "a"'s term with `token`.
fn fence_of_a(token: FencingToken) -> Fence {
    Fence::new(key(), HolderId::new("a").unwrap(), token)
}

fn victim(dir: &Path) -> PathBuf {
    let victim = dir.join("victim");
    fs::write(&victim, b"precious").unwrap();
    victim
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
}

fn is_symlink(path: &Path) -> bool {
    fs::symlink_metadata(path).unwrap().file_type().is_symlink()
}

fn assert_refused_naming(err: &Error, path: &Path) {
    assert!(matches!(err, Error::InvalidConfig { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains(&path.display().to_string()), "{text}");
    assert!(
        text.contains("symbolic link") || text.contains("not a regular file"),
        "{text}"
    );
    assert!(!err.is_retryable(), "{err}");
}

#[tokio::test]
async fn a_symlink_at_the_record_path_is_refused_and_the_victim_is_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let victim = victim(dir.path());
    let store = FileStore::open(dir.path()).unwrap();
    let record = store.lease_path(&key());
    symlink(&victim, &record).unwrap();

    let err = store.read(&key()).await.unwrap_err();
    assert_refused_naming(&err, &record);
    let err = acquire(&store, "a").await.unwrap_err();
    assert_refused_naming(&err, &record);

    // Even a link to a valid record is refused: the store never reads through one.
    let real = tempfile::tempdir().unwrap();
    let other = FileStore::open(real.path()).unwrap();
    acquire(&other, "b").await.unwrap();
    let elsewhere = dir.path().join("elsewhere.lease");
    fs::copy(other.lease_path(&key()), &elsewhere).unwrap();
    fs::remove_file(&record).unwrap();
    symlink(&elsewhere, &record).unwrap();
    let err = store.read(&key()).await.unwrap_err();
    assert_refused_naming(&err, &record);
    let before = fs::read(&elsewhere).unwrap();
    let err = acquire(&store, "a").await.unwrap_err();
    assert_refused_naming(&err, &record);

    assert_eq!(fs::read(&victim).unwrap(), b"precious");
    assert_eq!(fs::read(&elsewhere).unwrap(), before);
    assert!(is_symlink(&record), "the link is left for the operator");
}

#[tokio::test]
async fn a_symlink_at_the_old_fixed_temporary_name_cannot_redirect_a_write() {
    let dir = tempfile::tempdir().unwrap();
    let victim = victim(dir.path());
    let store = FileStore::open(dir.path()).unwrap();
    for name in [
        ".job.lease.tmp",
        ".job.lease.high-water.tmp",
        ".job-object.fenced.tmp",
    ] {
        symlink(&victim, dir.path().join(name)).unwrap();
    }
    let token = acquire(&store, "a").await.unwrap();
    let fence = fence_of_a(token);
    let object = ObjectName::new("job-object").unwrap();
    store.fenced_write(&fence, &object, b"work").await.unwrap();

    assert_eq!(fs::read(&victim).unwrap(), b"precious");
    assert!(store.read(&key()).await.unwrap().is_some());
    assert_eq!(
        store.fenced_read(&object).await.unwrap().unwrap().value,
        b"work"
    );
}

#[tokio::test]
async fn a_symlinked_lock_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let victim = victim(dir.path());
    let victim_mode = mode(&victim);
    let store = FileStore::open(dir.path()).unwrap();
    let lock = dir.path().join("job.lease.lock");
    symlink(&victim, &lock).unwrap();
    let err = acquire(&store, "a").await.unwrap_err();
    assert_refused_naming(&err, &lock);
    assert!(!store.lease_path(&key()).exists(), "nothing was written");

    // A fenced object's lock too.
    let object_lock = dir.path().join("job-object.fenced.lock");
    symlink(&victim, &object_lock).unwrap();
    let fence = fence_of_a(FencingToken(1));
    let object = ObjectName::new("job-object").unwrap();
    let err = store
        .fenced_write(&fence, &object, b"work")
        .await
        .unwrap_err();
    assert_refused_naming(&err, &object_lock);

    assert_eq!(fs::read(&victim).unwrap(), b"precious");
    assert_eq!(mode(&victim), victim_mode);
}

#[tokio::test]
async fn a_folder_at_the_lock_path_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::open(dir.path()).unwrap();
    let lock = dir.path().join("job.lease.lock");
    fs::create_dir(&lock).unwrap();
    let err = acquire(&store, "a").await.unwrap_err();
    assert!(matches!(err, Error::InvalidConfig { .. }), "{err}");
    assert!(err.to_string().contains("is a folder"), "{err}");
    assert!(err.to_string().contains("job.lease.lock"), "{err}");
    assert!(!store.lease_path(&key()).exists(), "nothing was written");
}

#[tokio::test]
async fn a_symlinked_high_water_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let victim = victim(dir.path());
    let store = FileStore::open(dir.path()).unwrap();
    let mark = store.high_water_path(&key());
    symlink(&victim, &mark).unwrap();
    let err = acquire(&store, "a").await.unwrap_err();
    assert_refused_naming(&err, &mark);
    assert_eq!(fs::read(&victim).unwrap(), b"precious");
    assert!(!store.lease_path(&key()).exists(), "nothing was written");
}

/// Opens the other end of a FIFO when dropped, so that a thread stuck opening or reading it
/// (a store that does not refuse FIFOs) can finish and the test fails instead of hanging.
struct Unblock(PathBuf);

impl Drop for Unblock {
    fn drop(&mut self) {
        let _ = fs::OpenOptions::new().read(true).write(true).open(&self.0);
    }
}

/// A FIFO planted at the record or lock path is refused at once; reading it would block a
/// thread forever.
#[tokio::test]
async fn a_fifo_in_place_of_a_file_is_refused_without_blocking() {
    for name in ["job.lease", "job.lease.lock"] {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::open(dir.path()).unwrap();
        let fifo = dir.path().join(name);
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let _unblock = Unblock(fifo.clone());
        let result = tokio::time::timeout(Duration::from_secs(10), acquire(&store, "a"))
            .await
            .unwrap_or_else(|_| panic!("a FIFO at {name} blocked the store"));
        assert_refused_naming(&result.unwrap_err(), &fifo);
    }
}

#[tokio::test]
async fn files_are_0600_and_created_folders_0700_by_default() {
    let root = tempfile::tempdir().unwrap();
    fs::set_permissions(root.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let dir = root.path().join("a").join("b");
    let store = FileStore::create(&dir).unwrap();
    assert_eq!(
        mode(root.path()),
        0o755,
        "a folder that existed keeps its mode"
    );
    assert_eq!(mode(&root.path().join("a")), 0o700);
    assert_eq!(mode(&dir), 0o700);

    let token = acquire(&store, "a").await.unwrap();
    let fence = fence_of_a(token);
    let object = ObjectName::new("job-object").unwrap();
    store.fenced_write(&fence, &object, b"work").await.unwrap();
    let files = [
        "job.lease",
        "job.lease.lock",
        "job.lease.high-water",
        "job-object.fenced",
        "job-object.fenced.lock",
    ];
    for name in files {
        assert_eq!(mode(&dir.join(name)), 0o600, "{name}");
    }
    let listed: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        listed.len(),
        files.len(),
        "no temporary file left: {listed:?}"
    );
}

/// Group-writable modes are kept exactly (the usual umask 022 would strip the group bit).
#[tokio::test]
async fn modes_follow_the_settings() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("shared").join("leases");
    let store = FileStore::builder(&dir)
        .with_dir_mode(0o770)
        .with_file_mode(0o660)
        .create_if_missing(true)
        .build()
        .unwrap();
    assert_eq!(mode(&root.path().join("shared")), 0o770);
    assert_eq!(mode(&dir), 0o770);
    let mut a = client(&store, "a");
    assert!(matches!(
        a.try_acquire().await.unwrap(),
        Acquisition::Acquired(_)
    ));
    for name in ["job.lease", "job.lease.lock", "job.lease.high-water"] {
        assert_eq!(mode(&dir.join(name)), 0o660, "{name}");
    }
    assert!(a.release().await.unwrap());

    // An existing record takes the setting of the store that writes it next.
    let narrower = FileStore::builder(&dir)
        .with_file_mode(0o640)
        .build()
        .unwrap();
    acquire(&narrower, "b").await.unwrap();
    assert_eq!(mode(&dir.join("job.lease")), 0o640);
    assert_eq!(mode(&dir.join("job.lease.high-water")), 0o640);
}

#[test]
fn modes_that_lock_out_the_owner_or_set_special_bits_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (file, folder) in [
        (0o400, 0o700),
        (0o4600, 0o700),
        (0o10_0600, 0o700),
        (0o600, 0o600),
        (0o600, 0o1700),
    ] {
        let err = FileStore::builder(dir.path())
            .with_file_mode(file)
            .with_dir_mode(folder)
            .build()
            .unwrap_err();
        assert!(matches!(err, Error::InvalidConfig { .. }), "{err}");
        assert!(err.to_string().contains("mode"), "{err}");
    }
    FileStore::builder(dir.path())
        .with_file_mode(0o644)
        .with_dir_mode(0o755)
        .build()
        .unwrap();
}

#[tokio::test]
async fn the_next_term_mints_above_the_high_water_mark() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::open(dir.path()).unwrap();
    let mark = store.high_water_path(&key());

    // As after a crash between raising the mark and writing the record: no record, mark 41.
    fs::write(&mark, "leader-high-water v1 41\n").unwrap();
    assert_eq!(acquire(&store, "a").await.unwrap(), FencingToken(42));
    assert_eq!(
        fs::read_to_string(&mark).unwrap(),
        "leader-high-water v1 42\n"
    );

    // The record deleted: still above.
    fs::remove_file(store.lease_path(&key())).unwrap();
    assert_eq!(acquire(&store, "b").await.unwrap(), FencingToken(43));

    // Deleting the mark with the record is the documented, deliberate reset.
    fs::remove_file(store.lease_path(&key())).unwrap();
    fs::remove_file(&mark).unwrap();
    assert_eq!(acquire(&store, "c").await.unwrap(), FencingToken(1));
}

/// A record written before the mark existed (an upgrade) is covered from its next write on.
#[tokio::test]
async fn a_record_without_a_mark_gets_one_at_its_next_write() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::open(dir.path()).unwrap();
    let mut a = client(&store, "a");
    let Acquisition::Acquired(grant) = a.try_acquire().await.unwrap() else {
        panic!("a should have acquired")
    };
    let mark = store.high_water_path(&key());
    fs::remove_file(&mark).unwrap();
    a.renew().await.unwrap();
    assert_eq!(
        fs::read_to_string(&mark).unwrap(),
        format!("leader-high-water v1 {}\n", grant.token)
    );
    fs::remove_file(store.lease_path(&key())).unwrap();
    assert!(acquire(&store, "b").await.unwrap() > grant.token);
}

/// The file store hints a change of the record (a rename onto it, a delete) through the
/// operating system's notifications.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_file_changing_is_hinted() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::open(dir.path()).unwrap();
    let mut hints = store.changes(&key()).expect("inotify is available here");
    acquire(&store, "a").await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), hints.changed())
        .await
        .expect("the acquire's write was hinted");
    fs::remove_file(store.lease_path(&key())).unwrap();
    tokio::time::timeout(Duration::from_secs(20), hints.changed())
        .await
        .expect("the delete was hinted");
}

/// A follower on the file store takes over a release long before its next poll: the change
/// hint wakes it. Its poll period here is two minutes; the test allows 30 s, so without the
/// hint it would fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_the_follower_before_its_poll() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn LeaseBackend> = Arc::new(FileStore::open(dir.path()).unwrap());
    let elector = |who: &str| {
        leader_core::Elector::builder(store.clone(), key())
            .ttl(Duration::from_secs(600))
            .poll_every(Duration::from_secs(120))
            .holder_id(HolderId::new(who).unwrap())
            .build()
            .unwrap()
            .spawn()
    };
    let a = elector("a");
    drop(a.wait_for_term().await.unwrap());
    let b = elector("b");
    let mut seen = b.leadership();
    tokio::time::timeout(
        Duration::from_secs(20),
        seen.wait_for(|l| matches!(l, leader_core::Leadership::Follower { leader: Some(_) })),
    )
    .await
    .unwrap()
    .unwrap();
    a.shutdown().await;
    let term = tokio::time::timeout(Duration::from_secs(30), b.wait_for_term())
        .await
        .expect("b took over before its next poll")
        .unwrap();
    assert_eq!(term.token(), FencingToken(2));
}

/// Counts the reads of one candidate on the file store, passing its change hints on.
#[derive(Debug)]
struct CountingReads {
    inner: FileStore,
    reads: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl LeaseBackend for CountingReads {
    async fn read(&self, key: &LeaseKey) -> Result<Option<leader_core::backend::Stored>, Error> {
        self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.read(key).await
    }
    async fn write(
        &self,
        request: leader_core::backend::WriteRequest,
    ) -> Result<leader_core::backend::WriteOutcome, Error> {
        self.inner.write(request).await
    }
    fn changes(&self, key: &LeaseKey) -> Option<leader_core::backend::Changes> {
        self.inner.changes(key)
    }
}

/// Followers' reads of the record are not changes: two followers woken by hints read about
/// once per change and per poll, not each other's reads in a loop (which starved the leader's
/// renews in the chaos drills).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_reading_do_not_wake_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::open(dir.path()).unwrap();
    let candidate = |who: &str, backend: Arc<dyn LeaseBackend>| {
        leader_core::Elector::builder(backend, key())
            .ttl(Duration::from_secs(2))
            .holder_id(HolderId::new(who).unwrap())
            .build()
            .unwrap()
            .spawn()
    };
    let leader = candidate("a", Arc::new(store.clone()));
    drop(leader.wait_for_term().await.unwrap());
    let counted: Vec<Arc<CountingReads>> = (0..2)
        .map(|_| {
            Arc::new(CountingReads {
                inner: store.clone(),
                reads: Default::default(),
            })
        })
        .collect();
    let _followers: Vec<_> = counted
        .iter()
        .enumerate()
        .map(|(i, c)| candidate(&format!("f{i}"), c.clone()))
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    for c in &counted {
        // 3 s: about 8 polls (every 0.4 s) and 3 renews (every second) to read.
        let reads = c.reads.load(std::sync::atomic::Ordering::SeqCst);
        assert!(reads <= 30, "{reads} reads in 3 s");
    }
    assert!(leader.current().is_leader());
}
