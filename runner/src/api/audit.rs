//! The audit: `GET /v1/audit`, a page of the changes keys made (and, apart, their refusals),
//! newest first; an admin sees every entry, another key its own.

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::AppState;
use super::body::ApiResult;
use super::doc;
use super::error::ApiError;
use super::params::page_limit_of;
use crate::api::auth::Who;
use eggtimer_store::AuditEntry;

/// Which audit entries.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditParams {
    /// 1 to 1000 (default 100).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 1000)]
    limit: Option<String>,
    /// The `next_cursor` of the previous page.
    #[param(pattern = "^([0-9]{1,19}-[0-9]{1,19}r?)?$")]
    cursor: Option<String>,
    /// Only this key's entries (its name or id).
    key: Option<String>,
    /// Only entries concerning this plugin.
    plugin: Option<String>,
}

/// A page of the audit.
#[derive(Serialize, utoipa::ToSchema)]
pub struct AuditPage {
    /// Newest first.
    entries: Vec<AuditEntry>,
    /// Where the next page starts; null at the end.
    next_cursor: Option<String>,
}

/// Most entries one page reads through while its filters skip them.
const AUDIT_SCAN: usize = 10_000;

#[utoipa::path(get, path = "/v1/audit", tag = "keys", params(AuditParams),
    responses((status = 200, description = "a page of the audit, newest first: an admin sees every entry, another key its own",
        body = AuditPage), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn audit(
    State(st): State<AppState>,
    Who(caller): Who,
    Query(q): Query<AuditParams>,
) -> ApiResult<Response> {
    let limit = page_limit_of(q.limit.as_deref(), 100)?;
    let mut cursor = match q.cursor.as_deref().filter(|c| !c.is_empty()) {
        Some(c) if stream_id(c) => Some(c.to_owned()),
        Some(_) => return Err(ApiError::bad("cursor is not one this route returned")),
        None => None,
    };
    let wanted = |e: &AuditEntry| {
        (caller.is_admin() || e.key_id == caller.key_id)
            && q.key.as_ref().is_none_or(|k| *k == e.key || *k == e.key_id)
            && q.plugin.as_ref().is_none_or(|p| *p == e.plugin)
    };
    let (mut entries, mut scanned) = (Vec::new(), 0);
    loop {
        let page = st.store.audit_page(cursor.as_deref(), 500).await?;
        let end = page.len() < 500;
        for e in page {
            scanned += 1;
            cursor = Some(e.id.clone());
            if wanted(&e) {
                entries.push(e);
                if entries.len() == limit {
                    break;
                }
            }
        }
        if end && entries.len() < limit {
            cursor = None;
            break;
        }
        if entries.len() == limit || scanned >= AUDIT_SCAN {
            break;
        }
    }
    Ok(axum::Json(AuditPage {
        entries,
        next_cursor: cursor,
    })
    .into_response())
}

/// An audit entry's id: a Redis Stream entry id (`<ms>-<seq>`), `r` after it for a refusal.
fn stream_id(s: &str) -> bool {
    let s = s.strip_suffix('r').unwrap_or(s);
    s.split_once('-').is_some_and(|(a, b)| {
        (1..=19).contains(&a.len())
            && (1..=19).contains(&b.len())
            && a.bytes().chain(b.bytes()).all(|c| c.is_ascii_digit())
    })
}
