//! An admin's ceilings on a plugin's limits (the body of `ceilings` in
//! `PATCH /v1/plugins/{name}`), a key's ceilings on what its plugins hold together, and the
//! origins only an admin may let a plugin call.

use axum::http::StatusCode;
use serde::Deserialize;

use super::AppState;
use super::body::ApiResult;
use super::error::ApiError;
use super::fields::{
    MAX_CONCURRENCY, MAX_MEMORY_BYTES, MAX_PENDING, MAX_TIME_LIMIT_MS, MAX_WEIGHT,
    MIN_MEMORY_BYTES, RateLimitBody, Setting, given, ranged, rate,
};
use eggtimer_base::access::Caller;
use eggtimer_base::plugin_settings::{Ceilings, DEFAULT_MAX_PENDING};

/// An admin's ceilings on a plugin's limits (each field as in the settings).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CeilingsBody {
    #[serde(default, deserialize_with = "ranged::<_, 1, MAX_PENDING>")]
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 1000000000)]
    max_pending: Setting<i64>,
    #[serde(default, deserialize_with = "ranged::<_, 1, MAX_PENDING>")]
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 1000000000)]
    max_pending_per_owner: Setting<i64>,
    #[serde(default, deserialize_with = "ranged::<_, 1, MAX_CONCURRENCY>")]
    #[schema(value_type = Option<u32>, minimum = 1, maximum = 100000)]
    max_concurrency: Setting<i64>,
    #[serde(default, deserialize_with = "ranged::<_, 1, MAX_CONCURRENCY>")]
    #[schema(value_type = Option<u32>, minimum = 1, maximum = 100000)]
    max_concurrency_per_owner: Setting<i64>,
    #[serde(default, deserialize_with = "given")]
    #[schema(value_type = Option<RateLimitBody>)]
    rate_limit: Setting<RateLimitBody>,
    #[serde(default, deserialize_with = "given")]
    #[schema(value_type = Option<RateLimitBody>)]
    owner_rate_limit: Setting<RateLimitBody>,
    #[serde(default, deserialize_with = "ranged::<_, 1, MAX_WEIGHT>")]
    #[schema(value_type = Option<u32>, minimum = 1, maximum = 1000)]
    weight: Setting<i64>,
    #[serde(default, deserialize_with = "ranged::<_, 1, MAX_TIME_LIMIT_MS>")]
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 3600000)]
    time_limit_ms: Setting<i64>,
    #[serde(
        default,
        deserialize_with = "ranged::<_, MIN_MEMORY_BYTES, MAX_MEMORY_BYTES>"
    )]
    #[schema(value_type = Option<u64>, minimum = 1048576, maximum = 4294967296_u64)]
    memory_bytes: Setting<i64>,
    #[serde(default, deserialize_with = "ranged::<_, 1, MAX_TIME_LIMIT_MS>")]
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 3600000)]
    check_time_limit_ms: Setting<i64>,
}

impl CeilingsBody {
    /// `cur` with the ceilings given changed.
    pub(super) fn apply(self, mut cur: Ceilings) -> Ceilings {
        fn set<T>(to: &mut Option<T>, v: Option<Option<T>>) {
            if let Some(v) = v {
                *to = v;
            }
        }
        let n = |v: Setting<i64>| v.map(|v| v.map(|n| n as u64));
        let n32 = |v: Setting<i64>| v.map(|v| v.map(|n| n as u32));
        set(&mut cur.max_pending, n(self.max_pending));
        set(
            &mut cur.max_pending_per_owner,
            n(self.max_pending_per_owner),
        );
        set(&mut cur.max_concurrency, n32(self.max_concurrency));
        set(
            &mut cur.max_concurrency_per_owner,
            n32(self.max_concurrency_per_owner),
        );
        set(&mut cur.rate_limit, self.rate_limit.map(|r| r.map(rate)));
        set(
            &mut cur.owner_rate_limit,
            self.owner_rate_limit.map(|r| r.map(rate)),
        );
        set(&mut cur.weight, n32(self.weight));
        set(&mut cur.time_limit_ms, n(self.time_limit_ms));
        set(&mut cur.memory_bytes, n(self.memory_bytes));
        set(&mut cur.check_time_limit_ms, n(self.check_time_limit_ms));
        cur
    }
}

/// What the caller's own ceilings (its key's `max_plugins` and `max_pending`) let it upload as
/// the new plugin `name`: 403 `key_limit` when its patterns hold `max_plugins` plugins already,
/// or when its plugins' `max_pending` take all of its own; else the ceiling of `max_pending`
/// the new plugin gets: what is left, shared evenly among the plugins the key may still add
/// when it has a `max_plugins` (None: the key has no `max_pending`, or `name` exists and this
/// is a new version of it).
pub(super) async fn key_share(
    st: &AppState,
    caller: &Caller,
    name: &str,
) -> ApiResult<Option<u64>> {
    let limits = caller.limits;
    if limits.is_none() || st.store.plugin_current(name).await?.is_some() {
        return Ok(None);
    }
    let held: Vec<String> = st
        .store
        .plugin_names()
        .await?
        .into_iter()
        .filter(|n| n != name && caller.sees(n))
        .collect();
    let refuse = |why: String| ApiError::new(StatusCode::FORBIDDEN, "key_limit", why);
    if let Some(max) = limits.max_plugins
        && held.len() >= max as usize
    {
        return Err(refuse(format!(
            "key {:?} may hold {max} plugins (its max_plugins) and holds {}: delete one, or ask an admin for more",
            caller.name,
            held.len()
        )));
    }
    let Some(max) = limits.max_pending else {
        return Ok(None);
    };
    // each plugin the key holds is charged what it may hold (its ceiling), never what it is
    // set to now: a value lowered for a while and set back would lend the budget out twice
    let settings = st.store.plugin_settings_all().await?;
    let used: u64 = held
        .iter()
        .map(|n| {
            settings
                .get(n)
                .and_then(|s| s.ceilings.as_ref())
                .and_then(|c| c.max_pending)
                .unwrap_or(DEFAULT_MAX_PENDING)
        })
        .sum();
    let still = limits
        .max_plugins
        .map_or(1, |m| u64::from(m).saturating_sub(held.len() as u64).max(1));
    match max.saturating_sub(used) / still {
        0 => Err(refuse(format!(
            "key {:?}'s plugins may hold {max} tasks together (its max_pending), and the max_pending of the {} it holds add up to {used}: lower one, or ask an admin for more",
            caller.name,
            held.len()
        ))),
        left => Ok(Some(left.min(DEFAULT_MAX_PENDING))),
    }
}

/// A team key with a `max_pending` of its own that lowers a plugin's `max_pending` below the
/// plugin's ceiling gives the rest back to the key: the ceiling comes down with it (the change
/// to write, if any). The key's budget charges each plugin its ceiling (see [`key_share`]), so
/// what a plugin may be set back to is what the key lent it, never more.
pub(super) fn share_given_back(
    caller: &Caller,
    settings: &eggtimer_base::plugin_settings::PluginSettings,
    changes: &[(&'static str, serde_json::Value)],
) -> Option<(&'static str, serde_json::Value)> {
    caller.limits.max_pending?;
    let (_, v) = changes.iter().find(|(f, _)| *f == "max_pending")?;
    let lowered = v.as_u64()?;
    let mut ceilings = settings.ceilings.clone()?;
    if ceilings.max_pending? <= lowered {
        return None;
    }
    ceilings.max_pending = Some(lowered);
    Some((
        "ceilings",
        serde_json::to_value(&ceilings).expect("serializes"),
    ))
}

/// Gives the new plugin `name` its share of its key's `max_pending` as the ceiling of its own.
pub(super) async fn give_share(st: &AppState, name: &str, share: u64) -> ApiResult<()> {
    let mut ceilings = st
        .store
        .plugin_settings(name)
        .await?
        .ceilings
        .unwrap_or_default();
    ceilings.max_pending = Some(ceilings.max_pending.map_or(share, |c| c.min(share)));
    let value = serde_json::to_value(&ceilings).expect("serializes");
    st.store.set_setting(name, "ceilings", &value).await?;
    st.registry.sync_settings().await?;
    Ok(())
}

/// Whether an allowed origin reaches what is not a public address: an IP address in a
/// loopback, private, link-local, shared or reserved range (IPv4 inside IPv6 decoded),
/// `localhost`, or one of `also` (this runner's and Redis's hosts).
pub fn internal(origin: &str, also: &[String]) -> bool {
    let Ok(u) = url::Url::parse(origin.replace("://*.", "://wildcard.").as_str()) else {
        return true;
    };
    let named = |h: &str| also.iter().any(|a| a.eq_ignore_ascii_case(h));
    match u.host() {
        Some(url::Host::Ipv4(a)) => !crate::plugins::is_public(a.into()) || named(&a.to_string()),
        Some(url::Host::Ipv6(a)) => !crate::plugins::is_public(a.into()) || named(&a.to_string()),
        Some(url::Host::Domain(d)) => {
            let d = d.trim_end_matches('.');
            d == "localhost" || d.ends_with(".localhost") || named(d)
        }
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use super::super::settings::Caps;
    use super::super::settings::tests::{CAPS, NONE, developer, patch};
    use eggtimer_base::access::Caller;
    use eggtimer_base::plugin_settings::PluginSettings;

    #[test]
    fn a_developer_sets_values_under_the_admins_ceilings_and_never_the_ceilings() {
        let admin = patch(
            r#"{"ceilings": {"max_pending": 5, "max_concurrency": 1, "weight": 4,
                "rate_limit": {"max": 50, "per_ms": 1000}}}"#,
        )
        .unwrap()
        .changes(&Caller::admin(), CAPS, &NONE)
        .unwrap();
        let (field, ceilings) = &admin[0];
        assert_eq!(*field, "ceilings");
        let cur = PluginSettings {
            ceilings: Some(serde_json::from_value(ceilings.clone()).unwrap()),
            ..NONE
        };
        let refused = |text: &str| {
            patch(text)
                .unwrap()
                .changes(&developer(), CAPS, &cur)
                .map(|_| ())
                .unwrap_err()
        };
        for (text, says) in [
            (
                r#"{"max_pending": 6}"#,
                "max_pending 6 is above the admin's ceiling of 5",
            ),
            (
                r#"{"max_concurrency": 100000}"#,
                "max_concurrency 100000 is above",
            ),
            (
                r#"{"weight": 5}"#,
                "weight 5 is above the admin's ceiling of 4",
            ),
            (
                r#"{"rate_limit": {"max": 51, "per_ms": 1000}}"#,
                "rate_limit 51 per 1000 ms",
            ),
            (
                r#"{"rate_limit": {"max": 100, "per_ms": 1500}}"#,
                "is above the admin's ceiling",
            ),
            (
                r#"{"ceilings": null}"#,
                "only an admin sets a plugin's ceilings",
            ),
            (r#"{"ceilings": {"max_pending": 10}}"#, "only an admin"),
        ] {
            let e = refused(text);
            assert_eq!(e.status, 403, "{text}");
            assert!(e.message.contains(says), "{text}: {}", e.message);
        }
        // at or below is the team's to set, and null too: what applies stays under the ceiling
        for ok in [
            r#"{"max_pending": 5, "max_concurrency": 1, "weight": 2}"#,
            r#"{"rate_limit": {"max": 25, "per_ms": 1000}}"#,
            r#"{"max_pending": null, "max_concurrency": null, "rate_limit": null}"#,
        ] {
            assert!(
                patch(ok).unwrap().changes(&developer(), CAPS, &cur).is_ok(),
                "{ok}"
            );
        }
        let applied = PluginSettings {
            max_concurrency: None,
            rate_limit: None,
            max_pending: None,
            weight: Some(9),
            ..cur.clone()
        }
        .effective(5_000, 64 << 20, 1_000);
        assert_eq!(applied.max_pending, Some(5));
        assert_eq!(applied.max_concurrency, Some(1));
        assert_eq!(applied.weight, Some(4));
        assert_eq!(
            applied.rate_limit.map(|r| (r.max, r.per_ms)),
            Some((50, 1000))
        );
        // without a ceiling a developer's weight stops at DEVELOPER_MAX_WEIGHT
        let e = patch(r#"{"weight": 1000}"#)
            .unwrap()
            .changes(&developer(), CAPS, &NONE)
            .unwrap_err();
        assert!(e.message.contains("weight 1000 is above"), "{}", e.message);
        assert!(
            patch(r#"{"weight": 1000}"#)
                .unwrap()
                .changes(&Caller::admin(), CAPS, &NONE)
                .is_ok()
        );
    }

    #[test]
    fn only_an_admin_lets_a_plugin_call_what_is_not_a_public_address() {
        let caps = || Caps {
            internal_hosts: vec!["127.0.0.1".into(), "redis.internal".into()],
            ..CAPS
        };
        for o in [
            "http://169.254.169.254",
            "http://10.0.0.1",
            "http://127.0.0.1:7000",
            "http://localhost:9000",
            "http://api.localhost",
            "http://[::1]:8080",
            "http://[::ffff:10.0.0.1]",
            "http://[64:ff9b::a9fe:a9fe]",
            "http://[2002:7f00:1::]",
            "http://100.64.1.1",
            "http://2130706433",
            "http://0x7f.1",
            "http://redis.internal:6379",
        ] {
            let text = format!(r#"{{"allowed_hosts": ["https://api.example.com", "{o}"]}}"#);
            let e = patch(&text)
                .unwrap()
                .changes(&developer(), caps(), &NONE)
                .unwrap_err();
            assert_eq!(e.status, 403, "{o}");
            assert!(
                e.message.contains("not a public address"),
                "{o}: {}",
                e.message
            );
            assert!(
                patch(&text)
                    .unwrap()
                    .changes(&Caller::admin(), caps(), &NONE)
                    .is_ok(),
                "{o}"
            );
        }
        for o in [
            "https://api.example.com",
            "https://*.pay.example.com",
            "http://93.184.216.34:8080",
        ] {
            let text = format!(r#"{{"allowed_hosts": ["{o}"]}}"#);
            assert!(
                patch(&text)
                    .unwrap()
                    .changes(&developer(), caps(), &NONE)
                    .is_ok(),
                "{o}"
            );
        }
    }
}
