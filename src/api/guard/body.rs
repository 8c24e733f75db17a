//! What a request's body must be before a handler reads it: its size limit
//! (small but for the bulk routes), and declared JSON whenever a browser may
//! have sent it.

use axum::extract::Request;
use axum::http::{HeaderMap, Method, header};

use crate::error::{ApiError, ApiResult};

/// The body limit of every route but the bulk ones (`carries_bulk`).
pub const SMALL_BODY_BYTES: usize = 1024 * 1024;

/// The routes whose bodies may reach `--max-body-bytes`: registration, append
/// and outcome batches. Every other body is small.
pub(super) fn carries_bulk(method: &Method, route: &str) -> bool {
    matches!(
        (method.as_str(), route),
        ("PUT", "/v1/parents/{parent_id}") | ("POST", "/v1/parents/{parent_id}/children" | "/v1/outcomes")
    )
}

/// The body limit a request was given, for the 413 to name.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit(pub usize);

/// Stops reading a body past `limit` bytes: the extractor then answers 413
/// without having buffered more.
pub(super) fn limit_body(request: Request, limit: usize) -> Request {
    let (mut parts, body) = request.into_parts();
    parts.extensions.insert(BodyLimit(limit));
    Request::from_parts(parts, axum::body::Body::new(http_body_util::Limited::new(body, limit)))
}

/// Whether a write has no body, no content type and no `Origin`: then it
/// reads as `{}` (`curl -X POST .../pause`). A browser names the page's origin
/// on every POST it sends (the Fetch standard; a form, `fetch` in `no-cors`
/// mode and `sendBeacon` alike), so a cross-site page cannot make one of
/// these; with an `Origin`, even an empty write must say it is JSON.
pub(super) fn bodiless_from_no_browser(headers: &HeaderMap) -> bool {
    let no_body = match headers.get(header::CONTENT_LENGTH) {
        Some(length) => length.as_bytes() == b"0",
        None => !headers.contains_key(header::TRANSFER_ENCODING),
    };
    no_body && !headers.contains_key(header::CONTENT_TYPE) && !headers.contains_key(header::ORIGIN)
}

/// A write must be declared JSON, even with an empty body, when a browser may
/// have sent it: a browser sends a cross-site form or `fetch` without
/// preflight only as `application/x-www-form-urlencoded`,
/// `multipart/form-data` or `text/plain`, or with no body and no type.
pub(super) fn require_json(headers: &HeaderMap) -> ApiResult<()> {
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
    match content_type {
        Some(ct) if crate::api::extract::is_json(ct) => Ok(()),
        Some(ct) => Err(ApiError::UnsupportedMediaType(format!(
            "expected content-type application/json, got {ct:?}"
        ))),
        None => Err(ApiError::UnsupportedMediaType(
            "expected content-type application/json, got none (a body, or any write a browser sends, must say it is \
             JSON)"
                .to_owned(),
        )),
    }
}
