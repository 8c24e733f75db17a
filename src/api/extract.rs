//! Extractors that answer bad input in our problem+json format, naming the
//! field at fault, instead of axum's plain-text rejections.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::ledger::{ParentId, QueueName};
use crate::state::AppState;

/// A JSON body. An empty body reads as `{}`, so endpoints whose fields are all
/// optional can be called without one.
pub struct AppJson<T>(pub T);

/// Bodies past this many bytes are decoded on a blocking thread: parsing a
/// 64 MiB registration takes a second of CPU, which must not stall the
/// async workers that answer everyone else (`/healthz` included).
const DECODE_INLINE_BYTES: usize = 1024 * 1024;

impl<T> FromRequest<AppState> for AppJson<T>
where
    T: DeserializeOwned + Send + 'static,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        decoded(req, state, |_: &mut T, _, _| Ok(())).await.map(AppJson)
    }
}

/// A body holding a list of children (a registration, an append), whose
/// children are built once the rest is decoded, no more of them than a
/// request may hold (`validate::ChildList::read`).
pub trait Bulk: DeserializeOwned + Send + 'static {
    /// Builds the children from `body`, the JSON text this was decoded from.
    fn read_children(&mut self, body: &[u8], max: usize) -> Result<(), ApiError>;
}

/// A `Bulk` body, read like `AppJson`'s: the whole of it on a blocking
/// thread when it is big.
pub struct BulkJson<T>(pub T);

impl<T: Bulk> FromRequest<AppState> for BulkJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        decoded(req, state, |body: &mut T, text, max| body.read_children(text, max))
            .await
            .map(BulkJson)
    }
}

/// A request's JSON body as `T`, then `finish`ed from the same text with the
/// most children a request may hold: inline when small, else on a blocking
/// thread.
async fn decoded<T>(
    req: Request,
    state: &AppState,
    finish: fn(&mut T, &[u8], usize) -> Result<(), ApiError>,
) -> Result<T, ApiError>
where
    T: DeserializeOwned + Send + 'static,
{
    let content_type = req
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body_limit = req.extensions().get::<super::guard::BodyLimit>().copied();
    let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
        if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::BodyTooLarge {
                limit: body_limit.map_or(state.limits.max_body_bytes, |l| l.0),
            }
        } else {
            ApiError::MalformedJson {
                detail: format!("could not read the request body: {rejection}"),
            }
        }
    })?;
    if !bytes.iter().all(u8::is_ascii_whitespace) {
        match content_type.as_deref() {
            Some(ct) if is_json(ct) => {}
            Some(ct) => {
                return Err(ApiError::UnsupportedMediaType(format!(
                    "expected content-type application/json, got {ct:?}"
                )));
            }
            None => {
                return Err(ApiError::UnsupportedMediaType(
                    "expected content-type application/json, got none".to_owned(),
                ));
            }
        }
    }
    let max_children = state.limits.max_children_per_request;
    let decode = move |bytes: &[u8]| {
        let mut body = decode::<T>(bytes)?;
        finish(&mut body, as_object(bytes), max_children)?;
        Ok(body)
    };
    if bytes.len() <= DECODE_INLINE_BYTES {
        return decode(&bytes);
    }
    tokio::task::spawn_blocking(move || decode(&bytes))
        .await
        .map_err(|err| ApiError::Internal(anyhow::anyhow!("decoding a request body: {err}")))?
}

/// The JSON text of a body: an empty one reads as `{}`.
fn as_object(bytes: &[u8]) -> &[u8] {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        bytes
    }
}

/// A request body as `T`: an empty body reads as `{}`; only a JSON object,
/// without U+0000.
fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let body = as_object(bytes);
    let value = parse_json(body)?;
    // Serde also reads a struct from a JSON array of its members in order;
    // the contract's bodies are objects, so nothing else is accepted.
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::invalid("body", "must be a JSON object"));
    }
    if has_nul_escape(body) {
        return Err(ApiError::invalid(
            nul_path(body),
            "strings may not contain U+0000 (`\\u0000`): neither store can keep it",
        ));
    }
    Ok(value)
}

/// Whether a JSON text has a `\u0000` escape inside a string (an escaped
/// backslash followed by `u0000` is not one). Raw NUL bytes are not valid JSON.
fn has_nul_escape(body: &[u8]) -> bool {
    let mut i = 0;
    while i < body.len() {
        if body[i] == b'\\' {
            if body[i + 1..].starts_with(b"u0000") {
                return true;
            }
            i += 2;
        } else {
            i += 1;
        }
    }
    false
}

/// The JSON path of the first string (value or member name) holding U+0000.
fn nul_path(body: &[u8]) -> String {
    fn walk(value: &serde_json::Value, path: &str) -> Option<String> {
        match value {
            serde_json::Value::String(s) if s.contains('\0') => Some(path.to_owned()),
            serde_json::Value::Array(items) => items
                .iter()
                .enumerate()
                .find_map(|(i, v)| walk(v, &format!("{path}[{i}]"))),
            serde_json::Value::Object(members) => members.iter().find_map(|(k, v)| {
                let here = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                if k.contains('\0') { Some(here) } else { walk(v, &here) }
            }),
            _ => None,
        }
    }
    serde_json::from_slice(body)
        .ok()
        .and_then(|v| walk(&v, ""))
        .map(|p| p.replace('\0', "\\u0000"))
        .unwrap_or_else(|| "body".to_owned())
}

pub(super) fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// Deserializes JSON, reporting the path of the field at fault.
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    // Read without tracking the path first: a body that reads is the usual
    // case, and tracking every member and element cost about a quarter of
    // the reading. Only a body that fails is read again, for the path.
    if let Ok(value) = serde_json::from_slice(body) {
        return Ok(value);
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|err| {
        let field = err.path().to_string();
        json_error(field, err.into_inner())
    })?;
    de.end().map_err(|err| ApiError::MalformedJson {
        detail: format!("the body is not valid JSON: {err}"),
    })?;
    Ok(value)
}

/// A body that does not read as JSON, or not as what the field at `path` holds.
pub(super) fn json_error(path: String, err: serde_json::Error) -> ApiError {
    match err.classify() {
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof => ApiError::MalformedJson {
            detail: format!("the body is not valid JSON: {err}"),
        },
        _ => {
            let detail = err.to_string();
            ApiError::invalid(body_field(path, &detail), detail)
        }
    }
}

/// The JSON path to name for a body error: the path to the value at fault,
/// extended by the member's own name when the member is unknown or missing.
fn body_field(path: String, detail: &str) -> String {
    let unknown = detail
        .strip_prefix("unknown field ")
        .or_else(|| detail.strip_prefix("missing field "))
        .and_then(parameter_in);
    match (path.as_str(), unknown) {
        (".", Some(member)) => member.to_owned(),
        (".", None) => "body".to_owned(),
        (_, Some(member)) if !path.ends_with(member) => format!("{path}.{member}"),
        _ => path,
    }
}

/// A query string, rejected with a 400 naming the parameter at fault.
pub struct AppQuery<T>(pub T);

impl<T, S> FromRequestParts<S> for AppQuery<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or("");
        let de = serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
        serde_path_to_error::deserialize(de).map(AppQuery).map_err(|err| {
            let field = err.path().to_string();
            let detail = err.into_inner().to_string();
            // A missing or unknown parameter is named in the message itself.
            let field = if field == "." {
                parameter_in(&detail).unwrap_or("query").to_owned()
            } else {
                field
            };
            ApiError::bad_request(field, detail)
        })
    }
}

/// The first backquoted name in a serde message ("unknown field `x`").
fn parameter_in(detail: &str) -> Option<&str> {
    let start = detail.find('`')? + 1;
    let len = detail[start..].find('`')?;
    Some(&detail[start..start + len])
}

pub fn parent_id_param(raw: &str) -> Result<ParentId, ApiError> {
    ParentId::parse(raw).map_err(|e| ApiError::bad_request("parent_id", e.to_string()))
}

/// A queue name from the path: 400 when it is not a name, 422 when it would
/// move a request elsewhere (only dots, or a `/`: no URL names it reliably).
pub fn queue_param(raw: &str) -> Result<QueueName, ApiError> {
    QueueName::parse(raw).map_err(|e| {
        if crate::ledger::ids::traverses(raw) {
            ApiError::invalid("queue", e.to_string())
        } else {
            ApiError::bad_request("queue", e.to_string())
        }
    })
}

pub fn sequence_param(raw: &str) -> Result<i64, ApiError> {
    match raw.parse::<i64>() {
        Ok(sequence) if sequence >= 0 => Ok(sequence),
        _ => Err(ApiError::bad_request(
            "sequence",
            format!("must be a non-negative integer, got {raw:?}"),
        )),
    }
}

pub fn claim_id_param(raw: &str) -> Result<uuid::Uuid, ApiError> {
    uuid::Uuid::parse_str(raw).map_err(|e| ApiError::bad_request("claim_id", format!("must be a uuid: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Body {
        children: Vec<Item>,
    }
    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Item {
        sequence: i64,
    }

    #[test]
    fn json_errors_name_the_field() {
        let err = parse_json::<Body>(br#"{"children": [{"sequence": 1}, {"sequence": "x"}]}"#).unwrap_err();
        match err {
            ApiError::InvalidField { field, .. } => assert_eq!(field, "children[1].sequence"),
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(
            parse_json::<Body>(b"{\"children\": ["),
            Err(ApiError::MalformedJson { .. })
        ));
        assert!(matches!(
            parse_json::<Body>(br#"{"children": []} {}"#),
            Err(ApiError::MalformedJson { .. })
        ));
    }

    #[test]
    fn path_parameters_are_validated() {
        assert!(sequence_param("12").is_ok());
        assert!(sequence_param("-1").is_err());
        assert!(sequence_param("x").is_err());
        assert!(claim_id_param("not-a-uuid").is_err());
        assert!(parent_id_param("bad id").is_err());
        assert!(queue_param("Bad").is_err());
    }

    #[test]
    fn parameter_names_are_found_in_messages() {
        assert_eq!(
            parameter_in("unknown field `limt`, expected one of `limit`"),
            Some("limt")
        );
        assert_eq!(parameter_in("no name here"), None);
    }
}
