//! Outbound HTTP from plugins: requests go only to the plugin's `allowed_hosts`, never to a
//! loopback, private or link-local address unless an allowed origin names that address itself,
//! with no redirects followed, within the run's budgets and time limit, each carrying an
//! `Idempotency-Key` derived from the task's occurrence and the request's place in the run.
//!
//! The address check is made on the address connected to: names are resolved by
//! [`PublicOnly`], which drops every address that is not public, so DNS cannot smuggle one in.
//! A URL naming an IP address is not resolved; it passes only when an allowed origin names it.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use super::addresses::is_public;

/// The largest response body a plugin gets (bytes).
pub const MAX_RESPONSE_BYTES: usize = 1 << 20;
/// Most origins in one plugin's allowed_hosts.
pub const MAX_ALLOWED_HOSTS: usize = 64;

/// The HTTP client every plugin's requests share.
pub struct Outbound {
    client: reqwest::Client,
    /// Requests one run may send.
    pub max_requests: usize,
}

impl Outbound {
    /// A client with rustls and the Web PKI roots, plus the certificates of `ca_file` (PEM) when
    /// given; no proxy, no redirects, names resolved to public addresses only.
    pub fn new(max_requests: usize, ca_file: Option<&Path>) -> Result<Outbound> {
        let mut b = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .dns_resolver(Arc::new(PublicOnly))
            .user_agent(concat!("eggtimer/", env!("CARGO_PKG_VERSION")))
            .pool_idle_timeout(std::time::Duration::from_secs(30));
        if let Some(path) = ca_file {
            let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .with_context(|| format!("{} holds no PEM certificate", path.display()))?;
            anyhow::ensure!(
                !certs.is_empty(),
                "{} holds no PEM certificate",
                path.display()
            );
            for c in certs {
                b = b.add_root_certificate(c);
            }
        }
        Ok(Outbound {
            client: b.build().context("building the HTTP client")?,
            max_requests,
        })
    }

    /// Sends one request checked by [`check`], until `deadline`; the response body is read up to
    /// [`MAX_RESPONSE_BYTES`].
    pub async fn send(&self, req: Checked, deadline: Instant) -> Result<Response, String> {
        let mut rb = self
            .client
            .request(req.method, req.url.clone())
            .body(req.body);
        for (k, v) in req.headers {
            rb = rb.header(k, v);
        }
        let fut = async {
            let mut resp = rb.send().await.map_err(|e| explain(&e))?;
            let status = resp.status().as_u16();
            let headers = resp
                .headers()
                .iter()
                .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into()))
                .collect();
            let mut body = Vec::new();
            while let Some(chunk) = resp.chunk().await.map_err(|e| explain(&e))? {
                if body.len() + chunk.len() > MAX_RESPONSE_BYTES {
                    return Err(format!(
                        "the response body from {} is larger than {MAX_RESPONSE_BYTES} bytes",
                        req.origin
                    ));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(Response {
                status,
                headers,
                body,
            })
        };
        match tokio::time::timeout_at(deadline.into(), fut).await {
            Ok(r) => r,
            Err(_) => Err(format!(
                "the request to {} did not finish within the run's time limit",
                req.origin
            )),
        }
    }
}

/// An answer.
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// A request that may go out.
pub struct Checked {
    pub method: reqwest::Method,
    pub url: url::Url,
    /// `scheme://host:port`, for messages and metrics.
    pub origin: String,
    pub host: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// Headers a plugin may not set: the host sets them from the URL and body.
const HOST_HEADERS: [&str; 8] = [
    "host",
    "connection",
    "content-length",
    "transfer-encoding",
    "te",
    "upgrade",
    "proxy-authorization",
    "proxy-connection",
];

/// Checks a plugin's request against its allowed origins: the method, the URL, the headers.
pub fn check(
    plugin: &str,
    allowed: &[String],
    method: &str,
    url: &str,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
) -> Result<Checked, String> {
    let method = match method.to_ascii_uppercase().as_str() {
        m @ ("GET" | "POST" | "PUT" | "PATCH" | "DELETE" | "HEAD" | "OPTIONS") => {
            reqwest::Method::from_bytes(m.as_bytes()).expect("a known method")
        }
        _ => return Err(format!("{method:?} is not a method the host sends")),
    };
    let parsed = url::Url::parse(url).map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!("{url:?}: only http and https URLs can be called"));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(format!(
            "{url:?}: a URL with a user name or password (put credentials in a header)"
        ));
    }
    let host = match parsed.host() {
        Some(url::Host::Domain(d)) => d.to_owned(),
        Some(url::Host::Ipv4(a)) => a.to_string(),
        Some(url::Host::Ipv6(a)) => format!("[{a}]"),
        None => return Err(format!("{url:?} has no host")),
    };
    let port = parsed.port_or_known_default().unwrap_or(0);
    let origin = format!("{}://{host}:{port}", parsed.scheme());
    if !allowed
        .iter()
        .any(|a| origin_matches(a, parsed.scheme(), &host, port))
    {
        return Err(format!(
            "{origin} is not in plugin {plugin:?}'s allowed_hosts ({}): an admin or developer adds it with PATCH /v1/plugins/{plugin} {{\"allowed_hosts\": [...]}}",
            if allowed.is_empty() {
                "none: the plugin may not call any".to_owned()
            } else {
                allowed.join(", ")
            }
        ));
    }
    for (k, v) in &headers {
        let lower = k.to_ascii_lowercase();
        if HOST_HEADERS.contains(&lower.as_str()) {
            return Err(format!(
                "the header {k:?} is set by the host, not the plugin"
            ));
        }
        if reqwest::header::HeaderName::from_bytes(k.as_bytes()).is_err()
            || reqwest::header::HeaderValue::from_str(v).is_err()
        {
            return Err(format!("{k:?}: {v:?} is not a valid HTTP header"));
        }
    }
    Ok(Checked {
        method,
        url: parsed,
        origin,
        host,
        headers,
        body,
    })
}

/// Whether allowed origin `pattern` (`scheme://host[:port]`, `*.` for subdomains) matches.
fn origin_matches(pattern: &str, scheme: &str, host: &str, port: u16) -> bool {
    let Some((p_scheme, rest)) = pattern.split_once("://") else {
        return false;
    };
    if p_scheme != scheme {
        return false;
    }
    let (p_host, p_port) = split_port(rest);
    let default = if scheme == "https" { 443 } else { 80 };
    if p_port.unwrap_or(default) != port {
        return false;
    }
    match p_host.strip_prefix("*.") {
        Some(parent) => {
            host.len() > parent.len() + 1
                && host.ends_with(parent)
                && host.as_bytes()[host.len() - parent.len() - 1] == b'.'
        }
        None => p_host.eq_ignore_ascii_case(host),
    }
}

/// `host[:port]` → (host, port); an IPv6 host keeps its brackets.
fn split_port(hp: &str) -> (&str, Option<u16>) {
    let colon = if hp.starts_with('[') {
        hp.find("]:").map(|i| i + 1)
    } else {
        hp.rfind(':')
    };
    match colon {
        Some(i) => match hp[i + 1..].parse() {
            Ok(p) => (&hp[..i], Some(p)),
            Err(_) => (hp, None),
        },
        None => (hp, None),
    }
}

/// Checks one allowed origin of a setting: `http(s)://host[:port]`, the host a name (maybe with a
/// leading `*.`) or an IP address, nothing after it. Returns it in lower case.
pub fn valid_origin(o: &str) -> Result<String, String> {
    let bad = |why: &str| {
        Err(format!(
            "allowed_hosts: {o:?} is not an origin ({why}); write scheme://host[:port], e.g. \
             https://api.example.com, https://*.example.com or http://127.0.0.1:9000"
        ))
    };
    let lower = o.to_ascii_lowercase();
    let Some((scheme, rest)) = lower.split_once("://") else {
        return bad("no scheme");
    };
    if !matches!(scheme, "http" | "https") {
        return bad("the scheme is not http or https");
    }
    if rest.is_empty() || rest.contains(['/', '?', '#', '@']) || o.len() > 268 {
        return bad("only scheme, host and port");
    }
    let (host, port) = split_port(rest);
    if rest.len() != host.len() && port.is_none() {
        return bad("the port is not a number from 0 to 65535");
    }
    let name = host.strip_prefix("*.").unwrap_or(host);
    let ok = if let Some(ip) = name.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        !host.starts_with('*') && ip.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        !name.is_empty()
            && name.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            })
    };
    if !ok {
        return bad("the host is not a name or an IP address");
    }
    Ok(lower)
}

/// The `Idempotency-Key` of the `index`-th request of the occurrence `occurrence` of task
/// `task`: the same on every attempt and rerun of that occurrence.
pub fn idempotency_key(task: &str, occurrence: i64, index: usize) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(b"http\n");
    h.update(task.as_bytes());
    h.update(b"\n");
    h.update(occurrence.to_string().as_bytes());
    h.update(b"\n");
    h.update(index.to_string().as_bytes());
    hex::encode(&h.finalize()[..16])
}

/// The resolver of plugins' requests: the system's, keeping public addresses only.
struct PublicOnly;

impl Resolve for PublicOnly {
    fn resolve(&self, name: Name) -> Resolving {
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let all: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let public: Vec<SocketAddr> =
                all.iter().copied().filter(|a| is_public(a.ip())).collect();
            if public.is_empty() {
                let shown: Vec<String> = all.iter().map(|a| a.ip().to_string()).collect();
                return Err(format!(
                    "{host} resolves to {} only: a loopback, private or link-local address is \
                     refused unless allowed_hosts names the address itself",
                    if shown.is_empty() {
                        "nothing".into()
                    } else {
                        shown.join(", ")
                    }
                )
                .into());
            }
            Ok(Box::new(public.into_iter()) as Addrs)
        })
    }
}

/// A reqwest error with its causes (the resolver's refusal is one of them).
fn explain(e: &reqwest::Error) -> String {
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The OpenAPI document's pattern of an allowed origin, and its `maxLength`.
    fn documented_origin() -> (String, usize) {
        use utoipa::PartialSchema;
        let s = serde_json::to_value(crate::api::doc::AllowedOrigin::schema()).unwrap();
        let pattern = s["pattern"].as_str().expect("a pattern").to_owned();
        (
            pattern,
            s["maxLength"].as_u64().expect("a maxLength") as usize,
        )
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        /// Every origin the document admits is one the server takes (a client generated from
        /// the document is never refused for a value it thinks valid).
        #[test]
        fn every_origin_the_document_admits_is_taken(o in {
            let (pattern, max) = documented_origin();
            let inner = pattern.trim_start_matches('^').trim_end_matches('$').to_owned();
            proptest::prelude::Strategy::prop_filter(
                proptest::string::string_regex(&inner).unwrap(),
                "maxLength",
                move |s| s.chars().count() <= max,
            )
        }) {
            proptest::prop_assert!(valid_origin(&o).is_ok(), "{o:?}: {:?}", valid_origin(&o));
        }
    }

    #[test]
    fn origins() {
        let allowed = [
            "https://api.example.com".to_owned(),
            "https://*.pay.example.com".to_owned(),
            "http://127.0.0.1:9000".to_owned(),
        ];
        let ok = |u: &str| check("p", &allowed, "POST", u, vec![], vec![]).is_ok();
        assert!(ok("https://api.example.com/v1/x?y=1"));
        assert!(ok("https://API.example.com:443/"));
        assert!(ok("https://a.pay.example.com/"));
        assert!(ok("https://a.b.pay.example.com/"));
        assert!(ok("http://127.0.0.1:9000/hook"));
        assert!(!ok("https://pay.example.com/"));
        assert!(!ok("https://xpay.example.com/"));
        assert!(!ok("http://api.example.com/"));
        assert!(!ok("https://api.example.com:8443/"));
        assert!(!ok("http://127.0.0.1:9001/"));
        assert!(!ok("http://127.0.0.1/"));
        assert!(!ok("https://user:pw@api.example.com/"));
        assert!(!ok("ftp://api.example.com/"));
        let e = check(
            "p",
            &allowed,
            "POST",
            "https://evil.example/",
            vec![],
            vec![],
        )
        .err()
        .unwrap();
        assert!(
            e.contains("https://evil.example:443 is not in plugin \"p\"'s allowed_hosts"),
            "{e}"
        );
        assert!(
            check(
                "p",
                &allowed,
                "POST",
                "http://127.0.0.1:9000/",
                vec![("Host".into(), "x".into())],
                vec![]
            )
            .is_err()
        );
    }

    #[test]
    fn allowed_origin_syntax() {
        assert_eq!(
            valid_origin("HTTPS://Api.Example.com").unwrap(),
            "https://api.example.com"
        );
        assert!(valid_origin("https://*.example.com").is_ok());
        assert!(valid_origin("http://127.0.0.1:9000").is_ok());
        assert!(valid_origin("http://[::1]:9000").is_ok());
        assert!(valid_origin("https://example.com/path").is_err());
        assert!(valid_origin("example.com").is_err());
        assert!(valid_origin("ftp://example.com").is_err());
        assert!(valid_origin("https://example.com:99999").is_err());
        assert!(valid_origin("https://exa mple.com").is_err());
        assert!(valid_origin("https://*").is_err());
    }

    #[test]
    fn keys_are_stable() {
        assert_eq!(idempotency_key("a", 1, 0), idempotency_key("a", 1, 0));
        assert_ne!(idempotency_key("a", 1, 0), idempotency_key("a", 1, 1));
        assert_ne!(idempotency_key("a", 1, 0), idempotency_key("a", 2, 0));
        assert_eq!(idempotency_key("a", 1, 0).len(), 32);
        // `eggtimer_sdk::testing::idempotency_key("order-1", 1_700_000_000_000, 0)`
        assert_eq!(
            idempotency_key("order-1", 1_700_000_000_000, 0),
            "639a89dd1912f80fb0a54ffc7bf232cb"
        );
    }
}
