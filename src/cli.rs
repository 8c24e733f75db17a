//! The one-shot subcommands: `migrate`, `openapi` and `reconcile`, each run
//! against the configured database and then exit, `webhook secret`; and how
//! any command ends.

use std::io::{IsTerminal, Write};

use anyhow::Context;

use crate::access::QueueScope;
use crate::ledger::{QueueName, SweepReport};
use crate::store::{Store, StoreOptions, SweepQuery, backend_of, permanent_connect_error};

/// Parents the command-line sweep checks per call: how often it reports progress.
const PAGE: i64 = 500;

/// Drifted parents' reports the command-line sweep prints (`drifted` counts all).
const PARENTS_SHOWN: usize = 1000;

/// How the process ends: an error is a message saying what to change, on
/// stderr, and exit status 1; never a backtrace, even with `RUST_BACKTRACE`
/// set (a panic still shows one).
pub fn exit_code(result: anyhow::Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("Error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Connects once; an error no retry can fix says what to change, as `serve`
/// says it.
async fn connect(database_url: &str, options: &StoreOptions) -> anyhow::Result<Store> {
    backend_of(database_url).context("unsupported DATABASE_URL: use postgres://… or sqlite://…")?;
    Store::connect_with(database_url, options)
        .await
        .map_err(|err| match permanent_connect_error(&err) {
            Some(what_to_change) => anyhow::anyhow!("cannot use the database: {what_to_change}"),
            None => err,
        })
}

/// `migrate`: applies the migrations and says so on stderr.
pub async fn migrate(database_url: &str, options: &StoreOptions) -> anyhow::Result<()> {
    let store = connect(database_url, options).await?;
    store.migrate().await.context("applying migrations")?;
    eprintln!("migrations applied ({})", store.backend());
    Ok(())
}

/// `webhook secret --queue Q`: the secret that signs `queue`'s events on
/// stdout, what to do with it on stderr.
pub fn webhook_secret(master: Option<&crate::ledger::webhook::WebhookSecret>, queue: &QueueName) -> anyhow::Result<()> {
    let master =
        master.context("give the master secret as --webhook-secret or LEDGER_WEBHOOK_SECRET (whsec_ and base64)")?;
    eprintln!("The secret that signs the completion events of queue {queue} (give it to that queue's receivers only):");
    println!("{}", master.for_queue(queue.as_str()).to_whsec());
    Ok(())
}

/// `openapi`: the document as `openapi/openapi.json` holds it.
pub fn openapi() -> anyhow::Result<()> {
    let mut doc = serde_json::to_string_pretty(&crate::api::openapi())?;
    doc.push('\n');
    std::io::stdout().write_all(doc.as_bytes())?;
    Ok(())
}

/// `reconcile`: sweeps every parent (or one queue's) a page at a time, with a
/// progress bar on a terminal and a line per page otherwise; prints the report
/// as JSON on stdout.
pub async fn reconcile(
    database_url: &str,
    options: &StoreOptions,
    queue: Option<&QueueName>,
    apply: bool,
) -> anyhow::Result<()> {
    let store = connect(database_url, options).await?;
    let every = QueueScope::every();
    let total = store.count_parents(queue, &every).await.context("counting parents")?;
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} parents (eta {eta}) {msg}",
            )
            .expect("a valid template"),
        );
        bar
    });
    let dry_run = !apply;
    let mut report = SweepReport {
        dry_run,
        checked: 0,
        drifted: 0,
        repaired: 0,
        parents: Vec::new(),
        next_cursor: None,
    };
    let mut after = 0;
    loop {
        let page = store
            .reconcile_sweep(SweepQuery {
                queue,
                within: &every,
                dry_run,
                after,
                limit: PAGE,
            })
            .await
            .context("reconciling")?;
        report.checked += page.checked;
        report.drifted += page.drifted;
        report.repaired += page.repaired;
        let room = PARENTS_SHOWN.saturating_sub(report.parents.len());
        report.parents.extend(page.parents.into_iter().take(room));
        let progress = format!("{} drifted, {} repaired", report.drifted, report.repaired);
        match &bar {
            Some(bar) => {
                bar.inc(page.checked);
                bar.set_message(progress);
            }
            None => eprintln!("checked {}/{total} parents: {progress}", report.checked),
        }
        match page.next_cursor.as_deref().map(str::parse::<i64>) {
            Some(Ok(position)) => after = position,
            Some(Err(err)) => anyhow::bail!("the sweep returned an unreadable cursor: {err}"),
            None => break,
        }
    }
    if let Some(bar) = bar {
        bar.finish();
    }
    eprintln!(
        "{}: checked {}, drifted {}, repaired {}",
        if dry_run {
            "dry run (pass --apply to repair)"
        } else {
            "applied"
        },
        report.checked,
        report.drifted,
        report.repaired
    );
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
