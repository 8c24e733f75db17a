//! The raw-protocol workers as tests run them (examples/node/worker.mjs, the
//! reference loop for other languages, and its Python and TypeScript twins
//! kept as contract tests in tests/workers/; the SDKs in sdk/ replace them
//! for users): Python and Node as they are, TypeScript compiled with
//! `tsc --strict` against the types openapi-typescript generates from
//! openapi/openapi.json (`.ci/clients` installs tsc and writes them to
//! `target/clients/typescript`). Without them the TypeScript worker is left out
//! with a loud message, and the test fails when `CI=true` or
//! `LEDGER_REQUIRE_POSTGRES=1`.

use std::path::{Path, PathBuf};

use tokio::process::Command;

use super::missing_tool;

pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// One example worker: its language, and the program and script that run it.
pub struct Example {
    pub lang: &'static str,
    pub program: &'static str,
    pub script: PathBuf,
}

/// The examples to run: Python and Node, and TypeScript compiled into `dir`
/// when the generated types and tsc are there.
pub async fn examples(dir: &Path) -> Vec<Example> {
    let mut examples = vec![
        Example {
            lang: "python",
            program: "python3",
            script: root().join("tests/workers/python/worker.py"),
        },
        Example {
            lang: "node",
            program: "node",
            script: root().join("examples/node/worker.mjs"),
        },
    ];
    if let Some(script) = compile_typescript(dir).await {
        examples.push(Example {
            lang: "typescript",
            program: "node",
            script,
        });
    }
    examples
}

/// Compiles tests/workers/typescript/worker.ts with `tsc --strict` (its
/// tsconfig.json) into `dir`; `None`, after a loud message, when the generated
/// types or tsc are missing and nothing requires them.
async fn compile_typescript(dir: &Path) -> Option<PathBuf> {
    let generated = root().join("target/clients/typescript");
    let tsc = generated.join("node_modules/.bin/tsc");
    let needed = [
        tsc.clone(),
        generated.join("ledger.d.ts"),
        generated.join("node_modules/@types/node/package.json"),
    ];
    if let Some(missing) = needed.iter().find(|path| !path.exists()) {
        missing_tool(
            &format!(
                "{} is missing: run .ci/clients to generate the TypeScript types and install tsc",
                missing.display()
            ),
            "the TypeScript worker is (Python and Node still run)",
        );
        return None;
    }
    let out = dir.join("typescript");
    let output = Command::new(&tsc)
        .arg("-p")
        .arg(root().join("tests/workers/typescript"))
        .arg("--outDir")
        .arg(&out)
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", tsc.display()));
    assert!(
        output.status.success(),
        "tsc --strict refuses tests/workers/typescript/worker.ts:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    // The compiled worker is an ES module (top-level await), as worker.mjs is.
    std::fs::write(out.join("package.json"), r#"{"private": true, "type": "module"}"#).unwrap();
    Some(out.join("worker.js"))
}
