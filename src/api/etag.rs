//! Cheap polling: every successful `GET` under `/v1` carries an `ETag` (a
//! digest of its body), and a request whose `If-None-Match` names the current
//! one is answered `304 Not Modified` with no body. A dashboard polling a
//! parent every second downloads it again only when it changed.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

/// The largest body given an `ETag`: `--max-response-bytes` is at most this
/// in practice; a larger one is passed on untouched.
const MAX_TAGGED_BYTES: usize = 64 * 1024 * 1024;

pub async fn etag(request: Request, next: Next) -> Response {
    let tagged = request.method() == Method::GET && request.uri().path().starts_with("/v1/");
    let if_none_match = request.headers().get(header::IF_NONE_MATCH).cloned();
    let response = next.run(request).await;
    if !tagged
        || response.status() != StatusCode::OK
        || is_event_stream(&response)
        || response.extensions().get::<Streamed>().is_some()
    {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_TAGGED_BYTES).await else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let tag = entity_tag(&bytes);
    let value = HeaderValue::from_str(&tag).expect("a hex digest in quotes is a header value");
    // Caches may keep it, but must ask again before using it.
    parts
        .headers
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if if_none_match.is_some_and(|sent| matches(&sent, &tag)) {
        let mut not_modified = Response::new(Body::empty());
        *not_modified.status_mut() = StatusCode::NOT_MODIFIED;
        let headers = not_modified.headers_mut();
        headers.insert(header::ETAG, value);
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        return not_modified;
    }
    parts.headers.insert(header::ETAG, value);
    Response::from_parts(parts, Body::from(bytes))
}

/// Marks a response whose body is streamed as it is read (a parent's
/// results): tagging it would hold the whole body in memory first.
#[derive(Debug, Clone, Copy)]
pub struct Streamed;

/// An event stream never ends by itself: it is passed on as it is, untagged.
fn is_event_stream(response: &Response) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|ct| ct.as_bytes().starts_with(b"text/event-stream"))
}

/// A strong entity tag for a body: the first 128 bits of its SHA-256, in hex.
fn entity_tag(body: &[u8]) -> String {
    let digest = Sha256::digest(body);
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("\"{hex}\"")
}

/// Whether an `If-None-Match` value names `tag`: `*`, or a comma-separated
/// list of entity tags compared weakly (a `W/` prefix is ignored), as RFC
/// 9110 section 13.1.2 asks.
fn matches(if_none_match: &HeaderValue, tag: &str) -> bool {
    let Ok(list) = if_none_match.to_str() else {
        return false;
    };
    list.split(',')
        .map(str::trim)
        .any(|candidate| candidate == "*" || candidate.strip_prefix("W/").unwrap_or(candidate) == tag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_is_quoted_hex_and_changes_with_the_body() {
        let tag = entity_tag(b"{\"a\":1}");
        assert_eq!(tag.len(), 34);
        assert!(tag.starts_with('"') && tag.ends_with('"'));
        assert_ne!(tag, entity_tag(b"{\"a\":2}"));
        assert_eq!(tag, entity_tag(b"{\"a\":1}"));
    }

    #[test]
    fn if_none_match_takes_lists_weak_tags_and_a_star() {
        let tag = entity_tag(b"x");
        let header = |v: &str| HeaderValue::from_str(v).unwrap();
        assert!(matches(&header(&tag), &tag));
        assert!(matches(&header(&format!("W/{tag}")), &tag));
        assert!(matches(&header(&format!("\"other\", {tag}")), &tag));
        assert!(matches(&header("*"), &tag));
        assert!(!matches(&header("\"other\""), &tag));
        assert!(!matches(&header(""), &tag));
    }
}
