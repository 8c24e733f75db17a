//! The one-shot subcommands, run as the real binary: `migrate`, `openapi`,
//! `reconcile`, and the examples each `--help` shows.

mod common;

use std::process::Output;

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

const CHECKED_IN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json");

/// Runs `child-ledger args...` with `DATABASE_URL` unset (so only `--database-url` counts).
async fn run(args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_child-ledger"))
        .args(args)
        .env_remove("DATABASE_URL")
        .env("RUST_LOG", "warn")
        .output()
        .await
        .expect("run child-ledger")
}

#[track_caller]
fn succeeded(output: &Output) -> (String, String) {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        output.status.success(),
        "{}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    (stdout, stderr)
}

fn migrations(backend: Backend) -> i64 {
    let dialect = match backend {
        Backend::Postgres => "postgres",
        Backend::Sqlite => "sqlite",
    };
    std::fs::read_dir(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("migrations")
            .join(dialect),
    )
    .unwrap()
    .count() as i64
}

async fn migrate_applies_every_migration_and_exits(backend: Backend) {
    let db = TestDatabase::new(backend).await;
    let (_, stderr) = succeeded(&run(&["migrate", "--database-url", &db.url]).await);
    assert!(stderr.contains("migrations applied"), "{stderr}");
    let raw = db.store().await;
    let applied = raw
        .count_raw("SELECT count(*) FROM _sqlx_migrations WHERE success")
        .await
        .unwrap();
    println!("{backend:?}: migrate applied {applied} migrations");
    assert_eq!(applied, migrations(backend));
    assert_eq!(raw.count_raw("SELECT count(*) FROM reconcile_job").await.unwrap(), 0);
    // Again: nothing left to apply, and still a success.
    succeeded(&run(&["migrate", "--database-url", &db.url]).await);
    assert_eq!(
        raw.count_raw("SELECT count(*) FROM _sqlx_migrations").await.unwrap(),
        migrations(backend)
    );
}

async fn reconcile_reports_then_applies(backend: Backend) {
    let app = spawn_app(backend).await;
    for (parent, queue) in [("C-1", "events"), ("C-2", "events"), ("C-3", "other")] {
        let r = app
            .put(
                &format!("/v1/parents/{parent}"),
                json!({"queue": queue, "children": children(2)}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    }
    let r = app
        .post("/v1/parents/C-2/claims", json!({"limit": 2, "lease_seconds": 300}))
        .await;
    let claim = r.body["claim_id"].as_str().unwrap().to_owned();
    for seq in 0..2 {
        let r = app
            .post(
                &format!("/v1/parents/C-2/children/{seq}/outcome"),
                json!({"outcome": "processed", "claim_id": claim}),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
    }
    // The drifted counter: C-2 processed both children, the projection says none.
    app.exec("UPDATE parent SET processed = 0, completed_at = NULL WHERE parent_id = 'C-2'")
        .await;

    let (stdout, stderr) = succeeded(&run(&["reconcile", "--database-url", &app.database_url]).await);
    let report: Value = serde_json::from_str(&stdout).expect("the report is JSON");
    println!(
        "dry run: checked {}, drifted {}, repaired {}",
        report["checked"], report["drifted"], report["repaired"]
    );
    assert_eq!(report["dry_run"], true, "{report}");
    assert_eq!(report["checked"], 3, "{report}");
    assert_eq!(report["drifted"], 1, "{report}");
    assert_eq!(report["repaired"], 0, "{report}");
    assert_eq!(report["parents"][0]["parent_id"], "C-2", "{report}");
    assert!(
        stderr.contains("checked 3/3 parents"),
        "plain progress lines off a terminal: {stderr}"
    );
    assert!(stderr.contains("--apply"), "{stderr}");
    assert_eq!(
        app.get("/v1/parents/C-2").await.body["counts"]["processed"],
        0,
        "a dry run writes nothing"
    );

    // One queue only: the drift is not in it.
    let (stdout, _) = succeeded(
        &run(&[
            "reconcile",
            "--queue",
            "other",
            "--apply",
            "--database-url",
            &app.database_url,
        ])
        .await,
    );
    let report: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        (report["checked"].as_u64(), report["drifted"].as_u64()),
        (Some(1), Some(0)),
        "{report}"
    );

    let (stdout, _) = succeeded(&run(&["reconcile", "--apply", "--database-url", &app.database_url]).await);
    let report: Value = serde_json::from_str(&stdout).unwrap();
    println!(
        "apply: checked {}, drifted {}, repaired {}",
        report["checked"], report["drifted"], report["repaired"]
    );
    assert_eq!(report["dry_run"], false, "{report}");
    assert_eq!(report["checked"], 3, "{report}");
    assert_eq!(report["drifted"], 1, "{report}");
    assert_eq!(report["repaired"], 1, "{report}");
    let parent = app.get("/v1/parents/C-2").await.body;
    assert_eq!(parent["counts"]["processed"], 2, "{parent}");
    assert_eq!(parent["state"], "complete", "{parent}");

    let (stdout, _) = succeeded(&run(&["reconcile", "--database-url", &app.database_url]).await);
    let report: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["drifted"], 0, "nothing left to repair: {report}");
}

both_stores!(
    migrate_applies_every_migration_and_exits,
    reconcile_reports_then_applies
);

#[tokio::test]
async fn openapi_prints_the_checked_in_document() {
    let (stdout, _) = succeeded(&run(&["openapi"]).await);
    let doc: Value = serde_json::from_str(&stdout).expect("the document is JSON");
    assert!(
        doc["paths"]["/v1/reconcile/jobs"]["post"].is_object(),
        "jobs are documented"
    );
    let checked_in = std::fs::read_to_string(CHECKED_IN).unwrap();
    assert!(
        stdout == checked_in,
        "`child-ledger openapi` differs from openapi/openapi.json"
    );
}

/// Each help shows examples and only its own command's flags: the database
/// flags where the command connects (never the password), the serve flags
/// only for serve; `token new --help` fits a screen.
#[tokio::test]
async fn every_subcommand_help_shows_examples_and_no_secret() {
    for (args, connects) in [
        (&["--help"][..], false),
        (&["serve", "--help"], true),
        (&["migrate", "--help"], true),
        (&["openapi", "--help"], false),
        (&["reconcile", "--help"], true),
        (&["token", "--help"], false),
        (&["token", "new", "--help"], false),
    ] {
        let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_child-ledger"))
            .args(args)
            .env("DATABASE_URL", "postgres://ledger:hunter2-secret@db.internal/ledger")
            .output()
            .await
            .unwrap();
        let (help, _) = succeeded(&output);
        assert!(help.contains("Examples:\n  child-ledger"), "{args:?}:\n{help}");
        assert!(
            !help.contains("hunter2-secret"),
            "{args:?} shows the database password:\n{help}"
        );
        assert_eq!(help.contains("--database-url"), connects, "{args:?}:\n{help}");
        assert_eq!(
            help.contains("--max-body-bytes"),
            args[0] == "serve",
            "serve's flags are serve's: {args:?}:\n{help}"
        );
    }
    let output = run(&["reconcile", "--help"]).await;
    let (help, _) = succeeded(&output);
    assert!(help.contains("--apply") && help.contains("--queue"), "{help}");
    assert!(help.contains("child-ledger reconcile --queue events --apply"), "{help}");
    let (help, _) = succeeded(&run(&["token", "new", "--help"]).await);
    println!("token new --help: {} lines", help.lines().count());
    assert!(help.lines().count() < 40, "{help}");
    assert!(help.contains("child-ledger token new --name"), "{help}");
}

/// A configuration error is one line saying what to change, exit status 1,
/// never a backtrace, even with `RUST_BACKTRACE=1`.
#[tokio::test]
async fn a_configuration_error_is_a_message_not_a_backtrace() {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_child-ledger"))
        .args(["--listen", "0.0.0.0:0"])
        .env("RUST_BACKTRACE", "1")
        .env_remove("LEDGER_TOKENS_FILE")
        .env_remove("LEDGER_ALLOW_ANONYMOUS")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.starts_with("Error: refusing to serve"), "{stderr}");
    assert!(stderr.contains("--tokens-file"), "{stderr}");
    assert!(
        !stderr.contains("backtrace") && !stderr.contains("Stack") && stderr.lines().count() == 1,
        "{stderr}"
    );
}

/// `serve -h` fits one screen, its flags under the headings of the manual in
/// order; `serve --help` keeps every flag `serve` takes.
#[tokio::test]
async fn serve_short_help_is_one_screen_grouped_and_long_help_has_every_flag() {
    use clap::CommandFactory;
    let (short, _) = succeeded(&run(&["serve", "-h"]).await);
    println!("serve -h: {} lines", short.lines().count());
    assert!(
        short.lines().count() <= 60,
        "serve -h is {} lines:\n{short}",
        short.lines().count()
    );
    let headings = [
        "Server:",
        "Database:",
        "Access:",
        "Limits:",
        "Webhooks:",
        "Observability:",
        "Retention:",
    ];
    let at: Vec<usize> = headings
        .iter()
        .map(|h| {
            short
                .lines()
                .position(|line| line == *h)
                .unwrap_or_else(|| panic!("no {h} heading in serve -h:\n{short}"))
        })
        .collect();
    assert!(
        at.windows(2).all(|w| w[0] < w[1]),
        "headings out of order: {at:?}\n{short}"
    );
    let (long, _) = succeeded(&run(&["serve", "--help"]).await);
    let cli = child_ledger::config::Cli::command();
    let serve = cli.find_subcommand("serve").expect("serve");
    let flags: Vec<String> = serve
        .get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .collect();
    assert!(flags.len() >= 30, "{flags:?}");
    for flag in &flags {
        assert!(
            long.contains(&format!("{flag} ")) || long.contains(&format!("{flag}\n")),
            "serve --help lacks {flag}"
        );
    }
    assert!(short.contains("--help") && short.contains("every flag"), "{short}");
}

/// The book's configuration chapter lists every flag `serve` takes (one was
/// missing from its table), and neither `--help` nor the OpenAPI document
/// speaks of how the project was built (work-log words a user cannot place).
#[tokio::test]
async fn the_manual_lists_every_flag_and_no_work_log_words() {
    use clap::CommandFactory;
    let manual = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md")).unwrap();
    let cli = child_ledger::config::Cli::command();
    let serve = cli.find_subcommand("serve").expect("serve");
    for flag in serve
        .get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| a.get_long())
    {
        assert!(
            manual.contains(&format!("`--{flag}`")),
            "docs/configuration.md does not list --{flag}"
        );
    }
    let (help, _) = succeeded(&run(&["serve", "--help"]).await);
    let document = std::fs::read_to_string(CHECKED_IN).unwrap();
    let ordinals = [
        "first",
        "second",
        "third",
        "fourth",
        "fifth",
        "sixth",
        "seventh",
        "eighth",
        "ninth",
        "tenth",
        "eleventh",
        "twelfth",
        "thirteenth",
        "fourteenth",
        "fifteenth",
    ];
    for (name, text) in [
        ("serve --help", help.to_lowercase()),
        ("openapi.json", document.to_lowercase()),
    ] {
        for words in ["tried here", "this machine", "this project's machines"] {
            assert!(!text.contains(words), "{name} says {words:?}");
        }
        let issue = text
            .match_indices("issue ")
            .any(|(at, _)| text[at + 6..].chars().next().is_some_and(|c| c.is_ascii_digit()));
        assert!(!issue, "{name} names an issue by number");
        for ordinal in ordinals {
            assert!(
                !text.contains(&format!("{ordinal} session")),
                "{name} says {ordinal} session"
            );
        }
    }
}

/// A SQLite file in a directory that does not exist cannot be fixed by
/// retrying: `serve` and `migrate` exit at once saying what to change.
#[tokio::test]
async fn a_sqlite_path_in_a_missing_directory_exits_at_once() {
    let url = format!("sqlite:///nonexistent-{}/ledger.db", uuid::Uuid::new_v4());
    let started = std::time::Instant::now();
    for args in [&["serve", "--listen", "127.0.0.1:0"][..], &["migrate"]] {
        let output = tokio::time::timeout(
            std::time::Duration::from_secs(20),
            tokio::process::Command::new(env!("CARGO_BIN_EXE_child-ledger"))
                .args(args)
                .args(["--database-url", &url])
                .env("RUST_LOG", "warn")
                .output(),
        )
        .await
        .unwrap_or_else(|_| panic!("{args:?} kept retrying a SQLite path in a missing directory"))
        .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains("cannot use the database"), "{args:?}: {stderr}");
        assert!(stderr.contains("mkdir -p"), "{args:?}: {stderr}");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(!stdout.contains("retrying"), "{args:?} retried: {stdout}");
    }
    println!("both exited in {:?}", started.elapsed());
}

/// The log is coloured only on a terminal: written to a file, it holds no
/// escape codes.
#[tokio::test]
async fn logs_to_a_file_carry_no_colour() {
    let dir = std::env::temp_dir().join(format!("child-ledger-log-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}", dir.join("ledger.db").display());
    let mut service = common::process::ServiceProcess::start("colour", &url, &[]).await;
    service.ready().await;
    service.terminate(std::time::Duration::from_secs(30)).await;
    let log = service.log_text();
    assert!(log.contains("ledger ready"), "{log}");
    assert!(!log.contains('\u{1b}'), "escape codes in a log file:\n{log:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
