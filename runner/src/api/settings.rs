//! The body of `PATCH /v1/plugins/{name}`: a plugin's settings to change. A field given is
//! changed, `null` puts it back to its default, a field absent is left alone; each is bounded as
//! it is read, and what depends on the caller (the operator's caps, whose plugins a key covers)
//! is checked before anything is written.

use serde::Deserialize;
use serde::de::{Deserializer, Error};
use serde_json::Value;
use serde_json::value::RawValue;

use super::body::ApiResult;
use super::ceilings::{CeilingsBody, internal};
use super::doc::{AllowedOrigin, ConfigMap, PluginPattern};
use super::error::ApiError;
use super::fields::{
    MAX_CONCURRENCY, MAX_CONFIG_NAME, MAX_CONFIG_NAMES, MAX_CONFIG_VALUE, MAX_MEMORY_BYTES,
    MAX_PENDING, MAX_TIME_LIMIT_MS, MAX_WEIGHT, MIN_MEMORY_BYTES, RateLimitBody, Setting, given,
    ranged, rate,
};
use eggtimer_base::access::{Caller, MAX_PATTERNS, Role};
use eggtimer_base::names::{covers, valid_pattern};
use eggtimer_base::plugin_settings::{Ceilings, DEFAULT_MAX_PENDING, PluginSettings};

/// A plugin's settings to change (those given; none: nothing changes).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PluginPatch {
    /// At most this many runs at once across all runners; null: no limit.
    #[serde(default, deserialize_with = "ranged::<_, 1, MAX_CONCURRENCY>")]
    #[schema(value_type = Option<u32>, minimum = 1, maximum = 100000)]
    max_concurrency: Setting<i64>,
    /// At most this many runs of one owner's tasks at once across all runners (null: no limit).
    /// A task without an owner is not limited by it.
    #[serde(default, deserialize_with = "ranged::<_, 1, MAX_CONCURRENCY>")]
    #[schema(value_type = Option<u32>, minimum = 1, maximum = 100000)]
    max_concurrency_per_owner: Setting<i64>,
    /// At most `max` starts in any `per_ms` ms across all runners; runs over it wait (no
    /// attempt used) and start in the order they asked. Null: no limit.
    #[serde(default, deserialize_with = "given")]
    #[schema(value_type = Option<RateLimitBody>)]
    rate_limit: Setting<RateLimitBody>,
    /// At most `max` starts of one owner's tasks in any `per_ms` ms across all runners, as
    /// `rate_limit` spaces the plugin's (a task without an owner is not limited by it). Null: no
    /// limit.
    #[serde(default, deserialize_with = "given")]
    #[schema(value_type = Option<RateLimitBody>)]
    owner_rate_limit: Setting<RateLimitBody>,
    /// The plugin's share of workers when plugins compete, against the others' weights; null: 1.
    #[serde(default, deserialize_with = "ranged::<_, 1, MAX_WEIGHT>")]
    #[schema(value_type = Option<u32>, minimum = 1, maximum = 1000)]
    weight: Setting<i64>,
    /// Plugins whose tasks it may schedule and cancel besides its own; null or []: its own
    /// only. An admin, or a developer whose own patterns cover each one.
    #[serde(default, deserialize_with = "patterns")]
    #[schema(value_type = Option<Vec<PluginPattern>>, max_items = 100)]
    may_schedule: Setting<Vec<String>>,
    /// Its own time limit per run (ms); null: the runner's `--plugin-timeout`. Past the
    /// operator's cap (`--max-plugin-timeout`) only an admin may set it (else 400).
    #[serde(default, deserialize_with = "ranged::<_, 1, MAX_TIME_LIMIT_MS>")]
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 3600000)]
    time_limit_ms: Setting<i64>,
    /// Its own memory cap per instance, all its memories together (bytes); null: the runner's
    /// `--plugin-memory`. Past the operator's cap (`--max-plugin-memory`) only an admin may set
    /// it (else 400).
    #[serde(
        default,
        deserialize_with = "ranged::<_, MIN_MEMORY_BYTES, MAX_MEMORY_BYTES>"
    )]
    #[schema(value_type = Option<u64>, minimum = 1048576, maximum = 4294967296_u64)]
    memory_bytes: Setting<i64>,
    /// Its own time limit per call of its payload `check` (and `payload-schema`), ms, apart from
    /// its runs'; null: the runner's `--check-timeout`. Past the operator's cap
    /// (`--max-check-timeout`) only an admin may set it (else 400).
    #[serde(default, deserialize_with = "ranged::<_, 1, MAX_TIME_LIMIT_MS>")]
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 3600000)]
    check_time_limit_ms: Setting<i64>,
    /// At most this many of its tasks scheduled, running or dead (a retry of dead letters needs no
    /// room); past it, scheduling is 429 `quota_exceeded`,
    /// a run whose follow-ups would pass it fails its attempt, a firing is skipped. Null: the
    /// default, 1,000,000; past it only an admin may set it (else 400).
    #[serde(default, deserialize_with = "ranged::<_, 1, MAX_PENDING>")]
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 1000000000)]
    max_pending: Setting<i64>,
    /// At most this many of one owner's tasks scheduled, running or dead, across all runners (a
    /// task without an owner is not limited by it; a retry of dead letters needs no room); past
    /// it, scheduling that owner's tasks is 429 `owner_quota_exceeded`, a run whose follow-ups
    /// would pass it fails its attempt, a firing is skipped. Null: no limit but `max_pending`.
    #[serde(default, deserialize_with = "ranged::<_, 1, MAX_PENDING>")]
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 1000000000)]
    max_pending_per_owner: Setting<i64>,
    /// Origins it may send HTTP requests to, `scheme://host[:port]` with a leading `*.` for
    /// subdomains (`https://api.example.com`, `https://*.pay.example.com`,
    /// `http://127.0.0.1:9000`); null or []: none. A loopback, private or link-local address is
    /// reached only when an origin names the address itself.
    #[serde(default, deserialize_with = "origins")]
    #[schema(value_type = Option<Vec<AllowedOrigin>>, max_items = 64)]
    allowed_hosts: Setting<Vec<String>>,
    /// Strings it reads with `config(name)` (names of 1 to 128 bytes, values up to 4 KiB); null
    /// or {}: none. Replaces the whole map.
    #[serde(default, deserialize_with = "config")]
    #[schema(value_type = Option<ConfigMap>)]
    config: Setting<std::collections::BTreeMap<String, String>>,
    /// An admin's ceilings on the limits above: a developer key then sets each at or below its
    /// ceiling (never above, 403), and what applies is never above it. A field given sets its
    /// ceiling, null removes it, absent leaves it; null for the whole removes them all. Admin
    /// only.
    #[serde(default, deserialize_with = "given")]
    #[schema(value_type = Option<CeilingsBody>)]
    ceilings: Setting<CeilingsBody>,
}

/// The most weight a developer key may give a plugin without an admin's ceiling saying more.
pub const DEVELOPER_MAX_WEIGHT: i64 = 10;

/// The operator's caps a PATCH is checked against (`--max-plugin-timeout`, `--max-check-timeout`,
/// `--max-plugin-memory`), and the hosts a team may not point its plugin at (the runner's listen
/// address, Redis's).
pub struct Caps {
    pub time_limit_ms: u64,
    pub check_time_limit_ms: u64,
    pub memory_bytes: u64,
    pub internal_hosts: Vec<String>,
}

impl PluginPatch {
    /// The settings to write, by name, in a fixed order, once every field is allowed for this
    /// caller: past an operator's cap only an admin; above an admin's ceiling (in `cur`), a
    /// ceiling itself, a weight past `DEVELOPER_MAX_WEIGHT` or an origin that is not a public
    /// address only an admin; `may_schedule` only within the caller's own patterns unless it is
    /// an admin.
    pub fn changes(
        self,
        caller: &Caller,
        caps: Caps,
        cur: &PluginSettings,
    ) -> ApiResult<Vec<(&'static str, Value)>> {
        let admin = caller.role >= Role::Admin;
        let capped = |name: &str, v: Setting<i64>, (cap, flag): (u64, &str)| -> ApiResult<()> {
            match v.flatten() {
                Some(n) if n as u64 > cap && !admin => Err(ApiError::bad(format!(
                    "{name} {n} is past the operator's cap of {cap} ({flag}): only an admin can set more"
                ))),
                _ => Ok(()),
            }
        };
        capped(
            "time_limit_ms",
            self.time_limit_ms,
            (caps.time_limit_ms, "--max-plugin-timeout"),
        )?;
        capped(
            "check_time_limit_ms",
            self.check_time_limit_ms,
            (caps.check_time_limit_ms, "--max-check-timeout"),
        )?;
        capped(
            "memory_bytes",
            self.memory_bytes,
            (caps.memory_bytes, "--max-plugin-memory"),
        )?;
        capped(
            "max_pending",
            self.max_pending,
            (DEFAULT_MAX_PENDING, "the default"),
        )?;
        if !admin {
            self.within_ceilings(cur.ceilings.as_ref().unwrap_or(&Ceilings::default()))?;
            if self.ceilings.is_some() {
                return Err(ApiError::forbidden(format!(
                    "ceilings: key {:?} has the {} role; only an admin sets a plugin's ceilings",
                    caller.name,
                    caller.role.name()
                )));
            }
            if let Some(Some(hosts)) = &self.allowed_hosts
                && let Some(o) = hosts.iter().find(|o| internal(o, &caps.internal_hosts))
            {
                return Err(ApiError::forbidden(format!(
                    "allowed_hosts: {o} is not a public address (loopback, private, link-local, \
                     metadata, shared, an IPv4 address inside IPv6, this runner or its Redis): \
                     only an admin may let a plugin call it"
                )));
            }
        }
        if let Some(Some(list)) = &self.may_schedule {
            may_schedule_covered(caller, list)?;
        }
        let rate_limit = self.rate_limit.map(|r| r.map(rate));
        let owner_rate_limit = self.owner_rate_limit.map(|r| r.map(rate));
        // empty lists and maps are the default (cjson would also store an empty list as {})
        let may_schedule = self.may_schedule.map(|l| l.filter(|l| !l.is_empty()));
        let allowed_hosts = self.allowed_hosts.map(|l| l.filter(|l| !l.is_empty()));
        let config = self.config.map(|m| m.filter(|m| !m.is_empty()));
        let ceilings = self.ceilings.map(|c| {
            c.map(|c| c.apply(cur.ceilings.clone().unwrap_or_default()))
                .filter(|c| !c.is_empty())
        });
        let fields = [
            ("max_concurrency", self.max_concurrency.map(|v| json(&v))),
            (
                "max_concurrency_per_owner",
                self.max_concurrency_per_owner.map(|v| json(&v)),
            ),
            ("rate_limit", rate_limit.map(|v| json(&v))),
            ("owner_rate_limit", owner_rate_limit.map(|v| json(&v))),
            ("weight", self.weight.map(|v| json(&v))),
            ("may_schedule", may_schedule.map(|v| json(&v))),
            ("time_limit_ms", self.time_limit_ms.map(|v| json(&v))),
            ("memory_bytes", self.memory_bytes.map(|v| json(&v))),
            (
                "check_time_limit_ms",
                self.check_time_limit_ms.map(|v| json(&v)),
            ),
            ("max_pending", self.max_pending.map(|v| json(&v))),
            (
                "max_pending_per_owner",
                self.max_pending_per_owner.map(|v| json(&v)),
            ),
            ("allowed_hosts", allowed_hosts.map(|v| json(&v))),
            ("config", config.map(|v| json(&v))),
            ("ceilings", ceilings.map(|v| json(&v))),
        ];
        Ok(fields
            .into_iter()
            .filter_map(|(name, v)| Some((name, v?)))
            .collect())
    }

    /// 403 for a value a developer gives above its admin's ceiling (a weight: above
    /// `DEVELOPER_MAX_WEIGHT` without one). Null is always allowed: what applies stays under the
    /// ceiling (`PluginSettings::effective`).
    fn within_ceilings(&self, c: &Ceilings) -> ApiResult<()> {
        let above = |name: &str, v: &Setting<i64>, ceiling: Option<u64>| -> ApiResult<()> {
            match (v.flatten(), ceiling) {
                (Some(n), Some(c)) if n as u64 > c => Err(ApiError::forbidden(format!(
                    "{name} {n} is above the admin's ceiling of {c}: a team sets it at or below"
                ))),
                _ => Ok(()),
            }
        };
        above("max_pending", &self.max_pending, c.max_pending)?;
        above(
            "max_pending_per_owner",
            &self.max_pending_per_owner,
            c.max_pending_per_owner,
        )?;
        above(
            "max_concurrency",
            &self.max_concurrency,
            c.max_concurrency.map(u64::from),
        )?;
        above(
            "max_concurrency_per_owner",
            &self.max_concurrency_per_owner,
            c.max_concurrency_per_owner.map(u64::from),
        )?;
        above("time_limit_ms", &self.time_limit_ms, c.time_limit_ms)?;
        above("memory_bytes", &self.memory_bytes, c.memory_bytes)?;
        above(
            "check_time_limit_ms",
            &self.check_time_limit_ms,
            c.check_time_limit_ms,
        )?;
        above("weight", &self.weight, c.weight.map(u64::from))?;
        if let (Some(Some(w)), None) = (self.weight, c.weight)
            && w > DEVELOPER_MAX_WEIGHT
        {
            return Err(ApiError::forbidden(format!(
                "weight {w} is above {DEVELOPER_MAX_WEIGHT}, the most a team may give its plugin \
                 unless an admin's ceiling allows more"
            )));
        }
        for (name, asked, ceiling) in [
            ("rate_limit", &self.rate_limit, c.rate_limit),
            (
                "owner_rate_limit",
                &self.owner_rate_limit,
                c.owner_rate_limit,
            ),
        ] {
            let (Some(Some(r)), Some(c)) = (asked, ceiling) else {
                continue;
            };
            let asked = rate(RateLimitBody {
                max: r.max,
                per_ms: r.per_ms,
            });
            if !asked.within(&c) {
                return Err(ApiError::forbidden(format!(
                    "{name} {} per {} ms is above the admin's ceiling of {} per {} ms: a team \
                     sets it at or below (no more starts per second, no larger burst)",
                    asked.max, asked.per_ms, c.max, c.per_ms
                )));
            }
        }
        // a rate limit removed (null) is held at the ceiling by `effective`
        Ok(())
    }
}

fn json<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).expect("a setting serializes")
}

/// Each pattern of a `may_schedule` covered by the caller's own patterns, unless it is an admin.
fn may_schedule_covered(caller: &Caller, list: &[String]) -> ApiResult<()> {
    if caller.role >= Role::Admin {
        return Ok(());
    }
    match list.iter().find(|p| !covers(&caller.plugins, p)) {
        None => Ok(()),
        Some(p) => Err(ApiError::forbidden(format!(
            "may_schedule: key {:?} may not let a plugin schedule {p:?}: its own plugins ({}) do not cover it",
            caller.name,
            caller.plugins.join(", ")
        ))),
    }
}

/// A list of strings of at most `max`, or null; `what` says what the strings are.
fn list<'de, D: Deserializer<'de>>(
    d: D,
    max: usize,
    what: &str,
) -> Result<Setting<Vec<String>>, D::Error> {
    let Some(r) = Option::<&RawValue>::deserialize(d)? else {
        return Ok(Some(None));
    };
    let list: Vec<String> = serde_json::from_str(r.get())
        .map_err(|_| D::Error::custom(format!("must be a list of {what}, or null")))?;
    if list.len() > max {
        return Err(D::Error::custom(format!("lists at most {max} {what}")));
    }
    Ok(Some(Some(list)))
}

/// `may_schedule`: plugin patterns, or null.
fn patterns<'de, D: Deserializer<'de>>(d: D) -> Result<Setting<Vec<String>>, D::Error> {
    let list = list(d, MAX_PATTERNS, "plugin patterns (`order-*`, `pet-feed`)")?;
    if let Some(p) = list.iter().flatten().flatten().find(|p| !valid_pattern(p)) {
        return Err(D::Error::custom(format!(
            "{p:?} is not a pattern (a plugin name, a prefix ending in `*`, or `*`)"
        )));
    }
    Ok(list)
}

/// `allowed_hosts`: origins, each checked and kept in lower case, or null.
fn origins<'de, D: Deserializer<'de>>(d: D) -> Result<Setting<Vec<String>>, D::Error> {
    let max = crate::plugins::MAX_ALLOWED_HOSTS;
    match list(d, max, "origins (`https://api.example.com`)")? {
        Some(Some(list)) => list
            .iter()
            .map(|o| crate::plugins::valid_origin(o).map_err(D::Error::custom))
            .collect::<Result<Vec<String>, _>>()
            .map(|l| Some(Some(l))),
        other => Ok(other),
    }
}

/// `config`: names to strings, or null.
fn config<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Setting<std::collections::BTreeMap<String, String>>, D::Error> {
    let Some(r) = Option::<&RawValue>::deserialize(d)? else {
        return Ok(Some(None));
    };
    let map: std::collections::BTreeMap<String, String> = serde_json::from_str(r.get())
        .map_err(|_| D::Error::custom("must be an object of names to strings, or null"))?;
    if map.len() > MAX_CONFIG_NAMES {
        return Err(D::Error::custom(format!(
            "holds at most {MAX_CONFIG_NAMES} names"
        )));
    }
    for (k, v) in &map {
        if k.is_empty() || k.len() > MAX_CONFIG_NAME || k.chars().any(char::is_control) {
            return Err(D::Error::custom(format!(
                "{k:?} is not a name (1 to {MAX_CONFIG_NAME} bytes, no control characters)"
            )));
        }
        if v.len() > MAX_CONFIG_VALUE {
            return Err(D::Error::custom(format!(
                "the value of {k:?} is longer than {MAX_CONFIG_VALUE} bytes"
            )));
        }
    }
    Ok(Some(Some(map)))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::api::body;

    pub(in crate::api) fn patch(text: &str) -> ApiResult<PluginPatch> {
        let v: &RawValue = serde_json::from_str(text).unwrap();
        body::typed(v)
    }

    pub(in crate::api) fn developer() -> Caller {
        Caller {
            key_id: "k1".into(),
            name: "orders".into(),
            role: Role::Developer,
            plugins: vec!["order-*".into()],
            limits: Default::default(),
            topics: Default::default(),
        }
    }

    pub(in crate::api) const CAPS: Caps = Caps {
        time_limit_ms: 60_000,
        check_time_limit_ms: 10_000,
        memory_bytes: 512 << 20,
        internal_hosts: Vec::new(),
    };

    /// A plugin with no settings.
    pub(in crate::api) const NONE: PluginSettings = PluginSettings {
        paused: false,
        max_concurrency: None,
        weight: None,
        may_schedule: None,
        time_limit_ms: None,
        memory_bytes: None,
        check_time_limit_ms: None,
        max_concurrency_per_owner: None,
        rate_limit: None,
        owner_rate_limit: None,
        max_pending: None,
        max_pending_per_owner: None,
        allowed_hosts: None,
        config: None,
        ceilings: None,
    };

    #[test]
    fn a_field_absent_is_left_alone_and_null_is_its_default() {
        let p = patch(r#"{"weight": 3, "max_concurrency": null}"#).unwrap();
        let changes = p.changes(&Caller::admin(), CAPS, &NONE).unwrap();
        assert_eq!(
            changes,
            vec![
                ("max_concurrency", Value::Null),
                ("weight", serde_json::json!(3))
            ]
        );
        let p = patch(r#"{"may_schedule": [], "rate_limit": {"max": 5, "per_ms": 1000}}"#).unwrap();
        let changes = p.changes(&Caller::admin(), CAPS, &NONE).unwrap();
        assert_eq!(
            changes,
            vec![
                ("rate_limit", serde_json::json!({"max": 5, "per_ms": 1000})),
                ("may_schedule", Value::Null)
            ]
        );
    }

    #[test]
    fn errors_name_the_field_and_the_bound() {
        let msg = |text: &str| patch(text).err().map(|e| e.message).unwrap_or_default();
        assert_eq!(
            msg(r#"{"weight": 0}"#),
            "weight must be an integer from 1 to 1000, or null; got 0"
        );
        assert_eq!(
            msg(r#"{"rate_limit": {"max": 0, "per_ms": 1}}"#),
            "rate_limit.max must be an integer from 1 to 1000000; got 0"
        );
        assert_eq!(
            msg(r#"{"owner_rate_limit": {"max": 1, "per_ms": 0}}"#),
            "owner_rate_limit.per_ms must be an integer from 1 to 86400000; got 0"
        );
        assert_eq!(
            msg(r#"{"rate_limit": {"max": 1}}"#),
            "rate_limit: missing field `per_ms`"
        );
        assert!(msg(r#"{"colour": 1}"#).starts_with("unknown field `colour`"));
        assert_eq!(msg("[null, null]"), "the body must be a JSON object");
        assert_eq!(
            msg(r#"{"rate_limit": [5, 1000]}"#),
            "rate_limit must be a JSON object"
        );
        assert!(
            msg(r#"{"rate_limit": {"max": 1, "x": 1}}"#)
                .starts_with("rate_limit: unknown field `x`")
        );
        assert!(
            msg(r#"{"may_schedule": ["Bad"]}"#)
                .starts_with("may_schedule \"Bad\" is not a pattern")
        );
        assert!(
            msg(r#"{"allowed_hosts": "x"}"#).starts_with("allowed_hosts must be a list of origins")
        );
        assert!(msg(r#"{"config": {"": "v"}}"#).starts_with("config \"\" is not a name"));
    }

    #[test]
    fn past_a_cap_or_outside_its_own_patterns_only_an_admin() {
        let over = r#"{"time_limit_ms": 120000}"#;
        let e = patch(over)
            .unwrap()
            .changes(&developer(), CAPS, &NONE)
            .unwrap_err();
        assert!(e.message.contains("--max-plugin-timeout"), "{}", e.message);
        assert!(
            patch(over)
                .unwrap()
                .changes(&Caller::admin(), CAPS, &NONE)
                .is_ok()
        );
        let other = r#"{"may_schedule": ["pet-*"]}"#;
        let e = patch(other)
            .unwrap()
            .changes(&developer(), CAPS, &NONE)
            .unwrap_err();
        assert_eq!(e.status, 403);
        assert!(
            patch(r#"{"may_schedule": ["order-cancel"]}"#)
                .unwrap()
                .changes(&developer(), CAPS, &NONE)
                .is_ok()
        );
    }
}
