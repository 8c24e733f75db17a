//! A parent's results, streamed (NDJSON or CSV, gzip when asked), and its
//! summary (counts and the most frequent reasons).

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use flate2::Compression;
use flate2::write::GzEncoder;
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{AppQuery, parent_id_param};
use super::guard::Caller;
use crate::error::{ApiError, ApiResult, Problem};
use crate::ledger::results::{ChildResult, Summary};
use crate::ledger::{ChildState, ParentId};
use crate::state::AppState;
use crate::store::Store;
use crate::turns::{NoTurn, Turn};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(parent_results))
        .routes(routes!(parent_summary))
}

/// Most children read per statement while results stream; the first
/// statement reads `FIRST_ROWS`, and each later one as many as the widest
/// row seen so far lets fit in `CHUNK_BYTES` (the database sizes every row
/// it reads, so a statement reads no more rows than it may return).
const CHUNK_ROWS: i64 = 1000;
const FIRST_ROWS: i64 = 16;

/// Most bytes of results and reasons read per statement (one more child may
/// pass it): each chunk is written out before the next is read, so an export
/// holds about this much whatever the parent's size and its results' weight.
const CHUNK_BYTES: i64 = 256 * 1024;

/// How long an export waits for a client that does not read (its
/// connection's buffers full, so nothing asks for the next chunk) before it
/// ends and gives its turn back.
const STALLED: Duration = Duration::from_secs(60);

pub const NDJSON: &str = "application/x-ndjson";
pub const CSV: &str = "text/csv";

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ResultsQuery {
    /// Only children in this state (as readers see it).
    state: Option<ChildState>,
}

/// How results are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Ndjson,
    Csv,
}

impl Format {
    /// The format an `Accept` header asks for: CSV when it names `text/csv`
    /// (and not NDJSON first), NDJSON otherwise; `406` when it admits neither.
    fn of(accept: Option<&HeaderValue>) -> ApiResult<Self> {
        let Some(accept) = accept else { return Ok(Self::Ndjson) };
        let accept = accept.to_str().unwrap_or("").to_ascii_lowercase();
        let mut wildcard = false;
        for range in accept.split(',') {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim();
            if parts.any(|p| matches!(p.trim(), "q=0" | "q=0.0" | "q=0.00" | "q=0.000")) {
                continue;
            }
            match media {
                "application/x-ndjson" | "application/ndjson" | "application/jsonl" => return Ok(Self::Ndjson),
                "text/csv" => return Ok(Self::Csv),
                "*/*" | "application/*" | "text/*" | "" => wildcard = true,
                _ => {}
            }
        }
        if wildcard {
            return Ok(Self::Ndjson);
        }
        Err(ApiError::InvalidField {
            field: "accept".to_owned(),
            detail: format!("results are written as {NDJSON} or {CSV}; Accept admits neither"),
            status: StatusCode::NOT_ACCEPTABLE,
        })
    }

    fn content_type(self) -> &'static str {
        match self {
            Self::Ndjson => NDJSON,
            Self::Csv => "text/csv; charset=utf-8",
        }
    }
}

/// Whether `Accept-Encoding` admits gzip (named, or `*`, with a nonzero `q`).
fn wants_gzip(accept_encoding: Option<&HeaderValue>) -> bool {
    let Some(value) = accept_encoding.and_then(|v| v.to_str().ok()) else {
        return false;
    };
    value.split(',').any(|coding| {
        let mut parts = coding.split(';');
        let name = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let refused = parts.any(|p| {
            let p = p.trim();
            p.strip_prefix("q=")
                .and_then(|q| q.parse::<f32>().ok())
                .is_some_and(|q| q <= 0.0)
        });
        (name == "gzip" || name == "x-gzip" || name == "*") && !refused
    })
}

/// The export in progress: where it stands, the gzip stream when asked, and
/// its turn among the exports (taken away when its client stalls).
struct Export {
    turn: Arc<Mutex<Option<Turn>>>,
    /// When the body was last asked for more, in ms since `epoch`.
    asked: Arc<AtomicU64>,
    epoch: Instant,
    store: Store,
    parent_id: ParentId,
    state: Option<ChildState>,
    format: Format,
    after: Option<i64>,
    /// Rows the next statement reads, and the widest row written so far.
    rows: i64,
    widest: usize,
    started: bool,
    done: bool,
    gzip: Option<GzEncoder<Vec<u8>>>,
}

impl Export {
    /// The next piece of the body: the next chunk of rows, written out;
    /// `None` once the last has been sent.
    async fn next(&mut self) -> Option<Result<Bytes, std::io::Error>> {
        if self.done {
            return None;
        }
        self.asked
            .store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
        if self.turn.lock().unwrap_or_else(|e| e.into_inner()).is_none() {
            // Its client stalled past `STALLED`: cut the body short.
            self.done = true;
            return Some(Err(std::io::Error::other("the client stopped reading")));
        }
        let mut text = String::new();
        if !self.started && self.format == Format::Csv {
            text.push_str(ChildResult::CSV_HEADER);
        }
        self.started = true;
        let chunk = match self
            .store
            .results_chunk(&self.parent_id, self.state, self.after, self.rows, CHUNK_BYTES)
            .await
        {
            Ok((chunk, last)) => {
                self.done = last;
                chunk
            }
            Err(err) => {
                // The head has gone: all that is left is to cut the body short,
                // which a client sees as an incomplete response, never as a whole one.
                tracing::warn!(parent_id = %self.parent_id, error = %err, "results stream ended early");
                self.done = true;
                return Some(Err(std::io::Error::other(err.to_string())));
            }
        };
        self.after = chunk.last().map(|c| c.sequence).or(self.after);
        for result in &chunk {
            let start = text.len();
            match self.format {
                Format::Ndjson => {
                    text.push_str(&serde_json::to_string(result).expect("a result serializes"));
                    text.push('\n');
                }
                Format::Csv => result.csv_row(&mut text),
            }
            self.widest = self.widest.max(text.len() - start);
        }
        self.rows = (CHUNK_BYTES / self.widest.max(1) as i64).clamp(1, CHUNK_ROWS);
        let bytes = match self.gzip.as_mut() {
            None => text.into_bytes(),
            Some(gzip) => {
                let written = gzip.write_all(text.as_bytes());
                let mut out = std::mem::take(gzip.get_mut());
                if let Err(err) = written {
                    self.done = true;
                    return Some(Err(err));
                }
                if self.done {
                    match self.gzip.take().expect("gzip").finish() {
                        Ok(tail) => out.extend_from_slice(&tail),
                        Err(err) => return Some(Err(err)),
                    }
                }
                out
            }
        };
        Some(Ok(Bytes::from(bytes)))
    }
}

/// Takes an export's turn away once its body has not been asked for more
/// for `STALLED` (its client does not read); ends with the export.
async fn end_when_stalled(turn: std::sync::Weak<Mutex<Option<Turn>>>, asked: Arc<AtomicU64>, epoch: Instant) {
    loop {
        tokio::time::sleep(STALLED / 4).await;
        let Some(turn) = turn.upgrade() else { return };
        let idle = epoch
            .elapsed()
            .saturating_sub(Duration::from_millis(asked.load(Ordering::Relaxed)));
        if idle >= STALLED {
            tracing::info!(
                idle_seconds = idle.as_secs(),
                "a results export whose client stopped reading ends"
            );
            turn.lock().unwrap_or_else(|e| e.into_inner()).take();
            return;
        }
    }
}

/// Every child's outcome in sequence order, streamed: NDJSON (the default,
/// `Accept: application/x-ndjson`) or CSV (`Accept: text/csv`), gzip when
/// `Accept-Encoding` asks. Children not yet terminal are listed with their
/// state and no outcome; `?state=` filters. Rows are read in chunks along the
/// primary key, each about 256 KiB of results at most, and the next is read
/// only once the previous was taken by the connection, so memory stays flat
/// whatever the size, and the request timeout bounds only the answer's
/// start. Beyond `--max-exports` exports streaming in this process, or
/// `--max-exports-per-token` of one token: `429` (an admin token may still
/// take one of 4 kept for admins). An export whose client stops reading for
/// 60 s is cut short. A database
/// error midway cuts the body short (no final chunk): a client never takes a
/// partial export for a whole one.
#[utoipa::path(
    get,
    path = "/v1/parents/{parent_id}/results",
    tag = "children",
    params(("parent_id" = ParentId, Path, description = "Parent id"), ResultsQuery),
    responses(
        (status = 200, description = "One line per child (NDJSON), or a header and one record per child (CSV)",
            content(
                (ChildResult = "application/x-ndjson"),
                (String = "text/csv"),
            )),
        (status = 400, description = "Invalid id or query", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Unknown parent", body = Problem, content_type = "application/problem+json"),
        (status = 406, description = "`Accept` admits neither NDJSON nor CSV", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many results exports streaming in this process, or for this token (`Retry-After` says when to try again)", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn parent_results(
    State(state): State<AppState>,
    caller: Caller,
    Path(parent_id): Path<String>,
    AppQuery(query): AppQuery<ResultsQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let parent_id = parent_id_param(&parent_id)?;
    let format = Format::of(headers.get(header::ACCEPT))?;
    let gzip = wants_gzip(headers.get(header::ACCEPT_ENCODING));
    state.store.parent_exists(&parent_id).await?;
    let turn = caller.turn(&state, &state.exports).map_err(|refused| {
        ApiError::TooManyExports(match refused {
            NoTurn::Process(max) => format!("{max} results exports are already streaming here"),
            NoTurn::Token(share) => format!(
                "token {:?} already streams its share of results exports ({share}, --max-exports-per-token)",
                caller.0.name
            ),
        })
    })?;
    let turn = Arc::new(Mutex::new(Some(turn)));
    let asked = Arc::new(AtomicU64::new(0));
    let epoch = Instant::now();
    tokio::spawn(end_when_stalled(Arc::downgrade(&turn), Arc::clone(&asked), epoch));
    let export = Export {
        turn,
        asked,
        epoch,
        store: state.store.clone(),
        parent_id,
        state: query.state,
        format,
        after: None,
        rows: FIRST_ROWS,
        widest: 0,
        started: false,
        done: false,
        gzip: gzip.then(|| GzEncoder::new(Vec::new(), Compression::fast())),
    };
    let body = futures::stream::unfold(export, |mut export| async move {
        let piece = export.next().await?;
        Some((piece, export))
    });
    let mut response = Body::from_stream(body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(format.content_type()));
    headers.insert(header::VARY, HeaderValue::from_static("accept, accept-encoding"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if gzip {
        headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    response.extensions_mut().insert(super::etag::Streamed);
    Ok(response)
}

/// A parent at a glance: its counts by state (the parent's projection) and
/// its 20 most frequent failure and skip reasons, most frequent first.
#[utoipa::path(
    get,
    path = "/v1/parents/{parent_id}/summary",
    tag = "parents",
    params(("parent_id" = ParentId, Path, description = "Parent id")),
    responses(
        (status = 200, body = Summary),
        (status = 400, description = "Invalid id", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Unknown parent", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn parent_summary(State(state): State<AppState>, Path(parent_id): Path<String>) -> ApiResult<Json<Summary>> {
    let parent_id = parent_id_param(&parent_id)?;
    Ok(Json(state.store.summary(&parent_id).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(value: &str) -> ApiResult<Format> {
        Format::of(Some(&HeaderValue::from_str(value).unwrap()))
    }

    #[test]
    fn accept_picks_the_format() {
        assert_eq!(Format::of(None).unwrap(), Format::Ndjson);
        assert_eq!(accept("text/csv").unwrap(), Format::Csv);
        assert_eq!(accept("application/x-ndjson").unwrap(), Format::Ndjson);
        assert_eq!(accept("*/*").unwrap(), Format::Ndjson);
        assert_eq!(accept("text/html, text/csv;q=0.9").unwrap(), Format::Csv);
        assert_eq!(accept("text/csv;q=0, */*").unwrap(), Format::Ndjson);
        let refused = accept("application/xml").unwrap_err();
        assert_eq!(refused.status(), StatusCode::NOT_ACCEPTABLE);
    }

    #[test]
    fn gzip_only_when_asked() {
        let gz = |v: &str| wants_gzip(Some(&HeaderValue::from_str(v).unwrap()));
        assert!(!wants_gzip(None));
        assert!(gz("gzip"));
        assert!(gz("br, gzip;q=0.5"));
        assert!(gz("*"));
        assert!(!gz("gzip;q=0"));
        assert!(!gz("identity"));
    }
}
