//! No crate of the workspace has an import cycle between its modules: a
//! top-level module never uses (through `crate::`) a module that uses it back,
//! directly or through others. A cycle makes modules impossible to read, test
//! or move one at a time (the gateway's API state once depended on the auth
//! middleware, which depended on that state; the saga engine, its operator
//! actions and its steps once imported each other).
//!
//! Every crate is checked: the libraries, the services, the tools and the
//! service template. Doc comments may link anywhere; only code counts. A name
//! the crate root re-exports (`use crate::SagaSettings`) counts as the module
//! it comes from.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_path_buf()
}

/// Every `src/` of the workspace's crates (and the template's).
fn crate_sources(root: &Path) -> Vec<PathBuf> {
    let mut sources = Vec::new();
    for group in ["libs", "services", "tools"] {
        for entry in std::fs::read_dir(root.join(group)).expect("read a crate group") {
            let src = entry.expect("dir entry").path().join("src");
            if src.join("lib.rs").is_file() || src.join("main.rs").is_file() {
                sources.push(src);
            }
        }
    }
    sources.push(root.join("tools/src"));
    sources.push(root.join("deploy/template/service/src"));
    sources.sort();
    sources
}

fn rust_files(src: &Path) -> Vec<PathBuf> {
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
    files
}

/// A file's code without its comment lines.
fn code(file: &Path) -> String {
    let text = std::fs::read_to_string(file).expect("read a source file");
    text.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}

fn ident(text: &str) -> String {
    text.trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
}

/// The first segment of each path after `crate::`, braces expanded:
/// `crate::{a::B, c}` names `a` and `c`.
fn crate_paths(code: &str) -> Vec<String> {
    let mut names = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + 7..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let end = group
                .char_indices()
                .find(|&(_, c)| {
                    depth += match c {
                        '{' => 1,
                        '}' => -1,
                        _ => 0,
                    };
                    depth == 0
                })
                .map_or(group.len(), |(i, _)| i);
            let mut depth = 0;
            let mut start = 0;
            let inner = &group[..end];
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        names.push(ident(&inner[start..i]));
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            names.push(ident(&inner[start..]));
        } else {
            names.push(ident(rest));
        }
    }
    names.retain(|n| !n.is_empty() && n != "self");
    names
}

/// `src/engine/commit.rs` -> `engine`; the crate roots and binaries are not modules.
fn top_module(src: &Path, file: &Path) -> Option<String> {
    let rel: PathBuf = file.strip_prefix(src).ok()?.to_path_buf();
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    match first.as_str() {
        "lib.rs" | "main.rs" | "bin" => None,
        name => Some(name.trim_end_matches(".rs").to_string()),
    }
}

/// The names the crate root re-exports from a module: `pub use engine::{Engine, Launch}`.
fn root_reexports(src: &Path, modules: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    let Ok(root) = std::fs::read_to_string(src.join("lib.rs")) else { return names };
    let root: String =
        root.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
    for (at, _) in root.match_indices("pub use ") {
        let rest = &root[at + 8..];
        let statement = &rest[..rest.find(';').unwrap_or(rest.len())];
        let module = ident(statement);
        if !modules.contains(&module) {
            continue;
        }
        let items = statement.find('{').map_or_else(
            || statement.rsplit("::").next().unwrap_or_default().to_string(),
            |open| statement[open + 1..].trim_end_matches('}').to_string(),
        );
        for item in items.split(',') {
            let name = item.rsplit("::").next().unwrap_or_default();
            let name = name.rsplit(" as ").next().unwrap_or_default();
            let name = ident(name);
            if !name.is_empty() {
                names.insert(name, module.clone());
            }
        }
    }
    names
}

/// Top-level module -> the top-level modules its code names via `crate::`.
fn graph(src: &Path) -> Graph {
    let files = rust_files(src);
    let modules: BTreeSet<String> = files.iter().filter_map(|f| top_module(src, f)).collect();
    let reexports = root_reexports(src, &modules);
    let mut edges = Graph::new();
    for file in &files {
        let Some(module) = top_module(src, file) else { continue };
        let targets = edges.entry(module.clone()).or_default();
        for name in crate_paths(&code(file)) {
            let target = if modules.contains(&name) { Some(name) } else { reexports.get(&name).cloned() };
            if let Some(target) = target.filter(|t| *t != module) {
                targets.insert(target);
            }
        }
    }
    edges
}

/// A cycle through `start`, if there is one (depth-first search).
fn cycle_from(edges: &Graph, start: &str) -> Option<Vec<String>> {
    fn visit(
        edges: &Graph,
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
fn no_crate_has_a_module_that_imports_a_module_that_imports_it_back() {
    let root = workspace_root();
    let sources = crate_sources(&root);
    assert!(sources.len() >= 15, "the crates were found: {sources:?}");
    let mut cycles = Vec::new();
    for src in &sources {
        let edges = graph(src);
        let found: BTreeSet<String> =
            edges.keys().filter_map(|m| cycle_from(&edges, m)).map(|c| c.join(" -> ")).collect();
        for cycle in found {
            cycles.push(format!("{}: {cycle}", src.strip_prefix(&root).unwrap_or(src).display()));
        }
    }
    assert!(cycles.is_empty(), "import cycles between modules:\n{}", cycles.join("\n"));
}

#[test]
fn the_saga_engine_and_the_gateway_are_read_as_graphs() {
    // The check sees the edges that matter, re-exports and braces included.
    let root = workspace_root();
    let saga = graph(&root.join("libs/saga/src"));
    for (from, to) in
        [("admin", "engine"), ("admin", "operator"), ("engine", "step"), ("testing", "settings")]
    {
        assert!(saga.get(from).is_some_and(|t| t.contains(to)), "saga: {from} -> {to} in {saga:?}");
    }
    assert!(
        saga.get("operator").is_some_and(BTreeSet::is_empty),
        "the operator records import nothing: {saga:?}"
    );
    let gateway = graph(&root.join("services/gateway/src"));
    assert!(gateway.len() >= 6, "the gateway's modules were found: {gateway:?}");
}

#[test]
fn the_check_finds_a_cycle_when_there_is_one() {
    let mut edges = Graph::new();
    edges.entry("api".into()).or_default().insert("auth".into());
    edges.entry("auth".into()).or_default().insert("ratelimit".into());
    edges.entry("ratelimit".into()).or_default().insert("config".into());
    assert_eq!(cycle_from(&edges, "api"), None);
    edges.entry("ratelimit".into()).or_default().insert("api".into());
    assert_eq!(cycle_from(&edges, "api").unwrap(), ["api", "auth", "ratelimit", "api"]);
    // Braced imports and re-exports are edges too.
    assert_eq!(
        crate_paths("use crate::{engine::{A, B}, SagaSettings};\nlet x = crate::step::f();"),
        ["engine", "SagaSettings", "step"]
    );
}
