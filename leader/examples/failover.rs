//! Three processes on one host elect a leader through the file store; the leader is killed
//! with SIGKILL; another takes over with a higher fencing token.
//!
//! ```text
//! cargo run -p leader --example failover
//! ```
//!
//! The same binary plays the supervisor (no arguments) and the candidates (`candidate DIR
//! NAME`). Each candidate leads only while its term is valid and writes to a fenced object
//! in the same folder.
#![allow(clippy::print_stdout, clippy::print_stderr, clippy::disallowed_methods)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use leader::{Elector, FencedStore, FileStore, HolderId, LeaseKey, ObjectName};

const TTL: Duration = Duration::from_secs(2);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("candidate") if args.len() == 4 => candidate(&args[2], &args[3]),
        None => supervise(),
        _ => {
            eprintln!("usage: failover  |  failover candidate DIR NAME");
            ExitCode::from(64)
        }
    }
}

fn candidate(dir: &str, name: &str) -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{name}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result: Result<(), Box<dyn std::error::Error>> = runtime.block_on(async {
        let store = Arc::new(FileStore::open(dir)?);
        let elector = Elector::builder(store.clone(), LeaseKey::new("demo")?)
            .ttl(TTL)
            .holder_id(HolderId::new(name)?)
            .build()?;
        let handle = elector.spawn();
        let report = ObjectName::new("report")?;
        loop {
            let term = handle.wait_for_term().await?;
            println!("LEADER {name} {}", term.token());
            std::io::stdout().flush()?;
            while term.is_valid() {
                store
                    .fenced_write(term.fence(), &report, name.as_bytes())
                    .await?;
                tokio::select! {
                    _ = term.cancelled() => break,
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                }
            }
            println!("FOLLOWER {name}");
        }
    });
    if let Err(e) = result {
        eprintln!("{name}: {e}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

fn supervise() -> ExitCode {
    match run_demo() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("failover demo failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_demo() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let exe = std::env::current_exe()?;
    let (tx, rx) = mpsc::channel::<(String, String)>();
    let mut children: Vec<(String, Child)> = Vec::new();
    println!(
        "three candidates elect a leader through files in {} (ttl {TTL:?})",
        dir.path().display()
    );
    for name in ["alpha", "bravo", "charlie"] {
        let mut child = Command::new(&exe)
            .arg("candidate")
            .arg(dir.path())
            .arg(name)
            .stdout(Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let tx = tx.clone();
        let who = name.to_owned();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send((who.clone(), line)).is_err() {
                    break;
                }
            }
        });
        children.push((name.to_owned(), child));
    }
    let result = demo_steps(&rx, &mut children);
    for (_, child) in &mut children {
        let _ = child.kill();
        let _ = child.wait();
    }
    result
}

fn next_leader(
    rx: &mpsc::Receiver<(String, String)>,
    not: Option<&str>,
    until: Instant,
) -> Result<(String, u64), Box<dyn std::error::Error>> {
    loop {
        let left = until.saturating_duration_since(Instant::now());
        let (who, line) = rx.recv_timeout(left).map_err(|_| "no leader in time")?;
        if let Some(rest) = line.strip_prefix("LEADER ") {
            let mut parts = rest.split(' ');
            let (Some(name), Some(token)) = (parts.next(), parts.next()) else {
                continue;
            };
            if Some(name) != not {
                return Ok((who, token.parse()?));
            }
        }
    }
}

fn demo_steps(
    rx: &mpsc::Receiver<(String, String)>,
    children: &mut [(String, Child)],
) -> Result<(), Box<dyn std::error::Error>> {
    let give_up = Instant::now() + Duration::from_secs(30);
    let (first, token1) = next_leader(rx, None, give_up)?;
    println!("{first} leads with fencing token {token1}");
    std::thread::sleep(Duration::from_secs(1));
    let killed_at = Instant::now();
    if let Some((_, child)) = children.iter_mut().find(|(n, _)| *n == first) {
        child.kill()?; // SIGKILL: no release, the lease must expire
        child.wait()?;
    }
    println!("killed {first} with SIGKILL");
    let (second, token2) = next_leader(rx, Some(&first), give_up)?;
    let took = killed_at.elapsed();
    println!(
        "{second} took over with fencing token {token2} after {:.2} s (bound: ttl + retry_every = {:.2} s)",
        took.as_secs_f64(),
        (TTL + TTL / 5).as_secs_f64()
    );
    if token2 <= token1 {
        return Err(format!("token did not increase: {token1} -> {token2}").into());
    }
    println!("ok: one leader at a time, failover with a higher token");
    Ok(())
}
