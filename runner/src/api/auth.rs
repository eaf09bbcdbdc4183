//! Who is asking, what their role allows, and the audit of what they did.
//!
//! Every /v1 request passes `guard`: without `--token` it must name this runner (or localhost)
//! as its `Host`; a browser's cross-site request (an `Origin` that is not the runner's own) is
//! 403; the bearer is the runner's token (the admin), a key (`et_…`, looked up by its hash and
//! kept at most `KEY_CACHE` here, so a revoked key is refused by every runner within it) or
//! nothing when the runner has no token. The route's role is checked here; plugin scope is the
//! handlers' (they know which plugin a request concerns). Every change and every 401/403 is
//! appended to the audit.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{FromRequestParts, MatchedPath, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;
use tracing::warn;

use super::AppState;
use super::error::{ApiError, Concerns};
use crate::access::{Caller, KeyRecord, Role, secret_hash};
use crate::clock::now_ms;
use crate::store::{AuditEntry, Store};

/// How long a runner trusts what it read of a key (a revocation reaches every runner within it).
pub const KEY_CACHE: Duration = Duration::from_millis(500);
/// How often a key's `last_used_at` is written, at most, per runner.
const USED_EVERY: Duration = Duration::from_secs(1);
/// Most keys remembered; past it the cache starts over.
const CACHE_MAX: usize = 10_000;

/// The access rules of one runner.
pub struct Access {
    /// The admin key (`--token`); None: the API is open to requests that name this runner.
    pub token: Option<String>,
    /// The address the API listens on (`Host` must name it or localhost when there is no token).
    pub listen: Option<SocketAddr>,
    /// How long audit entries are kept (ms).
    pub audit_keep_ms: i64,
    /// The most audit entries kept.
    pub audit_max_len: u64,
    /// `/metrics` wants this bearer when set.
    pub metrics_token: Option<String>,
    store: Store,
    cache: Mutex<HashMap<String, (Instant, Option<KeyRecord>)>>,
    used: Mutex<HashMap<String, Instant>>,
}

impl Access {
    pub fn new(store: Store, token: Option<String>, listen: Option<SocketAddr>) -> Access {
        Access {
            token,
            listen,
            audit_keep_ms: 90 * 86_400_000,
            audit_max_len: 1_000_000,
            metrics_token: None,
            store,
            cache: Mutex::new(HashMap::new()),
            used: Mutex::new(HashMap::new()),
        }
    }

    /// The key with this secret, from the cache when it is fresh.
    async fn key(&self, secret: &str) -> Result<Option<KeyRecord>, ApiError> {
        let hash = secret_hash(secret);
        if let Some((at, k)) = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&hash)
            && at.elapsed() < KEY_CACHE
        {
            return Ok(k.clone());
        }
        let k = self.store.key_by_hash(&hash).await?;
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= CACHE_MAX {
            cache.clear();
        }
        cache.insert(hash, (Instant::now(), k.clone()));
        Ok(k)
    }

    /// Forgets every key read (after a revocation on this runner).
    pub fn forget_keys(&self) {
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Writes a key's `last_used_at`, at most once a `USED_EVERY` per key on this runner.
    fn touch(&self, id: &str) {
        {
            let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
            if used.get(id).is_some_and(|t| t.elapsed() < USED_EVERY) {
                return;
            }
            if used.len() >= CACHE_MAX {
                used.clear();
            }
            used.insert(id.to_owned(), Instant::now());
        }
        let (store, id) = (self.store.clone(), id.to_owned());
        tokio::spawn(async move {
            if let Err(e) = store.key_used(&id, now_ms()).await {
                warn!(key = %id, "recording a key's use: {e:#}");
            }
        });
    }

    /// Who sent these headers: Ok(caller) or the 401.
    async fn caller(&self, headers: &HeaderMap) -> Result<Caller, ApiError> {
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        let unauthorized = |why: &str| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                format!("{why}: send Authorization: Bearer <the runner's token or an API key>"),
            )
        };
        match (bearer, &self.token) {
            (Some(b), Some(t)) if bool::from(b.as_bytes().ct_eq(t.as_bytes())) => {
                Ok(Caller::admin())
            }
            (Some(b), _) if b.starts_with("et_") => match self.key(b).await? {
                Some(k) => {
                    self.touch(&k.id);
                    Ok(Caller::of_key(&k))
                }
                None => Err(unauthorized("unknown or revoked key")),
            },
            (_, None) => Ok(Caller::admin()),
            (Some(_), Some(_)) => Err(unauthorized("wrong bearer token")),
            (None, Some(_)) => Err(unauthorized("missing bearer token")),
        }
    }

    /// Without a token: 403 unless `Host` names this runner or localhost.
    fn host_refused(&self, headers: &HeaderMap) -> Option<String> {
        if self.token.is_some() {
            return None;
        }
        let host = headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let name = match host.rsplit_once(':') {
            Some((n, port)) if port.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => host,
        };
        let name = name.trim_start_matches('[').trim_end_matches(']');
        let ours = self.listen.map(|a| a.ip().to_string());
        let ok = name.is_empty()
            || name.eq_ignore_ascii_case("localhost")
            || name
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
            || ours.as_deref() == Some(name);
        (!ok).then(|| {
            format!(
                "Host {host:?} is not this runner's address: without --token the API answers only \
                 requests to its listen address or localhost (a page on another site can't reach it \
                 by DNS rebinding)"
            )
        })
    }
}

/// A browser's cross-site request: an `Origin` (or `Sec-Fetch-Site`) that is not this runner.
fn cross_site(headers: &HeaderMap) -> Option<String> {
    let get = |h: &str| headers.get(h).and_then(|v| v.to_str().ok());
    if get("sec-fetch-site").is_some_and(|s| s == "cross-site") {
        return Some("a cross-site browser request (Sec-Fetch-Site: cross-site)".into());
    }
    let origin = get("origin")?;
    let host = get("host").unwrap_or("");
    let own = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .is_some_and(|o| o.eq_ignore_ascii_case(host));
    (!own).then(|| format!("a cross-site browser request (Origin {origin:?})"))
}

/// The role a route needs.
fn needed(method: &Method, path: &str) -> Role {
    if path.starts_with("/v1/keys") {
        return Role::Admin;
    }
    if method == Method::GET {
        return Role::Reader;
    }
    let plugin_change = path == "/v1/plugins/{name}"
        || path == "/v1/plugins/{name}/rollback"
        || path.starts_with("/v1/plugins/{name}/secrets");
    if plugin_change {
        Role::Developer
    } else {
        Role::Operator
    }
}

/// The /v1 guard: Host and Origin, the caller, the route's role, then the audit.
pub async fn guard(State(st): State<AppState>, mut req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let access = &st.access;
    let refused = if let Some(why) = access.host_refused(req.headers()) {
        Err(ApiError::forbidden(why))
    } else if let Some(why) = cross_site(req.headers()) {
        Err(ApiError::forbidden(format!(
            "{why} is refused: the API takes no requests from other sites' pages"
        )))
    } else {
        access.caller(req.headers()).await
    };
    let caller = match refused {
        Ok(c) => c,
        Err(e) => {
            let res = e.into_response();
            let e = entry(None, &method, &path, &res);
            audit(&st, e).await;
            return res;
        }
    };
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or(path.clone(), |m| m.as_str().to_owned());
    let role = needed(&method, &route);
    if caller.role < role {
        let res = ApiError::forbidden(format!(
            "key {:?} has the {} role; {method} {route} needs {}",
            caller.name,
            caller.role.name(),
            role.name()
        ))
        .into_response();
        let e = entry(Some(&caller), &method, &path, &res);
        audit(&st, e).await;
        return res;
    }
    req.extensions_mut().insert(caller.clone());
    let res = next.run(req).await;
    let status = res.status();
    if method != Method::GET
        || status == StatusCode::UNAUTHORIZED
        || status == StatusCode::FORBIDDEN
    {
        let e = entry(Some(&caller), &method, &path, &res);
        audit(&st, e).await;
    }
    res
}

/// The audit entry of one request (read before any await: a `Response` is not `Sync`).
fn entry(caller: Option<&Caller>, method: &Method, path: &str, res: &Response) -> AuditEntry {
    let plugin = res
        .extensions()
        .get::<Concerns>()
        .map(|c| c.0.clone())
        .or_else(|| {
            let rest = path.strip_prefix("/v1/plugins/")?;
            Some(rest.split('/').next()?.to_owned())
        })
        .unwrap_or_default();
    let mut path = path.to_owned();
    path.truncate(path.floor_char_boundary(512));
    AuditEntry {
        id: String::new(),
        at: now_ms(),
        key: caller.map_or_else(String::new, |c| c.name.clone()),
        key_id: caller.map_or_else(String::new, |c| c.key_id.clone()),
        method: method.to_string(),
        path,
        plugin,
        status: res.status().as_u16(),
    }
}

/// Appends one request to the audit (a failure to is logged: the change itself is done).
async fn audit(st: &AppState, e: AuditEntry) {
    if let Err(err) = st
        .store
        .audit_add(&e, st.access.audit_keep_ms, st.access.audit_max_len)
        .await
    {
        warn!(method = %e.method, path = %e.path, status = e.status, "appending to the audit: {err:#}");
    }
}

/// The caller of a /v1 request, as `guard` found it.
impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Caller, ApiError> {
        parts.extensions.get::<Caller>().cloned().ok_or_else(|| {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "no caller")
        })
    }
}

/// 403 naming the plugin unless the caller's patterns cover it.
pub fn plugin_in_scope(caller: &Caller, plugin: &str) -> Result<(), ApiError> {
    match caller.refuses(plugin) {
        None => Ok(()),
        Some(why) => Err(ApiError::forbidden(why).concerning(plugin)),
    }
}

/// The plugins a bulk or owner-wide action of this caller may touch: None for every plugin (a
/// key that sees all, with no filter), else the filter (403 outside the scope) or every current
/// plugin in the key's scope.
pub async fn plugins_for(
    st: &AppState,
    caller: &Caller,
    filter: Option<String>,
) -> Result<Option<Vec<String>>, ApiError> {
    if let Some(p) = filter {
        plugin_in_scope(caller, &p)?;
        return Ok(Some(vec![p]));
    }
    if caller.sees_all() {
        return Ok(None);
    }
    Ok(Some(
        st.store
            .plugin_list()
            .await?
            .into_iter()
            .map(|e| e.name)
            .filter(|n| caller.sees(n))
            .collect(),
    ))
}
