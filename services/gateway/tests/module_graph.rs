//! The gateway's modules form no import cycle: a module never uses (through
//! `crate::`) a module that uses it back, directly or through others. A cycle
//! makes modules impossible to read, test or move one at a time (the state of
//! the API once depended on the auth middleware, which depended on that state).
//! Doc comments may link anywhere; only code counts.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Top-level module -> the top-level modules its code names via `crate::`.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let Some(module) = top_module(src, &file) else { continue };
        let targets = edges.entry(module.clone()).or_default();
        let text = std::fs::read_to_string(&file).expect("read a source file");
        for line in text.lines().map(str::trim_start).filter(|l| !l.starts_with("//")) {
            for (at, _) in line.match_indices("crate::") {
                let name: String =
                    line[at + 7..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                if !name.is_empty() && name != module {
                    targets.insert(name);
                }
            }
        }
    }
    edges
}

/// `src/auth/keys.rs` -> `auth`; the crate roots and binaries are not modules.
fn top_module(src: &Path, file: &Path) -> Option<String> {
    let rel: PathBuf = file.strip_prefix(src).ok()?.to_path_buf();
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    match first.as_str() {
        "lib.rs" | "main.rs" | "bin" => None,
        name => Some(name.trim_end_matches(".rs").to_string()),
    }
}

/// A cycle through `start`, if there is one (depth-first search).
fn cycle_from(edges: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    fn visit(
        edges: &BTreeMap<String, BTreeSet<String>>,
        start: &str,
        at: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for next in edges.get(at).into_iter().flatten() {
            if next == start {
                path.push(next.clone());
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if visit(edges, start, next, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![start.to_string()];
    visit(edges, start, start, &mut path, &mut BTreeSet::new()).then_some(path)
}

#[test]
fn no_module_imports_a_module_that_imports_it_back() {
    let edges = graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(edges.len() >= 6, "the gateway's modules were found: {edges:?}");
    let cycles: Vec<String> =
        edges.keys().filter_map(|m| cycle_from(&edges, m)).map(|c| c.join(" -> ")).collect();
    assert!(cycles.is_empty(), "import cycles between the gateway's modules:\n{}", cycles.join("\n"));
}

#[test]
fn the_check_finds_a_cycle_when_there_is_one() {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    edges.entry("api".into()).or_default().insert("auth".into());
    edges.entry("auth".into()).or_default().insert("ratelimit".into());
    edges.entry("ratelimit".into()).or_default().insert("config".into());
    assert_eq!(cycle_from(&edges, "api"), None);
    edges.entry("ratelimit".into()).or_default().insert("api".into());
    assert_eq!(cycle_from(&edges, "api").unwrap(), ["api", "auth", "ratelimit", "api"]);
}
