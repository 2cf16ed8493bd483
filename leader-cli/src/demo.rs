//! `leader demo`: the shortest honest demonstration, on a temporary file store.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout};

use crate::{Exit, exit};

const TTL: &str = "2s";

fn fail(message: impl Into<String>) -> Exit {
    Exit::new(exit::UNAVAILABLE, message)
}

pub(crate) async fn run() -> Result<u8, Exit> {
    let dir = tempfile::tempdir().map_err(|e| fail(format!("temporary folder: {e}")))?;
    let store = format!("file://{}/demo", dir.path().display());
    let exe = std::env::current_exe().map_err(|e| fail(e.to_string()))?;
    println!("demo: three `leader run` processes share {store} (ttl {TTL})");
    let (tx, mut rx) = mpsc::unbounded_channel::<(usize, String)>();
    let mut procs: Vec<Child> = Vec::new();
    for i in 0..3 {
        let mut child = Command::new(&exe)
            .args(["run", "--store", &store, "--ttl", TTL, "--id"])
            .arg(format!("demo-{i}"))
            .args(["--", "sh", "-c"])
            .arg("echo \"child of $LEADER_HOLDER_ID running with fencing token $LEADER_FENCING_TOKEN\"; while :; do sleep 0.2; done")
            .env("LEADER_LOG", "warn")
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| fail(format!("cannot start `leader run`: {e}")))?;
        if let Some(out) = child.stdout.take() {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(out).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if tx.send((i, line)).is_err() {
                        break;
                    }
                }
            });
        }
        procs.push(child);
    }
    let result = steps(&mut rx, &mut procs).await;
    for p in &mut procs {
        if let Some(pid) = p.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX)),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
    }
    for p in &mut procs {
        let _ = timeout(Duration::from_secs(5), p.wait()).await;
    }
    result
}

async fn next_start(
    rx: &mut mpsc::UnboundedReceiver<(usize, String)>,
    until: Instant,
) -> Result<(usize, u64), Exit> {
    loop {
        let left = until.saturating_duration_since(Instant::now());
        let (i, line) = timeout(left, rx.recv())
            .await
            .map_err(|_| fail("demo: no leader in time"))?
            .ok_or_else(|| fail("demo: the candidates exited"))?;
        println!("  [{i}] {line}");
        if let Some(token) = line.rsplit(' ').next().and_then(|t| t.parse().ok()) {
            return Ok((i, token));
        }
    }
}

async fn steps(
    rx: &mut mpsc::UnboundedReceiver<(usize, String)>,
    procs: &mut [Child],
) -> Result<u8, Exit> {
    let give_up = Instant::now() + Duration::from_secs(25);
    let (first, token1) = next_start(rx, give_up).await?;
    println!("demo: demo-{first} leads with token {token1}; the others wait");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let killed = Instant::now();
    procs[first]
        .start_kill()
        .map_err(|e| fail(format!("cannot kill: {e}")))?;
    println!(
        "demo: SIGKILL to demo-{first}'s `leader` (no release: the lease must expire; its supervisor stops the orphaned child)"
    );
    let (second, token2) = next_start(rx, give_up).await?;
    println!(
        "demo: demo-{second} took over with token {token2} after {:.2} s (bound: ttl + poll period = 2.40 s)",
        killed.elapsed().as_secs_f64()
    );
    if token2 <= token1 || second == first {
        return Err(fail("demo: the new leader's token is not higher"));
    }
    println!("demo: done; stopping everything");
    Ok(0)
}
