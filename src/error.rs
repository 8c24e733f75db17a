//! The API's one error type, rendered as RFC 9457 problem+json with a stable
//! `type` per kind. Internal errors are logged once and never leaked.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::access::AuthFailure;
use crate::ledger::Child;
use crate::ledger::projection::SEAL_REPORT_LIMIT;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The body is not JSON at all.
    #[error("{detail}")]
    MalformedJson { detail: String },
    /// A body, query or path field has a wrong type or an invalid value.
    #[error("{field}: {detail}")]
    InvalidField {
        field: String,
        detail: String,
        status: StatusCode,
    },
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("request body is larger than {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error("the request line and headers are larger than {limit} bytes")]
    HeadTooLarge { limit: usize },
    #[error("{}", .0.explain())]
    Unauthenticated(AuthFailure),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("no route for {0}")]
    RouteNotFound(String),
    #[error("method {0} is not allowed here")]
    MethodNotAllowed(String),
    #[error("{0}")]
    RegistrationConflict(String),
    #[error("{detail}")]
    ChildrenConflict { detail: String, sequences: Vec<i64> },
    #[error("{0}")]
    DuplicateKey(String),
    #[error("parent {0} is decomposed: its ledger is the only source of truth and is not appended to")]
    ParentDecomposed(String),
    #[error("parent {0} is still decomposing: seal it before recording outcomes")]
    ParentDecomposing(String),
    #[error("parent {0} is not complete: only a complete parent can be deleted")]
    ParentNotComplete(String),
    #[error("seal with total {total} does not match the ledger")]
    SealMismatch {
        total: i64,
        missing: Vec<i64>,
        extra: Vec<i64>,
    },
    #[error("a different outcome ({}) already won for this child", .child.outcome.map(|o| o.as_str()).unwrap_or("?"))]
    OutcomeConflict { child: Box<Child> },
    #[error("{0}")]
    ClaimMismatch(String),
    #[error("child is {} and cannot be retried", .child.state)]
    RetryConflict { child: Box<Child> },
    #[error("the database is unavailable")]
    Unavailable(#[source] sqlx::Error),
    #[error(
        "{0} long-poll claims are already waiting here; retry after Retry-After seconds, or claim without wait_seconds"
    )]
    TooManyWaiting(usize),
    /// No turn for one more event stream: this process's, or the token's share.
    #[error("{0}; retry after Retry-After seconds, or poll")]
    TooManyStreams(String),
    /// No turn for one more results export: this process's, or the token's share.
    #[error("{0}; retry after Retry-After seconds")]
    TooManyExports(String),
    #[error("{0} did not finish within the request timeout")]
    TimedOut(String),
    /// The service is still reaching its database (or migrating it).
    #[error("the service is still connecting to its database; retry later")]
    Starting,
    /// The database cannot hold the ledger now, with why (on `/readyz`).
    #[error("the database is not ready: {0}")]
    NotReady(String),
    /// Any other error status from the HTTP layer, kept with its own text.
    #[error("{detail}")]
    Http { status: StatusCode, detail: String },
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

impl ApiError {
    pub fn invalid(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::InvalidField {
            field: field.into(),
            detail: detail.into(),
            status: StatusCode::UNPROCESSABLE_ENTITY,
        }
    }

    /// An invalid path parameter or query string: 400, naming the field.
    pub fn bad_request(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::InvalidField {
            field: field.into(),
            detail: detail.into(),
            status: StatusCode::BAD_REQUEST,
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::MalformedJson { .. } => StatusCode::BAD_REQUEST,
            Self::InvalidField { status, .. } => *status,
            Self::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::HeadTooLarge { .. } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Self::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::NotFound(_) | Self::RouteNotFound(_) => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            Self::RegistrationConflict(_)
            | Self::ChildrenConflict { .. }
            | Self::DuplicateKey(_)
            | Self::ParentDecomposed(_)
            | Self::ParentDecomposing(_)
            | Self::ParentNotComplete(_)
            | Self::SealMismatch { .. }
            | Self::OutcomeConflict { .. }
            | Self::ClaimMismatch(_)
            | Self::RetryConflict { .. } => StatusCode::CONFLICT,
            Self::Unavailable(_) | Self::TimedOut(_) | Self::Starting | Self::NotReady(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::TooManyWaiting(_) | Self::TooManyStreams(_) | Self::TooManyExports(_) => {
                StatusCode::TOO_MANY_REQUESTS
            }
            Self::Http { status, .. } => *status,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The stable last segment of the problem `type`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::MalformedJson { .. } => "malformed-json",
            Self::InvalidField { status, .. } if *status == StatusCode::BAD_REQUEST => "invalid-parameter",
            Self::InvalidField { .. } => "invalid-field",
            Self::UnsupportedMediaType(_) => "unsupported-media-type",
            Self::BodyTooLarge { .. } => "body-too-large",
            Self::HeadTooLarge { .. } => "head-too-large",
            Self::Unauthenticated(_) => "unauthenticated",
            Self::Forbidden(_) => "forbidden",
            Self::NotFound(_) => "not-found",
            Self::RouteNotFound(_) => "route-not-found",
            Self::MethodNotAllowed(_) => "method-not-allowed",
            Self::RegistrationConflict(_) => "registration-conflict",
            Self::ChildrenConflict { .. } => "children-conflict",
            Self::DuplicateKey(_) => "duplicate-key",
            Self::ParentDecomposed(_) => "parent-decomposed",
            Self::ParentDecomposing(_) => "parent-decomposing",
            Self::ParentNotComplete(_) => "parent-not-complete",
            Self::SealMismatch { .. } => "seal-mismatch",
            Self::OutcomeConflict { .. } => "outcome-conflict",
            Self::ClaimMismatch(_) => "claim-mismatch",
            Self::RetryConflict { .. } => "retry-conflict",
            Self::Unavailable(_) | Self::Starting | Self::NotReady(_) => "database-unavailable",
            Self::TimedOut(_) => "request-timeout",
            Self::TooManyWaiting(_) => "too-many-waiting-claims",
            Self::TooManyStreams(_) => "too-many-event-streams",
            Self::TooManyExports(_) => "too-many-streams",
            Self::Http { .. } => "http-error",
            Self::Internal(_) => "internal",
        }
    }

    fn title(&self) -> &'static str {
        match self {
            Self::MalformedJson { .. } => "Malformed JSON body",
            Self::InvalidField { .. } => "Invalid field",
            Self::UnsupportedMediaType(_) => "Unsupported media type",
            Self::BodyTooLarge { .. } => "Request body too large",
            Self::HeadTooLarge { .. } => "Request header fields too large",
            Self::Unauthenticated(_) => "Authentication required",
            Self::Forbidden(_) => "Forbidden",
            Self::NotFound(_) => "Not found",
            Self::RouteNotFound(_) => "No such route",
            Self::MethodNotAllowed(_) => "Method not allowed",
            Self::RegistrationConflict(_) => "Parent exists with different content",
            Self::ChildrenConflict { .. } => "Children conflict with the ledger",
            Self::DuplicateKey(_) => "Duplicate child key",
            Self::ParentDecomposed(_) => "Parent already decomposed",
            Self::ParentDecomposing(_) => "Parent still decomposing",
            Self::ParentNotComplete(_) => "Parent not complete",
            Self::SealMismatch { .. } => "Seal does not match the ledger",
            Self::OutcomeConflict { .. } => "A different outcome already won",
            Self::ClaimMismatch(_) => "Claim does not hold this child",
            Self::RetryConflict { .. } => "Child cannot be retried",
            Self::Unavailable(_) | Self::Starting | Self::NotReady(_) => "Database unavailable",
            Self::TimedOut(_) => "Request timed out",
            Self::TooManyWaiting(_) => "Too many waiting claims",
            Self::TooManyStreams(_) => "Too many event streams",
            Self::TooManyExports(_) => "Too many streams",
            Self::Http { status, .. } => status.canonical_reason().unwrap_or("Error"),
            Self::Internal(_) => "Internal error",
        }
    }

    pub fn problem(&self) -> Problem {
        let detail = match self {
            // Never leak internals: the log has them.
            Self::Internal(_) => "the server failed to handle this request; it has been logged".to_owned(),
            Self::Unavailable(_) => "the database did not answer; retry later".to_owned(),
            Self::SealMismatch { total, missing, extra } => format!(
                "seal with total {total} needs exactly sequences 0..{}: {} missing, {} extra (first {} of each listed)",
                total - 1,
                missing.len(),
                extra.len(),
                SEAL_REPORT_LIMIT
            ),
            Self::Http { detail, .. } if detail.is_empty() => self.title().to_owned(),
            other => other.to_string(),
        };
        let mut problem = Problem {
            r#type: format!("/problems/{}", self.kind()),
            title: self.title().to_owned(),
            status: self.status().as_u16(),
            detail,
            ..Problem::default()
        };
        match self {
            Self::InvalidField { field, .. } => problem.field = Some(field.clone()),
            Self::ChildrenConflict { sequences, .. } => problem.sequences = Some(sequences.clone()),
            Self::SealMismatch { missing, extra, .. } => {
                problem.missing = Some(missing.clone());
                problem.extra = Some(extra.clone());
            }
            Self::OutcomeConflict { child } | Self::RetryConflict { child } => problem.child = Some(child.clone()),
            _ => {}
        }
        problem
    }
}

/// An RFC 9457 problem document.
#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct Problem {
    /// Stable identifier of the kind of problem, e.g. `/problems/outcome-conflict`.
    #[schema(example = "/problems/invalid-field")]
    pub r#type: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// The request field at fault, as a path (`children[3].key`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// On an outcome or retry conflict: the child as it stands.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub child: Option<Box<Child>>,
    /// On a seal mismatch: the first missing sequences.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub missing: Option<Vec<i64>>,
    /// On a seal mismatch: the first sequences at or past `total`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extra: Option<Vec<i64>>,
    /// On an append conflict: the sequences whose stored content differs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sequences: Option<Vec<i64>>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match &self {
            Self::Internal(err) => tracing::error!(error = ?err, "request failed"),
            Self::Unavailable(err) => tracing::warn!(error = %err, "database unavailable"),
            _ => {}
        }
        let status = self.status();
        let body = serde_json::to_vec(&self.problem()).unwrap_or_default();
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::TOO_MANY_REQUESTS {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if let Self::Unauthenticated(failure) = self {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(failure.challenge()));
        }
        response
    }
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::ParentNotFound(parent_id) => Self::NotFound(format!("no parent {parent_id}")),
            StoreError::ChildNotFound { parent_id, sequence } => {
                Self::NotFound(format!("no child {sequence} in parent {parent_id}"))
            }
            StoreError::RegistrationConflict(parent_id) => Self::RegistrationConflict(format!(
                "parent {parent_id} is already registered with different content (queue, payload, settings or children)"
            )),
            StoreError::ChildrenConflict { parent_id, sequences } => Self::ChildrenConflict {
                detail: format!(
                    "{} sequence(s) already exist in parent {parent_id} with different content; nothing was written",
                    sequences.len()
                ),
                sequences,
            },
            StoreError::DuplicateKey(parent_id) => Self::DuplicateKey(format!(
                "a child key in this request is already used by another sequence of parent {parent_id}"
            )),
            StoreError::ParentDecomposed(parent_id) => Self::ParentDecomposed(parent_id.to_string()),
            StoreError::ParentNotComplete(parent_id) => Self::ParentNotComplete(parent_id.to_string()),
            StoreError::SealMismatch { total, missing, extra } => Self::SealMismatch { total, missing, extra },
            StoreError::RetryConflict { child } => Self::RetryConflict { child },
            StoreError::Unavailable(err) => Self::Unavailable(err),
            StoreError::NotReady(why) => Self::NotReady(why),
            StoreError::Db(err) => Self::Internal(anyhow::Error::new(err)),
        }
    }
}

impl ApiError {
    /// A key used twice within one request.
    pub fn duplicate_key_in_request(field: &str, key: &str, first: i64) -> Self {
        Self::DuplicateKey(format!(
            "{field}.key: key {key:?} is already used by sequence {first} in this request"
        ))
    }

    /// A sequence repeated within one append with different content.
    pub fn repeated_sequence_differs(field: &str, sequence: i64) -> Self {
        Self::ChildrenConflict {
            detail: format!("{field}: sequence {sequence} appears earlier in this request with different content"),
            sequences: vec![sequence],
        }
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_database_is_503_and_a_failed_query_500() {
        for lost in crate::store::lost_database_errors() {
            let err = ApiError::from(StoreError::from(lost));
            assert_eq!(err.status(), StatusCode::SERVICE_UNAVAILABLE, "{err:?}");
            assert_eq!(err.kind(), "database-unavailable");
            assert!(err.into_response().headers().contains_key(header::RETRY_AFTER));
        }
        let err = ApiError::from(StoreError::from(sqlx::Error::ColumnNotFound("total".to_owned())));
        assert_eq!(err.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
}
