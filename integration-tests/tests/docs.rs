//! Checks of the repository as a whole: the documents say what the code does, they point at
//! nothing outside the repository, and every crate's modules import each other without a
//! cycle and in functions of a readable length.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use integration_tests::docs::{check_block, repository};
use leader::Timing;
use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// A duration as the documents write it: `400 ms`, `1.5 s`, `15 s`.
fn human(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else {
        let s = format!("{:.3}", d.as_secs_f64());
        format!("{} s", s.trim_end_matches('0'))
    }
}

#[test]
fn the_timing_table_of_the_protocol_is_what_the_code_computes() {
    let mut table = String::from(
        "| ttl | request_timeout | margin | renew_every | poll_every | retry_every | a term lasts \
         after its last renew was sent | a store outage a term survives |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for secs in [2, 5, 15, 30, 60] {
        let t = Timing::from_ttl(Duration::from_secs(secs));
        t.validate().unwrap();
        let lasts = t.term_validity();
        let outage = lasts - t.renew_every;
        let cells = [
            t.ttl,
            t.request_timeout,
            t.margin,
            t.renew_every,
            t.poll_every,
            t.retry_every,
            lasts,
            outage,
        ];
        let row: Vec<String> = cells.into_iter().map(human).collect();
        table.push_str(&format!("| {} |\n", row.join(" | ")));
    }
    check_block("docs/protocol.md", "timing table", &table).unwrap();
}

/// The fenced code blocks of a Markdown text whose info string starts with `lang`.
fn code_blocks(markdown: &str, lang: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match &mut current {
            None if line.starts_with("```") => {
                let info = line.trim_start_matches('`');
                if info.split(',').next() == Some(lang) {
                    current = Some(String::new());
                } else {
                    current = Some("\u{0}skip".to_owned());
                }
            }
            Some(_) if line.starts_with("```") => {
                let block = current.take().unwrap();
                if !block.starts_with('\u{0}') {
                    blocks.push(block);
                }
            }
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
            None => {}
        }
    }
    blocks
}

#[test]
fn the_readme_example_uses_the_leader_crate_alone() {
    let readme = std::fs::read_to_string(repository().join("README.md")).unwrap();
    let blocks = code_blocks(&readme, "rust");
    assert!(!blocks.is_empty(), "the README has a Rust example");
    for block in blocks {
        let file = syn::parse_file(&block).expect("the README's example is Rust");
        let mut roots = BTreeSet::new();
        for item in &file.items {
            if let syn::Item::Use(u) = item {
                roots.insert(use_root(&u.tree));
            }
        }
        for root in &roots {
            assert!(
                root == "leader" || root == "std",
                "the README's example imports {root}; it must need the `leader` crate alone"
            );
        }
        // Paths written out in full, outside `use` items, count too.
        for crate_name in [
            "leader_core",
            "tokio",
            "tokio_util",
            "leader_azure",
            "leader_gcs",
        ] {
            assert!(
                !block.contains(&format!("{crate_name}::")),
                "the README's example names {crate_name}"
            );
        }
        assert!(
            !block.lines().any(|l| l.trim_start().starts_with("# ")),
            "the README's example has no hidden lines: a reader sees all of it"
        );
    }
}

fn use_root(tree: &syn::UseTree) -> String {
    match tree {
        syn::UseTree::Path(p) => p.ident.to_string(),
        syn::UseTree::Name(n) => n.ident.to_string(),
        syn::UseTree::Rename(r) => r.ident.to_string(),
        syn::UseTree::Glob(_) => "*".to_owned(),
        syn::UseTree::Group(g) => g.items.iter().map(use_root).collect::<Vec<_>>().join(","),
    }
}

/// Every file of the repository under version control, with the given extensions.
fn repository_files(extensions: &[&str]) -> Vec<PathBuf> {
    let output = std::process::Command::new("git")
        .args(["ls-files", "--cached", "--others", "--exclude-standard"])
        .current_dir(repository())
        .output()
        .expect("git ls-files");
    assert!(output.status.success(), "git ls-files failed");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| repository().join(l))
        .filter(|p| p.is_file())
        .filter(|p| {
            p.extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| extensions.contains(&e))
        })
        .collect()
}

#[test]
fn no_document_or_source_points_outside_the_repository() {
    // Spelt in pieces, so that this file does not name what it looks for.
    let needles = [format!("{}/", "shared"), format!("{}.md", "DESIGN")];
    let mut found = Vec::new();
    for path in repository_files(&["md", "rs", "toml", "txt", "py"]) {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        for (n, line) in text.lines().enumerate() {
            if needles.iter().any(|needle| line.contains(needle.as_str())) {
                found.push(format!("{}:{}: {line}", path.display(), n + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "files name a place outside the repository (the protocol is docs/protocol.md):\n{}",
        found.join("\n")
    );
}

#[test]
fn user_documents_speak_of_the_product_not_of_issue_numbers() {
    let mut found = Vec::new();
    for path in repository_files(&["md", "txt"]) {
        let rel = path.strip_prefix(repository()).unwrap().to_path_buf();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        // The results' files are judged by their headings (comment lines and titles).
        let in_results = rel.starts_with("results");
        for (n, line) in text.lines().enumerate() {
            if in_results && !line.starts_with('#') && n > 0 {
                continue;
            }
            let lower = line.to_lowercase();
            let numbered = lower.match_indices("issue").any(|(at, _)| {
                let rest = lower[at + "issue".len()..].trim_start_matches(['s', ' ', '#']);
                rest.starts_with(|c: char| c.is_ascii_digit())
            });
            if numbered {
                found.push(format!("{}:{}: {line}", rel.display(), n + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "issue numbers in user documents:\n{}",
        found.join("\n")
    );
}

/// The workspace's members, from the root `Cargo.toml`.
fn members() -> Vec<String> {
    let manifest = std::fs::read_to_string(repository().join("Cargo.toml")).unwrap();
    let start = manifest.find("members = [").unwrap() + "members = [".len();
    let end = start + manifest[start..].find(']').unwrap();
    manifest[start..end]
        .split(',')
        .map(|m| m.trim().trim_matches('"').to_owned())
        .filter(|m| !m.is_empty())
        .collect()
}

#[test]
fn every_crate_names_every_store_of_the_suite() {
    /// The crates of the suite that are not stores.
    const NOT_STORES: [&str; 3] = ["leader-core", "leader-cli", "leader-notice"];
    let members = members();
    let stores: Vec<&String> = members
        .iter()
        .filter(|m| m.starts_with("leader-") && !NOT_STORES.contains(&m.as_str()))
        .collect();
    assert!(stores.len() >= 5, "the store crates: {stores:?}");
    let mut missing = Vec::new();
    // `leader-notice` is about machines, not stores: it names none.
    for member in members
        .iter()
        .filter(|m| m.starts_with("leader") && *m != "leader-notice")
    {
        let mut docs = vec![format!("{member}/README.md")];
        if Path::new(&repository().join(member).join("src/lib.rs")).is_file() {
            docs.push(format!("{member}/src/lib.rs"));
        }
        for doc in docs {
            let text = std::fs::read_to_string(repository().join(&doc)).unwrap();
            // A line break may fall inside a name's backquotes or between the words.
            let text = text
                .replace("//!", " ")
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            for store in &stores {
                if !text.contains(store.as_str()) {
                    missing.push(format!("{doc} does not name {store}"));
                }
            }
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

/// One module of a crate: its path below the crate root, and what it refers to.
#[derive(Debug, Default)]
struct Module {
    /// Paths that start with `crate`, `super` or `self`, resolved to absolute segments.
    refs: Vec<Vec<String>>,
}

/// A crate's modules by path (`[]` is the root), read from its root file.
#[derive(Debug, Default)]
struct CrateModules {
    modules: BTreeMap<Vec<String>, Module>,
    /// Functions outside test code: (lines, file, line, name).
    functions: Vec<(usize, PathBuf, usize, String)>,
}

fn is_test_cfg(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        (a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>().is_ok_and(|m| match m {
                syn::Meta::Path(p) => p.is_ident("test") || p.is_ident("doctest"),
                syn::Meta::List(l) => {
                    let t = l.tokens.to_string();
                    l.path.is_ident("all") && (t.contains("doctest") || t.contains("test"))
                }
                _ => false,
            }))
            || a.path().is_ident("test")
            || a.path().segments.last().is_some_and(|s| s.ident == "test")
    })
}

/// Resolves a path written in module `here` to absolute segments, if it starts with `crate`,
/// `super` or `self`.
fn resolve(here: &[String], segments: &[String]) -> Option<Vec<String>> {
    let mut it = segments.iter().peekable();
    let mut base: Vec<String> = match it.peek().map(|s| s.as_str()) {
        Some("crate") => {
            it.next();
            Vec::new()
        }
        Some("super") | Some("self") => here.to_vec(),
        _ => return None,
    };
    while let Some(s) = it.peek() {
        match s.as_str() {
            "super" => {
                base.pop();
                it.next();
            }
            "self" => {
                it.next();
            }
            _ => break,
        }
    }
    base.extend(it.cloned());
    Some(base)
}

/// The `crate::a::b`, `super::a` and `self::a` sequences in a macro's tokens.
fn macro_paths(tokens: TokenStream, out: &mut Vec<Vec<String>>) {
    let trees: Vec<TokenTree> = tokens.into_iter().collect();
    let mut i = 0;
    while i < trees.len() {
        match &trees[i] {
            TokenTree::Group(g) => macro_paths(g.stream(), out),
            TokenTree::Ident(id)
                if ["crate", "super", "self"].contains(&id.to_string().as_str()) =>
            {
                let mut path = vec![id.to_string()];
                let mut j = i + 1;
                while let (
                    Some(TokenTree::Punct(a)),
                    Some(TokenTree::Punct(b)),
                    Some(TokenTree::Ident(next)),
                ) = (trees.get(j), trees.get(j + 1), trees.get(j + 2))
                {
                    if a.as_char() != ':' || b.as_char() != ':' {
                        break;
                    }
                    path.push(next.to_string());
                    j += 3;
                }
                if path.len() > 1 {
                    out.push(path);
                }
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
}

/// Collects the references and functions of one module's items.
struct Collector<'a> {
    here: Vec<String>,
    refs: Vec<Vec<String>>,
    file: &'a Path,
    functions: Vec<(usize, PathBuf, usize, String)>,
    /// Inline child modules met, to collect separately.
    inline: Vec<(String, Vec<syn::Item>)>,
    /// `mod name;` items met.
    declared: Vec<(String, Vec<syn::Attribute>)>,
}

impl Collector<'_> {
    fn add_use(&mut self, prefix: &[String], tree: &syn::UseTree) {
        let mut path = prefix.to_vec();
        match tree {
            syn::UseTree::Path(p) => {
                path.push(p.ident.to_string());
                self.add_use(&path, &p.tree);
            }
            syn::UseTree::Name(n) => {
                path.push(n.ident.to_string());
                self.refs.push(path);
            }
            syn::UseTree::Rename(r) => {
                path.push(r.ident.to_string());
                self.refs.push(path);
            }
            syn::UseTree::Glob(_) => self.refs.push(path),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.add_use(&path, t);
                }
            }
        }
    }

    fn function(&mut self, name: &syn::Ident, attrs: &[syn::Attribute], body: &syn::Block) {
        if is_test_cfg(attrs) {
            return;
        }
        let start = name.span().start().line;
        let end = body.brace_token.span.close().end().line;
        self.functions.push((
            end + 1 - start,
            self.file.to_path_buf(),
            start,
            name.to_string(),
        ));
    }
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if is_test_cfg(&m.attrs) {
            return;
        }
        match &m.content {
            Some((_, items)) => self.inline.push((m.ident.to_string(), items.clone())),
            None => self.declared.push((m.ident.to_string(), m.attrs.clone())),
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.add_use(&[], &u.tree);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        self.refs
            .push(p.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        macro_paths(m.tokens.clone(), &mut self.refs);
        syn::visit::visit_macro(self, m);
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.function(&f.sig.ident, &f.attrs, &f.block);
        syn::visit::visit_item_fn(self, f);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.function(&f.sig.ident, &f.attrs, &f.block);
        syn::visit::visit_impl_item_fn(self, f);
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(body) = &f.default {
            self.function(&f.sig.ident, &f.attrs, body);
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
}

/// Reads module `path` (its items are in `items`, read from `file`, whose child modules live
/// in folder `children`) and, recursively, its children.
fn read_module(
    krate: &mut CrateModules,
    path: Vec<String>,
    items: &[syn::Item],
    file: &Path,
    children: &Path,
) {
    let mut c = Collector {
        here: path.clone(),
        refs: Vec::new(),
        file,
        functions: Vec::new(),
        inline: Vec::new(),
        declared: Vec::new(),
    };
    for item in items {
        c.visit_item(item);
    }
    let here = c.here.clone();
    let refs = c.refs.iter().filter_map(|r| resolve(&here, r)).collect();
    krate.functions.append(&mut c.functions);
    krate.modules.insert(path.clone(), Module { refs });
    for (name, items) in c.inline {
        let mut child = path.clone();
        child.push(name.clone());
        read_module(krate, child, &items, file, &children.join(&name));
    }
    for (name, _) in c.declared {
        let mut child = path.clone();
        child.push(name.clone());
        let flat = children.join(format!("{name}.rs"));
        let nested = children.join(&name).join("mod.rs");
        let (child_file, grandchildren) = if flat.is_file() {
            (flat, children.join(&name))
        } else if nested.is_file() {
            (nested, children.join(&name))
        } else {
            panic!("module {name} of {} has no file", file.display());
        };
        let text = std::fs::read_to_string(&child_file).unwrap();
        let parsed =
            syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", child_file.display()));
        read_module(krate, child, &parsed.items, &child_file, &grandchildren);
    }
}

fn read_crate(root: &Path) -> CrateModules {
    let text = std::fs::read_to_string(root).unwrap();
    let parsed = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", root.display()));
    let mut krate = CrateModules::default();
    let children = root.parent().unwrap().to_path_buf();
    read_module(&mut krate, Vec::new(), &parsed.items, root, &children);
    krate
}

/// Every crate root of the workspace: libraries, binaries, and multi-file binaries.
fn crate_roots() -> Vec<PathBuf> {
    let mut roots = Vec::new();
    for member in members() {
        let src = repository().join(&member).join("src");
        for root in ["lib.rs", "main.rs"] {
            if src.join(root).is_file() {
                roots.push(src.join(root));
            }
        }
        if let Ok(bins) = std::fs::read_dir(src.join("bin")) {
            for bin in bins.flatten() {
                let p = bin.path();
                if p.is_dir() && p.join("main.rs").is_file() {
                    roots.push(p.join("main.rs"));
                } else if p.extension().is_some_and(|e| e == "rs") {
                    roots.push(p);
                }
            }
        }
    }
    roots.sort();
    roots
}

/// The edges between sibling modules: a reference from module `a` to module `b` (the deepest
/// module its path reaches) counts as an edge between the two children of their closest common
/// ancestor that contain them. A module's use of its own ancestors or descendants is not an
/// edge (a parent re-exports its children; a child uses what its parent defines).
fn sibling_edges(krate: &CrateModules) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (from, module) in &krate.modules {
        for r in &module.refs {
            let mut to: Vec<String> = Vec::new();
            for s in r {
                let mut next = to.clone();
                next.push(s.clone());
                if krate.modules.contains_key(&next) {
                    to = next;
                } else {
                    break;
                }
            }
            let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if common == from.len() || common == to.len() {
                continue;
            }
            edges
                .entry(from[..=common].to_vec())
                .or_default()
                .insert(to[..=common].to_vec());
        }
    }
    edges
}

/// A cycle among `edges`, if there is one.
fn find_cycle(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Option<Vec<Vec<String>>> {
    fn visit(
        node: &Vec<String>,
        edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        state: &mut BTreeMap<Vec<String>, bool>,
        stack: &mut Vec<Vec<String>>,
    ) -> Option<Vec<Vec<String>>> {
        state.insert(node.clone(), false);
        stack.push(node.clone());
        for next in edges.get(node).into_iter().flatten() {
            match state.get(next) {
                Some(false) => {
                    let at = stack.iter().position(|n| n == next).unwrap();
                    let mut cycle = stack[at..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                Some(true) => {}
                None => {
                    if let Some(c) = visit(next, edges, state, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        state.insert(node.clone(), true);
        None
    }
    let mut state = BTreeMap::new();
    for node in edges.keys() {
        if !state.contains_key(node)
            && let Some(c) = visit(node, edges, &mut state, &mut Vec::new())
        {
            return Some(c);
        }
    }
    None
}

#[test]
fn the_modules_of_every_crate_import_each_other_without_a_cycle() {
    let mut cycles = Vec::new();
    let mut modules = 0;
    for root in crate_roots() {
        let krate = read_crate(&root);
        modules += krate.modules.len();
        if let Some(cycle) = find_cycle(&sibling_edges(&krate)) {
            let names: Vec<String> = cycle.iter().map(|m| m.join("::")).collect();
            cycles.push(format!("{}: {}", root.display(), names.join(" -> ")));
        }
    }
    assert!(
        modules > 50,
        "read {modules} modules: the walk found the crates"
    );
    assert!(
        cycles.is_empty(),
        "modules that import each other in a circle:\n{}",
        cycles.join("\n")
    );
}

#[test]
fn the_cycle_check_finds_a_cycle() {
    // The check itself, on a made-up crate: a -> b -> a through `super`, and c::d -> a.
    let mut krate = CrateModules::default();
    let m = |refs: &[&[&str]]| Module {
        refs: refs
            .iter()
            .map(|r| r.iter().map(|s| (*s).to_owned()).collect())
            .collect(),
    };
    let p = |s: &[&str]| s.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    krate.modules.insert(p(&[]), m(&[&["a", "X"]]));
    krate
        .modules
        .insert(p(&["a"]), m(&[&["b", "Y"], &["c", "d", "Z"]]));
    krate.modules.insert(p(&["b"]), m(&[]));
    krate.modules.insert(p(&["c"]), m(&[&["c", "d"]]));
    krate.modules.insert(p(&["c", "d"]), m(&[&["a"]]));
    assert_eq!(
        find_cycle(&sibling_edges(&krate)).map(|c| c.len()),
        Some(3),
        "a -> c -> a"
    );
    krate.modules.insert(p(&["c", "d"]), m(&[&["b"], &["c"]]));
    assert_eq!(find_cycle(&sibling_edges(&krate)), None);
    krate.modules.insert(p(&["b"]), m(&[&["a", "X"]]));
    assert!(find_cycle(&sibling_edges(&krate)).is_some(), "a -> b -> a");
    // Paths resolve from where they are written.
    assert_eq!(
        resolve(&p(&["c", "d"]), &p(&["super", "super", "a", "X"])),
        Some(p(&["a", "X"]))
    );
    assert_eq!(resolve(&p(&["c"]), &p(&["std", "fmt"])), None);
}

/// The longest a function of a published crate may be, in lines from its name to its
/// closing brace: past that it is a module waiting to be named.
const LONGEST_FUNCTION: usize = 100;

#[test]
fn no_function_of_a_published_crate_is_past_a_hundred_lines() {
    let mut all = Vec::new();
    for root in crate_roots() {
        if root.starts_with(repository().join("integration-tests")) {
            continue; // the test harness, not shipped
        }
        all.extend(read_crate(&root).functions);
    }
    all.sort_by_key(|f| std::cmp::Reverse(f.0));
    assert!(all.len() > 500, "read {} functions", all.len());
    let long: Vec<String> = all
        .iter()
        .filter(|f| f.0 > LONGEST_FUNCTION)
        .map(|(lines, file, line, name)| {
            let file = file.strip_prefix(repository()).unwrap_or(file);
            format!("{}:{line}: {name}, {lines} lines", file.display())
        })
        .collect();
    eprintln!(
        "the longest function: {}:{}: {}, {} lines",
        all[0]
            .1
            .strip_prefix(repository())
            .unwrap_or(&all[0].1)
            .display(),
        all[0].2,
        all[0].3,
        all[0].0
    );
    assert!(
        long.is_empty(),
        "functions past {LONGEST_FUNCTION} lines:\n{}",
        long.join("\n")
    );
}
