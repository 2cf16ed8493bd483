//! Parts of the repository's documents that the code generates: a block between two marker
//! lines, `<!-- BEGIN NAME ... -->` and `<!-- END NAME -->`, that a test renders from the code
//! and compares. `UPDATE_DOCS=1` makes the test write the block instead.

use std::path::{Path, PathBuf};

/// Set to `1` to rewrite generated blocks instead of comparing them.
pub const UPDATE_VAR: &str = "UPDATE_DOCS";

/// The repository's root folder.
pub fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Checks that the block `name` of `file` (relative to the repository) holds exactly `body`,
/// or writes it there with `UPDATE_DOCS=1`.
///
/// # Errors
/// What differs, or why the file cannot be read or written, as a message that says how to
/// bring the file up to date.
pub fn check_block(file: &str, name: &str, body: &str) -> Result<(), String> {
    let path = repository().join(file);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{file}: {e}"))?;
    let begin = format!("<!-- BEGIN {name}");
    let end = format!("<!-- END {name} -->");
    let start = text
        .find(&begin)
        .and_then(|at| text[at..].find('\n').map(|n| at + n + 1))
        .ok_or_else(|| format!("{file}: no line starting with {begin:?}"))?;
    let stop = text[start..]
        .find(&end)
        .map(|n| start + n)
        .ok_or_else(|| format!("{file}: no {end:?} after {begin:?}"))?;
    let body = if body.ends_with('\n') {
        body.to_owned()
    } else {
        format!("{body}\n")
    };
    if text[start..stop] == body {
        return Ok(());
    }
    if std::env::var(UPDATE_VAR).is_ok_and(|v| v == "1") {
        let updated = format!("{}{body}{}", &text[..start], &text[stop..]);
        return std::fs::write(&path, updated).map_err(|e| format!("{file}: {e}"));
    }
    let first = text[start..stop]
        .lines()
        .zip(body.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| text[start..stop].lines().count().min(body.lines().count()));
    Err(format!(
        "{file}: the block {name:?} is not what the code gives (first difference at its line \
         {}):\n--- in the file\n{}\n--- from the code\n{body}\nRun the test with {UPDATE_VAR}=1 \
         to rewrite it, and read the change before committing it.",
        first + 1,
        &text[start..stop],
    ))
}
