//! No crate of the workspace has an import cycle between its modules, at any
//! depth: no module uses a module that uses it back, directly or through
//! others. A cycle makes modules impossible to read, test or move one at a
//! time: an API state that depends on the middleware that depends on the
//! state can only be understood, and changed, as one.
//!
//! Every crate is checked: the libraries, the services, the tools and the
//! service template. Paths through `crate::`, `super::` and `self::`, and a
//! `use` of a child module, are followed; a name a module imports and another
//! names through it (`super::Consumer`, `crate::SagaSettings`) counts as the
//! module it comes from. Siblings are compared with everything below them:
//! `consumer::dlq` using `consumer::process` while `consumer::process` uses
//! `consumer::dlq` is a cycle, and so is `relay` using `consumer::inbox` while
//! `consumer::worker` uses `relay`. A module's own file (a `mod.rs`) counts
//! as one of its children; its `pub use` re-exports are no edges of its own.
//! Doc comments may link anywhere; only code counts,
//! and test modules (`#[cfg(test)] mod ... { }`) and doc-only imports
//! (`#[cfg(doc)]`) do not.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

/// A module's path below its crate root (`["consumer", "dlq"]`); the root is empty.
type Module = Vec<String>;

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
    files.sort();
    files
}

/// A file's code: without comment lines, test modules and `#[cfg(doc)]` imports.
fn code(text: &str) -> String {
    let mut out = Vec::new();
    let mut lines = text.lines().filter(|l| !l.trim_start().starts_with("//")).peekable();
    while let Some(line) = lines.next() {
        let attribute = line.trim();
        if attribute == "#[cfg(test)]" && lines.peek().is_some_and(|l| l.trim_start().starts_with("mod ")) {
            // rustfmt closes a file's inline module with a `}` in the first column.
            if !lines.next().is_some_and(|l| l.trim_end().ends_with(';')) {
                lines.by_ref().find(|l| l.starts_with('}'));
            }
            continue;
        }
        if attribute == "#[cfg(doc)]" {
            lines.next();
            continue;
        }
        out.push(line);
    }
    out.join("\n")
}

fn ident(text: &str) -> String {
    text.trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
}

/// The paths a `use` tree names, braces expanded: `a::{b::C, d}` gives
/// `a::b::C` and `a::d`; globs and `self` in braces name their prefix.
fn use_tree(tree: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let mut prefix = Vec::new();
    let mut rest = tree.trim();
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            let inner = group.trim_end().strip_suffix('}').unwrap_or(group);
            let mut depth = 0;
            let mut start = 0;
            let mut parts = Vec::new();
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        parts.push(&inner[start..i]);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            parts.push(&inner[start..]);
            for part in parts.into_iter().filter(|p| !p.trim().is_empty()) {
                for tail in use_tree(part) {
                    let mut path = prefix.clone();
                    path.extend(tail.into_iter().filter(|s| s != "self"));
                    paths.push(path);
                }
            }
            return paths;
        }
        let segment = ident(rest);
        if segment.is_empty() {
            // `*`, or the end
            if !prefix.is_empty() {
                paths.push(prefix);
            }
            return paths;
        }
        prefix.push(segment.clone());
        rest = rest.trim_start()[segment.len()..].trim_start();
        match rest.strip_prefix("::") {
            Some(more) => rest = more.trim_start(),
            None => {
                paths.push(prefix);
                return paths;
            }
        }
    }
}

/// Every path a module's code names: the trees of its `use` statements, and
/// the `crate::`, `super::` and `self::` paths elsewhere. A `use` also gives
/// the names it brings in (the last segment, or the `as` name).
fn paths(code: &str) -> (Vec<Vec<String>>, BTreeMap<String, Vec<String>>) {
    let mut found = Vec::new();
    let mut imported = BTreeMap::new();
    let mut rest_of_code = String::new();
    let mut text = code;
    while let Some(at) = find_word(text, "use ") {
        rest_of_code.push_str(&text[..at]);
        let statement = &text[at + 4..];
        let end = statement.find(';').unwrap_or(statement.len());
        // A re-export (`pub use`, `pub(crate) use`) presents another module's
        // items; only the modules that name them through it depend on them.
        let line_start = text[..at].rfind('\n').map_or(0, |n| n + 1);
        if !text[line_start..at].trim_start().starts_with("pub") {
            found.extend(use_tree(&statement[..end].replace(" as ", " ")));
        }
        for (name, path) in use_names(&statement[..end]) {
            imported.insert(name, path);
        }
        text = &statement[end..];
    }
    rest_of_code.push_str(text);
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(at) = find_word(&rest_of_code[from..], start) {
            let path = &rest_of_code[from + at..];
            let end =
                path.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).unwrap_or(path.len());
            found.push(path[..end].split("::").filter(|s| !s.is_empty()).map(str::to_string).collect());
            from += at + end.max(1);
        }
    }
    (found, imported)
}

/// The names a `use` statement brings in, with their paths.
fn use_names(statement: &str) -> Vec<(String, Vec<String>)> {
    // `a::{B as C, d}`: rewrite `X as Y` so the tree parser sees one path per name.
    let mut out = Vec::new();
    let renamed: Vec<(String, String)> = statement
        .split([',', '{', '}'])
        .filter_map(|part| part.split_once(" as ").map(|(path, name)| (ident_last(path), ident(name))))
        .collect();
    for path in use_tree(&statement.replace(" as ", " ")) {
        let Some(last) = path.last().cloned() else { continue };
        let name = renamed.iter().find(|(from, _)| *from == last).map_or(last.clone(), |(_, to)| to.clone());
        if name != "_" {
            out.push((name, path));
        }
    }
    out
}

fn ident_last(path: &str) -> String {
    ident(path.rsplit("::").next().unwrap_or_default())
}

/// Where `word` starts in `text` with no identifier character before it.
fn find_word(text: &str, word: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(at) = text[from..].find(word) {
        let at = from + at;
        let before = text[..at].chars().next_back();
        if !before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            return Some(at);
        }
        from = at + word.len();
    }
    None
}

/// `src/consumer/dlq.rs` -> `consumer::dlq`; `src/consumer/mod.rs` -> `consumer`;
/// the crate root is `[]`; binaries are not modules of the crate.
fn module_of(src: &Path, file: &Path) -> Option<Module> {
    let rel = file.strip_prefix(src).ok()?;
    let mut parts: Vec<String> =
        rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    if parts.first().is_some_and(|p| p == "bin") {
        return None;
    }
    let last = parts.pop()?;
    match last.as_str() {
        "lib.rs" | "main.rs" if parts.is_empty() => Some(Vec::new()),
        "mod.rs" => Some(parts),
        name => {
            parts.push(name.trim_end_matches(".rs").to_string());
            Some(parts)
        }
    }
}

/// A crate's modules, what each names and what each imports.
struct Crate {
    modules: BTreeSet<Module>,
    named: BTreeMap<Module, Vec<Vec<String>>>,
    imports: BTreeMap<Module, BTreeMap<String, Vec<String>>>,
}

impl Crate {
    fn read(src: &Path) -> Self {
        let mut krate = Crate { modules: BTreeSet::new(), named: BTreeMap::new(), imports: BTreeMap::new() };
        for file in rust_files(src) {
            let Some(module) = module_of(src, &file) else { continue };
            let (named, imports) = paths(&code(&std::fs::read_to_string(&file).expect("read a source file")));
            krate.modules.insert(module.clone());
            krate.named.insert(module.clone(), named);
            krate.imports.insert(module, imports);
        }
        krate
    }

    /// Where a path written in `module` starts: `crate`, `super`, `self` or a
    /// child module; `None` for other crates.
    fn start(&self, module: &Module, path: &[String]) -> Option<(Module, usize)> {
        match path.first()?.as_str() {
            "crate" => Some((Vec::new(), 1)),
            "self" => Some((module.clone(), 1)),
            "super" => {
                let ups = path.iter().take_while(|s| *s == "super").count();
                (ups <= module.len()).then(|| (module[..module.len() - ups].to_vec(), ups))
            }
            child => {
                let mut m = module.clone();
                m.push(child.to_string());
                self.modules.contains(&m).then_some((m, 1))
            }
        }
    }

    /// The module a path written in `module` ends in: the deepest module it
    /// walks through, or, for a name that module imports, where the import comes from.
    fn resolve(&self, module: &Module, path: &[String], depth: usize) -> Option<Module> {
        let (mut at, skip) = self.start(module, path)?;
        for segment in &path[skip..] {
            let mut next = at.clone();
            next.push(segment.clone());
            if self.modules.contains(&next) {
                at = next;
                continue;
            }
            if depth < 16
                && let Some(import) = self.imports.get(&at).and_then(|i| i.get(segment))
            {
                return self.resolve(&at, import, depth + 1).or(Some(at));
            }
            break;
        }
        Some(at)
    }

    /// Module -> the modules its code names (not itself, not the crate root).
    fn edges(&self) -> BTreeMap<Module, BTreeSet<Module>> {
        let mut edges = BTreeMap::new();
        for (module, named) in &self.named {
            if module.is_empty() {
                continue;
            }
            let targets: &mut BTreeSet<Module> = edges.entry(module.clone()).or_default();
            for path in named {
                if let Some(target) = self.resolve(module, path, 0)
                    && !target.is_empty()
                    && target != *module
                {
                    targets.insert(target);
                }
            }
        }
        edges
    }

    /// For each module with children, the graph of its children (and its own
    /// file, as `self`): an edge where anything below one names anything below the other.
    fn sibling_graphs(&self) -> BTreeMap<Module, Graph> {
        let edges = self.edges();
        let mut graphs: BTreeMap<Module, Graph> = BTreeMap::new();
        for parent in &self.modules {
            let key = |m: &Module| -> Option<String> {
                if !m.starts_with(parent) {
                    return None;
                }
                match m.get(parent.len()) {
                    Some(child) => Some(child.clone()),
                    None if !parent.is_empty() => Some("self".to_string()),
                    None => None,
                }
            };
            let mut graph = Graph::new();
            for (from, targets) in &edges {
                let Some(a) = key(from) else { continue };
                for to in targets {
                    if let Some(b) = key(to).filter(|b| *b != a) {
                        graph.entry(a.clone()).or_default().insert(b);
                    }
                }
            }
            if !graph.is_empty() {
                graphs.insert(parent.clone(), graph);
            }
        }
        graphs
    }
}

/// The crate's top-level modules and the top-level modules each names.
fn graph(src: &Path) -> Graph {
    let krate = Crate::read(src);
    let mut graph = krate.sibling_graphs().remove(&Vec::new()).unwrap_or_default();
    for module in krate.modules.iter().filter(|m| m.len() == 1) {
        graph.entry(module[0].clone()).or_default();
    }
    graph
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

/// Every cycle of a crate, as `parent: a -> b -> a` (`crate` for the top level).
fn cycles(src: &Path) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (parent, graph) in Crate::read(src).sibling_graphs() {
        let parent = if parent.is_empty() { "crate".to_string() } else { parent.join("::") };
        for cycle in graph.keys().filter_map(|m| cycle_from(&graph, m)) {
            found.insert(format!("{parent}: {}", cycle.join(" -> ")));
        }
    }
    found
}

#[test]
fn no_crate_has_a_module_that_imports_a_module_that_imports_it_back() {
    let root = workspace_root();
    let sources = crate_sources(&root);
    assert!(sources.len() >= 15, "the crates were found: {sources:?}");
    let mut all = Vec::new();
    for src in &sources {
        for cycle in cycles(src) {
            all.push(format!("{}: {cycle}", src.strip_prefix(&root).unwrap_or(src).display()));
        }
    }
    assert!(all.is_empty(), "import cycles between modules:\n{}", all.join("\n"));
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
    // Nested modules and `super::` paths are edges too.
    let outbox = Crate::read(&root.join("libs/outbox/src")).sibling_graphs();
    let consumer = &outbox[&vec!["consumer".to_string()]];
    assert!(consumer.get("worker").is_some_and(|t| t.contains("settings")), "{consumer:?}");
    assert!(consumer.get("process").is_some_and(|t| t.contains("inbox")), "{consumer:?}");
    assert!(!consumer.contains_key("self"), "a re-export is no edge: {consumer:?}");
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
    // Braced imports, renames and re-exports are paths too.
    let (named, imported) = paths(
        "use crate::{engine::{A, B as C}, SagaSettings};\nuse super::process::Outcome;\nlet x = crate::step::f();",
    );
    let named: Vec<String> = named.iter().map(|p| p.join("::")).collect();
    assert_eq!(
        named,
        [
            "crate::engine::A",
            "crate::engine::B",
            "crate::SagaSettings",
            "super::process::Outcome",
            "crate::step::f"
        ]
    );
    assert_eq!(imported["C"].join("::"), "crate::engine::B");
    assert_eq!(imported["Outcome"].join("::"), "super::process::Outcome");
}

#[test]
fn a_cycle_between_nested_modules_through_super_is_found() {
    let dir = std::env::temp_dir().join(format!("module-graph-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("consumer")).unwrap();
    let write = |path: &str, text: &str| std::fs::write(src.join(path), text).unwrap();
    write("lib.rs", "mod consumer;\nmod kafka;\npub use consumer::Consumer;\n");
    write("kafka.rs", "pub fn name() {}\n");
    write("consumer/mod.rs", "mod dlq;\nmod process;\nmod worker;\npub use worker::Consumer;\n");
    write("consumer/worker.rs", "use crate::kafka;\npub struct Consumer;\n");
    write("consumer/process.rs", "use super::Consumer;\npub enum Outcome { Done }\n");
    write(
        "consumer/dlq.rs",
        "use super::process::Outcome;\n#[cfg(test)]\nmod tests {\n    use super::super::process;\n}\n",
    );
    assert_eq!(cycles(&src), BTreeSet::new(), "no cycle yet");
    write("consumer/process.rs", "use super::{Consumer, dlq::Reason};\npub enum Outcome { Done }\n");
    assert_eq!(
        cycles(&src),
        BTreeSet::from([
            "consumer: dlq -> process -> dlq".to_string(),
            "consumer: process -> dlq -> process".to_string()
        ])
    );
    // A name the parent imports counts as where it comes from: `super::Consumer` is `worker`.
    write("consumer/process.rs", "use super::Consumer;\npub enum Outcome { Done }\n");
    write("consumer/worker.rs", "use crate::kafka;\nuse super::process::Outcome;\npub struct Consumer;\n");
    assert_eq!(cycles(&src).len(), 2, "process -> worker -> process");
    std::fs::remove_dir_all(&dir).unwrap();
}
