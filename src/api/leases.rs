//! The lease operations fenced by `claim_id`: extend a claim's lease, give
//! its children back.

use axum::Json;
use axum::extract::{Path, State};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{AppJson, claim_id_param};
use super::guard::Caller;
use super::validate::in_range;
use super::whole;
use crate::error::{ApiError, ApiResult, Problem};
use crate::ledger::ParentId;
use crate::state::AppState;
use crate::store::ChildRef;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(extend_claim))
        .routes(routes!(release_claim))
}

/// Keep the claim's children leased for another `lease_seconds` from now.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"lease_seconds": 60}))]
pub struct ExtendClaim {
    /// New lease length from now, 1-86400 seconds (default 300).
    #[schema(minimum = 1, example = 300)]
    #[serde(default, deserialize_with = "whole::option")]
    lease_seconds: Option<i64>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Extended {
    /// Children whose lease was extended. 0 means this claim holds nothing any
    /// more (leases expired and were handed out again, or all are terminal):
    /// stop working on them.
    pub extended: u64,
    /// The new expiry; `null` when nothing was extended.
    pub lease_expires_at: Option<DateTime<Utc>>,
}

/// Extend the lease on every non-terminal child this claim still holds.
///
/// Call it well before `lease_expires_at` while work is still going on (e.g.
/// at a third of the lease). Children another claim has since taken, or that
/// are terminal, are not touched.
#[utoipa::path(
    post,
    path = "/v1/claims/{claim_id}/extend",
    tag = "claims",
    params(("claim_id" = Uuid, Path, description = "The claim's id")),
    request_body(content = ExtendClaim, description = "All fields optional: `{}` will do"),
    responses(
        (status = 200, body = Extended),
        (status = "4XX", description = "Invalid input", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn extend_claim(
    State(state): State<AppState>,
    caller: Caller,
    Path(claim_id): Path<String>,
    AppJson(body): AppJson<ExtendClaim>,
) -> ApiResult<Json<Extended>> {
    let claim_id = claim_id_param(&claim_id)?;
    let limits = &state.limits;
    let lease_seconds = in_range(
        "lease_seconds",
        body.lease_seconds.unwrap_or(limits.default_lease_seconds),
        1,
        limits.max_lease_seconds,
    )?;
    if !caller.reaches_claim(&state, claim_id).await? {
        return Ok(Json(Extended {
            extended: 0,
            lease_expires_at: None,
        }));
    }
    let (extended, lease_expires_at) = state.store.extend(claim_id, lease_seconds).await?;
    Ok(Json(Extended {
        extended,
        lease_expires_at,
    }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseChild {
    parent_id: ParentId,
    #[schema(minimum = 0)]
    #[serde(deserialize_with = "whole::required")]
    sequence: i64,
}

/// Give children back to the queue: all this claim holds, or the ones named.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"children": [{"parent_id": "P-42", "sequence": 2}], "delay_seconds": 0}))]
pub struct ReleaseClaim {
    /// The children to give back (1-1000); omit to release everything this claim holds.
    #[schema(min_items = 1)]
    children: Option<Vec<ReleaseChild>>,
    /// Keep the released children unclaimable this long (0-86400 s, default 0).
    #[schema(minimum = 0)]
    #[serde(default, deserialize_with = "whole::option")]
    delay_seconds: Option<i64>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Released {
    /// Children returned to `pending`.
    pub released: u64,
}

/// Give children back: they return to `pending`, and the next claimer sees
/// `previous_attempt: "released"`.
///
/// Only children this claim still holds are released.
#[utoipa::path(
    post,
    path = "/v1/claims/{claim_id}/release",
    tag = "claims",
    params(("claim_id" = Uuid, Path, description = "The claim's id")),
    request_body(content = ReleaseClaim, description = "All fields optional: `{}` will do"),
    responses(
        (status = 200, body = Released),
        (status = "4XX", description = "Invalid input", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn release_claim(
    State(state): State<AppState>,
    caller: Caller,
    Path(claim_id): Path<String>,
    AppJson(body): AppJson<ReleaseClaim>,
) -> ApiResult<Json<Released>> {
    let claim_id = claim_id_param(&claim_id)?;
    let delay_seconds = in_range(
        "delay_seconds",
        body.delay_seconds.unwrap_or(0),
        0,
        state.limits.max_lease_seconds,
    )?;
    let children = match body.children {
        None => None,
        Some(children) => {
            let max = state.limits.max_claim_limit as usize;
            if children.is_empty() || children.len() > max {
                return Err(ApiError::invalid(
                    "children",
                    format!("must name 1-{max} children, or be omitted"),
                ));
            }
            let mut refs = Vec::with_capacity(children.len());
            for (i, c) in children.into_iter().enumerate() {
                in_range(&format!("children[{i}].sequence"), c.sequence, 0, i64::MAX)?;
                refs.push(ChildRef {
                    parent_id: c.parent_id,
                    sequence: c.sequence,
                });
            }
            Some(refs)
        }
    };
    if !caller.reaches_claim(&state, claim_id).await? {
        return Ok(Json(Released { released: 0 }));
    }
    let released = state
        .store
        .release(claim_id, children.as_deref(), delay_seconds)
        .await?;
    Ok(Json(Released { released }))
}
