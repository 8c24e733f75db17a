//! The layers of `src/` hold, as `docs/architecture.md` draws them: each file
//! imports only from its own layer and the layers below it.
//!
//! ```text
//! wiring    main.rs cli.rs lib.rs server.rs config.rs startup.rs
//! http      api/ jobs/ error.rs
//! services  state.rs metrics.rs metrics/ waiters.rs access.rs limits.rs
//! storage   store/          (imports only store/ and ledger/)
//! rules     ledger/         (imports nothing else of the crate)
//! ```
//!
//! and `api/` never names a backend module. This reads the sources, so a
//! forbidden import fails here with its file and line, whatever else builds.

use std::path::{Path, PathBuf};

/// The layers, lowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Layer {
    Rules,
    Storage,
    Services,
    Http,
    Wiring,
}

/// The layer of a top-level module of the crate (`crate::<name>`), or of a
/// file by its path under `src/`.
fn layer_of_module(name: &str) -> Option<Layer> {
    Some(match name {
        "ledger" => Layer::Rules,
        "store" => Layer::Storage,
        "state" | "metrics" | "waiters" | "access" | "limits" | "events" | "telemetry" | "turns" => Layer::Services,
        "api" | "jobs" | "error" => Layer::Http,
        "main" | "cli" | "lib" | "server" | "config" | "startup" => Layer::Wiring,
        _ => return None,
    })
}

fn layer_of_file(relative: &Path) -> Layer {
    let first = relative
        .components()
        .next()
        .and_then(|c| c.as_os_str().to_str())
        .expect("a path under src/");
    let module = first.strip_suffix(".rs").unwrap_or(first);
    layer_of_module(module)
        .unwrap_or_else(|| panic!("src/{} is in no layer: add it to tests/layers.rs", relative.display()))
}

/// Whether a file of `from` may import the top-level module `to` of layer `layer`.
fn allowed(from: Layer, from_module: &str, to_module: &str, to: Layer) -> bool {
    match from {
        // Rules import nothing of the crate but themselves; the store only
        // itself and the rules.
        Layer::Rules => to_module == "ledger",
        Layer::Storage => matches!(to_module, "store" | "ledger"),
        _ => from_module == to_module || to <= from,
    }
}

/// Every `crate::` path of a source text, by line: the top-level module it
/// names and, for `crate::store::…`, the module below it.
fn crate_paths(source: &str) -> Vec<(usize, String, Option<String>)> {
    let mut found = Vec::new();
    for (n, line) in source.lines().enumerate() {
        // Comments (and doc comments) may name anything.
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let after = &rest[at + "crate::".len()..];
            // `$crate::` in a macro is the same as `crate::`.
            for (first, second) in path_heads(after) {
                found.push((n + 1, first, second));
            }
            rest = after;
        }
    }
    found
}

/// The first two segments of a path (`store::postgres::x` gives `store`,
/// `postgres`), or of each path of a `{a::b, c}` group.
fn path_heads(text: &str) -> Vec<(String, Option<String>)> {
    let ident = |s: &str| -> String { s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect() };
    if let Some(group) = text.strip_prefix('{') {
        let mut depth = 0;
        let mut heads = Vec::new();
        let mut start = 0;
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    heads.push(&group[start..i]);
                    break;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    heads.push(&group[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        return heads
            .into_iter()
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .flat_map(path_heads)
            .collect();
    }
    let first = ident(text);
    if first.is_empty() {
        return Vec::new();
    }
    let second = text[first.len()..]
        .strip_prefix("::")
        .map(ident)
        .filter(|s| !s.is_empty());
    vec![(first, second)]
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The forbidden imports of one file, as `file:line: what`.
fn violations(relative: &Path, source: &str) -> Vec<String> {
    let from = layer_of_file(relative);
    let from_module = relative
        .components()
        .next()
        .and_then(|c| c.as_os_str().to_str())
        .map(|m| m.strip_suffix(".rs").unwrap_or(m).to_owned())
        .unwrap();
    let mut found = Vec::new();
    for (line, first, second) in crate_paths(source) {
        let at = format!("src/{}:{line}", relative.display());
        // `crate::AppState` and other items of lib.rs are the wiring's.
        let to = layer_of_module(&first).unwrap_or(Layer::Wiring);
        if !allowed(from, &from_module, &first, to) {
            found.push(format!(
                "{at}: {from:?} may not import crate::{first} ({to:?}): a layer imports only itself and the layers below it"
            ));
        }
        if from_module == "api" && first == "store" && matches!(second.as_deref(), Some("postgres" | "sqlite")) {
            found.push(format!(
                "{at}: api/ names a backend module (crate::store::{}); go through `Store`",
                second.unwrap()
            ));
        }
    }
    found
}

#[test]
fn every_file_imports_only_its_layer_and_below() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(
        files.len() > 50,
        "read only {} files under {}",
        files.len(),
        src.display()
    );
    let mut found = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&src).unwrap();
        found.extend(violations(relative, &std::fs::read_to_string(file).unwrap()));
    }
    assert!(found.is_empty(), "forbidden imports:\n{}", found.join("\n"));
}

/// `docs/architecture.md` names every file under `src/` (by its path there)
/// and no file that is not there.
#[test]
fn the_architecture_document_names_every_file() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let mut files = Vec::new();
    let mut every = Vec::new();
    rust_files(&src, &mut every);
    fn all_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                all_files(&path, out);
            } else {
                out.push(path);
            }
        }
    }
    all_files(&src, &mut files);
    let missing: Vec<String> = files
        .iter()
        .map(|f| f.strip_prefix(&src).unwrap().display().to_string())
        .filter(|f| !doc.contains(&format!("`{f}`")))
        .collect();
    assert!(missing.is_empty(), "docs/architecture.md does not name: {missing:?}");
    // Every `….rs`-like path the document names under its file list exists.
    let listed = doc
        .split("## Every file")
        .nth(1)
        .unwrap()
        .split("\n## ")
        .next()
        .unwrap();
    let stale: Vec<&str> = listed
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|name| {
            let looks_like_file = [".rs", ".js", ".css", ".html"].iter().any(|e| name.ends_with(e));
            looks_like_file && !name.contains(' ') && !name.starts_with("tests/") && !src.join(name).is_file()
        })
        .collect();
    assert!(
        stale.is_empty(),
        "docs/architecture.md names files that are not in src/: {stale:?}"
    );
}

#[test]
fn the_check_finds_what_it_forbids() {
    let cases = [
        ("ledger/model.rs", "use crate::store::Store;", 1),
        ("store/claims.rs", "use crate::waiters::Work;", 1),
        ("store/claims.rs", "use crate::{access::QueueScope, ledger::Work};", 1),
        ("store/parents.rs", "    let x = crate::api::openapi();", 1),
        ("waiters.rs", "use crate::api::guard::Caller;", 1),
        ("api/claims.rs", "use crate::startup::Application;", 1),
        ("api/claims.rs", "use crate::store::postgres::PgStore;", 1),
        ("jobs/reaper.rs", "use crate::AppState;", 1),
        // Allowed: downward, within the layer, and in comments.
        (
            "api/claims.rs",
            "use crate::{state::AppState, store::Store, ledger::ParentId};",
            0,
        ),
        ("store/claims.rs", "use crate::ledger::{Claim, Work};", 0),
        ("metrics.rs", "use crate::{access::Role, waiters::Waiters};", 0),
        ("ledger/work.rs", "/// Unlike `crate::store::Store`, this is pure.", 0),
        ("startup.rs", "use crate::api::until_ready;", 0),
    ];
    for (file, source, expected) in cases {
        let found = violations(Path::new(file), source);
        assert_eq!(found.len(), expected, "{file}: {source}: {found:?}");
    }
}
