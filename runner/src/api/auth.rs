//! Who is asking, what their role allows, and the audit of what they did.
//!
//! Every request passes `site_guard`: without `--token` it must name this runner (or localhost)
//! as its `Host`; a browser's cross-site request (an `Origin` that is not the runner's own) is
//! 403. Every /v1 request then passes `guard`: the bearer is the runner's token (the admin), a
//! key (`et_…`, looked up by its hash and kept at most `KEY_CACHE` here, so a revoked key is
//! refused by every runner within it) or nothing when the runner has no token. The route's role
//! (`Roles`, declared where the route is registered) is checked here; plugin scope is the
//! handlers' (they know which plugin a request concerns). Every change and every 401/403 is
//! appended to the audit.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{FromRequestParts, MatchedPath, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;
use tracing::warn;
use utoipa::openapi::PathItem;
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouter};

use super::AppState;
use super::error::{ApiError, Concerns};
use eggtimer_base::access::{Caller, KeyRecord, Role, secret_hash};
use eggtimer_store::{AuditEntry, Store};

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
            if let Err(e) = store.key_used(&id, store.clock().now_ms()).await {
                warn!(key = %id, "recording a key's use: {e:#}");
            }
        });
    }

    /// Who sent these headers: Ok(caller) or the 401.
    async fn caller(&self, headers: &HeaderMap) -> Result<Caller, ApiError> {
        let bearer = bearer(headers);
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

    /// Why `/metrics` refuses these headers: it wants `--metrics-token` when that is set, else the
    /// admin's `--token` when that is set (a team's key is not enough: the metrics name every
    /// team's plugins and the hosts they call), else nothing.
    pub fn metrics_refused(&self, headers: &HeaderMap) -> Option<&'static str> {
        let wanted: Vec<&String> = self.metrics_token.iter().chain(&self.token).collect();
        if wanted.is_empty() {
            return None;
        }
        let given = bearer(headers).unwrap_or("");
        let ok = wanted
            .iter()
            .any(|t| bool::from(given.as_bytes().ct_eq(t.as_bytes())));
        (!ok).then_some(
            "/metrics wants a bearer token: the one given with --metrics-token, or the admin's --token",
        )
    }
}

/// The bearer of a request's `Authorization` header.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// A browser's cross-site request: an `Origin` (or `Sec-Fetch-Site`) that is not this runner.
/// A top-level navigation (a link to the dashboard followed from another site) is not one: it
/// reads nothing back into the other site's page and changes nothing.
fn cross_site(method: &Method, headers: &HeaderMap) -> Option<String> {
    let get = |h: &str| headers.get(h).and_then(|v| v.to_str().ok());
    if method == Method::GET && get("sec-fetch-mode") == Some("navigate") && get("origin").is_none()
    {
        return None;
    }
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

/// The role each /v1 route needs, declared where the route is registered (`api::v1_routes`):
/// the guard reads it by the route's method and matched path, and refuses a route that has none.
#[derive(Default)]
pub struct Roles(HashMap<(Method, String), Role>);

impl Roles {
    /// Registers `routes` on `router`, each of their methods needing `role`.
    pub fn add<S: Clone + Send + Sync + 'static>(
        &mut self,
        router: OpenApiRouter<S>,
        role: Role,
        routes: UtoipaMethodRouter<S>,
    ) -> OpenApiRouter<S> {
        for (path, item) in &routes.1.paths {
            for method in methods(item) {
                let old = self.0.insert((method.clone(), path.clone()), role);
                assert!(old.is_none(), "{method} {path} is given a role twice");
            }
        }
        router.routes(routes)
    }

    /// The role `method` on the route `path` (as registered) needs; HEAD is GET's.
    pub fn of(&self, method: &Method, path: &str) -> Option<Role> {
        let method = if method == Method::HEAD {
            Method::GET
        } else {
            method.clone()
        };
        self.0.get(&(method, path.to_owned())).copied()
    }

    /// Whether some method of the route `path` is registered.
    fn has_path(&self, path: &str) -> bool {
        self.0.keys().any(|(_, p)| p == path)
    }
}

/// The methods a documented path takes.
pub fn methods(item: &PathItem) -> Vec<Method> {
    [
        (Method::GET, &item.get),
        (Method::PUT, &item.put),
        (Method::POST, &item.post),
        (Method::DELETE, &item.delete),
        (Method::OPTIONS, &item.options),
        (Method::HEAD, &item.head),
        (Method::PATCH, &item.patch),
        (Method::TRACE, &item.trace),
    ]
    .into_iter()
    .filter_map(|(m, op)| op.as_ref().map(|_| m))
    .collect()
}

/// Every route's first check (the dashboard's files, /metrics and the probes as much as /v1):
/// without `--token` the `Host` must name this runner; a browser's cross-site request is 403.
/// A refusal is audited.
pub async fn site_guard(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let why = match st.access.host_refused(req.headers()) {
        Some(why) => why,
        None => match cross_site(req.method(), req.headers()) {
            Some(why) => {
                format!("{why} is refused: the API takes no requests from other sites' pages")
            }
            None => return next.run(req).await,
        },
    };
    let res = ApiError::forbidden(why).into_response();
    let e = entry(&st, None, &Said::of(&req, Vec::new()), &res);
    audit(&st, e).await;
    res
}

/// The /v1 guard, after `site_guard`: the caller, the route's role, then the audit.
pub async fn guard(
    State((st, roles)): State<(AppState, Arc<Roles>)>,
    req: Request,
    next: Next,
) -> Response {
    let (mut req, fields) = body_fields(req).await;
    let said = Said::of(&req, fields);
    let (method, path) = (said.method.clone(), said.path.clone());
    let caller = match st.access.caller(req.headers()).await {
        Ok(c) => c,
        Err(e) => {
            let res = e.into_response();
            let e = entry(&st, None, &said, &res);
            audit(&st, e).await;
            return res;
        }
    };
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or(path.clone(), |m| m.as_str().to_owned());
    // a route registered without a role is refused to everyone (and fails the routes' test)
    let refused = match roles.of(&method, &route) {
        // a method the route does not take: axum's 405, and nothing runs
        None if roles.has_path(&route) => {
            return ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                format!("{route} does not take {method}"),
            )
            .into_response();
        }
        None => Some(format!(
            "{method} {route} declares no role, so no key may use it"
        )),
        Some(role) if caller.role < role => Some(format!(
            "key {:?} has the {} role; {method} {route} needs {}",
            caller.name,
            caller.role.name(),
            role.name()
        )),
        Some(_) => None,
    };
    if let Some(why) = refused {
        let res = ApiError::forbidden(why).into_response();
        let e = entry(&st, Some(&caller), &said, &res);
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
        let e = entry(&st, Some(&caller), &said, &res);
        audit(&st, e).await;
    }
    res
}

/// What a request said, as the audit keeps it.
struct Said {
    method: Method,
    path: String,
    query: String,
    fields: Vec<String>,
}

impl Said {
    fn of(req: &Request, fields: Vec<String>) -> Said {
        let cut = |s: &str| s[..s.floor_char_boundary(512)].to_owned();
        Said {
            method: req.method().clone(),
            path: cut(req.uri().path()),
            query: cut(req.uri().query().unwrap_or("")),
            fields,
        }
    }
}

/// The most a body may be for the audit to name its fields (larger ones are passed on unread).
const FIELDS_BODY: usize = 64 << 10;

/// The names of the fields of a request's JSON object body (at most 64 of 64 bytes each), and
/// the request with the same body. Only a body that says it is JSON and at most `FIELDS_BODY`
/// bytes long is read: an upload, a large batch or a GET passes untouched.
async fn body_fields(req: Request) -> (Request, Vec<String>) {
    let headers = req.headers();
    let small = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
        .is_some_and(|n| n <= FIELDS_BODY);
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if req.method() == Method::GET || !small || !json {
        return (req, Vec::new());
    }
    let (parts, body) = req.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, FIELDS_BODY).await else {
        return (
            Request::from_parts(parts, axum::body::Body::empty()),
            Vec::new(),
        );
    };
    let fields = serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&bytes)
        .map(|m| {
            m.keys()
                .take(64)
                .map(|k| k[..k.floor_char_boundary(64)].to_owned())
                .collect()
        })
        .unwrap_or_default();
    (
        Request::from_parts(parts, axum::body::Body::from(bytes)),
        fields,
    )
}

/// The audit entry of one request (read before any await: a `Response` is not `Sync`).
fn entry(st: &AppState, caller: Option<&Caller>, said: &Said, res: &Response) -> AuditEntry {
    let plugin = res
        .extensions()
        .get::<Concerns>()
        .map(|c| c.0.clone())
        .or_else(|| {
            let rest = said.path.strip_prefix("/v1/plugins/")?;
            Some(rest.split('/').next()?.to_owned())
        })
        .or_else(|| {
            // a filter: `DELETE /v1/dead?plugin=...`
            let p = said
                .query
                .split('&')
                .find_map(|kv| kv.strip_prefix("plugin="))?;
            eggtimer_base::names::valid_plugin_name(p).then(|| p.to_owned())
        })
        .unwrap_or_default();
    AuditEntry {
        id: String::new(),
        at: st.store.clock().now_ms(),
        key: caller.map_or_else(String::new, |c| c.name.clone()),
        key_id: caller.map_or_else(String::new, |c| c.key_id.clone()),
        method: said.method.to_string(),
        path: said.path.clone(),
        query: said.query.clone(),
        fields: said.fields.clone(),
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

/// The caller of a /v1 request, as `guard` found it: a handler's argument `Who(caller): Who`.
/// (`Caller` is the ground floor's, so the extractor is this wrapper.)
pub struct Who(pub Caller);

impl<S: Send + Sync> FromRequestParts<S> for Who {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Who, ApiError> {
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .map(Who)
            .ok_or_else(|| {
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
