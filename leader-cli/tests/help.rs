//! `docs/cli.md` is what `leader --help` and each subcommand's `--help` print, and the top
//! level stays a page.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::process::Command;

use integration_tests::docs::check_block;

const LEADER: &str = env!("CARGO_BIN_EXE_leader");

/// The help as a user sees it in a pipe: no environment variable changes the text (the
/// `[env: ...]` notes would show their values; `COLUMNS` the width).
fn help(args: &[&str]) -> String {
    let out = Command::new(LEADER)
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .output()
        .unwrap();
    assert!(out.status.success(), "leader {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_reference_is_what_the_help_says() {
    let mut errors = Vec::new();
    for (name, args) in [
        ("leader --help", &["--help"][..]),
        ("leader run --help", &["run", "--help"]),
        ("leader status --help", &["status", "--help"]),
        ("leader demo --help", &["demo", "--help"]),
    ] {
        let body = format!("```text\n$ {name}\n{}```\n", help(args));
        if let Err(e) = check_block("docs/cli.md", name, &body) {
            errors.push(e);
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n\n"));
}

#[test]
fn the_top_level_help_is_a_page_that_points_to_the_rest() {
    let top = help(&["--help"]);
    let lines = top.lines().count();
    assert!(lines <= 40, "`leader --help` is {lines} lines:\n{top}");
    for word in ["run", "status", "demo", "leader run --help", "docs/cli.md"] {
        assert!(top.contains(word), "`leader --help` names {word:?}:\n{top}");
    }
    // The details live under the subcommand they belong to.
    let run = help(&["run", "--help"]);
    for section in [
        "Signals:",
        "Environment of the command:",
        "Exit codes:",
        "Credentials",
    ] {
        assert!(
            !top.contains(section),
            "{section} is not in the top-level help"
        );
        assert!(run.contains(section), "`leader run --help` has {section}");
    }
    assert!(help(&["status", "--help"]).contains("Exit codes:"));
}
