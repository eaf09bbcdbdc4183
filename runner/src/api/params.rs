//! What several routes take: task ids, owners and plugin filters in paths and queries, and pages.

use serde::Deserialize;

use super::body::ApiResult;
use super::error::ApiError;
use eggtimer_base::limits;
use eggtimer_base::names::{Owner, PluginName};

/// Most tasks of one page of an owner's tasks.
pub const MAX_PAGE: usize = 1000;

/// A task id (1–200 bytes, no control characters).
pub fn check_id(id: &str) -> ApiResult<()> {
    limits::id("the task id", id).map_err(Into::into)
}

/// An owner (the same limits as an id).
pub fn check_owner(owner: &str) -> ApiResult<()> {
    limits::id("the owner", owner).map_err(Into::into)
}

/// An owner a route's path names, as the task service takes it.
pub fn owner_named(owner: String) -> ApiResult<Owner> {
    Ok(Owner::new(owner)?)
}

/// A page: how many, and where the previous page ended.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageQuery {
    /// 1 to 1000.
    #[param(value_type = Option<u32>, minimum = 1, maximum = 1000)]
    limit: Option<String>,
    /// The `next_cursor` (or `X-Next-Cursor`) of the previous page, as it came; empty for the
    /// first page.
    #[param(pattern = "^([A-Za-z0-9_-]{54,1000})?$")]
    cursor: Option<String>,
}

/// A task id in the path.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub struct TaskId {
    /// 1 to 200 bytes without control characters.
    #[param(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]+$"
    )]
    id: String,
}

/// An owner in the path.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub struct OwnerName {
    /// 1 to 200 bytes without control characters.
    #[param(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]+$"
    )]
    owner: String,
}

/// An optional plugin filter.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PluginFilter {
    #[param(pattern = "^[a-z0-9][a-z0-9-]{0,63}$")]
    pub plugin: Option<String>,
}

/// A page size given as text: 1 to [`MAX_PAGE`], or `default` when absent.
pub fn page_limit_of(limit: Option<&str>, default: usize) -> ApiResult<usize> {
    match limit {
        None => Ok(default),
        Some(l) => match l.parse::<usize>() {
            Ok(n @ 1..=MAX_PAGE) => Ok(n),
            _ => Err(ApiError::bad(format!(
                "limit must be an integer from 1 to {MAX_PAGE}"
            ))),
        },
    }
}

/// The `limit` of a page query.
pub fn page_limit(q: &PageQuery, default: usize) -> ApiResult<usize> {
    page_limit_of(q.limit.as_deref(), default)
}

/// The place a page's cursor names (`<ms>:<id>` sealed for `route`), None for the first page.
pub async fn page_cursor(
    st: &super::AppState,
    route: &str,
    q: &PageQuery,
) -> ApiResult<Option<(i64, String)>> {
    match q.cursor.as_deref() {
        None | Some("") => Ok(None),
        Some(c) => {
            let c = &st.cursors.open(route, c).await?;
            let bad = || ApiError::bad("cursor is not one this API returned");
            let (t, id) = c.split_once(':').ok_or_else(bad)?;
            // a position, not a due time: any 1 to 15 digits
            if t.is_empty() || t.len() > 15 || !t.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            let t = t.parse::<i64>().map_err(|_| bad())?;
            limits::id("cursor", eggtimer_store::public_id(id)).map_err(|_| bad())?;
            Ok(Some((t, id.to_owned())))
        }
    }
}

/// The cursor of the place `(ms, id)` on `route`, sealed.
pub async fn page_place(
    st: &super::AppState,
    route: &str,
    place: Option<(i64, String)>,
) -> ApiResult<Option<String>> {
    match place {
        None => Ok(None),
        Some((t, id)) => Ok(Some(st.cursors.seal(route, &format!("{t}:{id}")).await?)),
    }
}

/// An optional plugin filter, checked.
pub fn plugin_filter(p: Option<String>) -> ApiResult<Option<PluginName>> {
    Ok(p.map(|p| PluginName::new("plugin", p)).transpose()?)
}
