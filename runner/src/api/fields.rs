//! The fields a plugin's settings and ceilings are read from, each bounded as it is read: the
//! bounds themselves (which the document's schemas repeat, checked at compile time), what a
//! field given as `null` means, and a rate limit's body.

use serde::Deserialize;
use serde::de::{Deserializer, Error};
use serde_json::value::RawValue;

use eggtimer_base::plugin_settings::RateLimit;
use eggtimer_store::MAX_MAX_PENDING;

/// The largest weight a plugin may have (the smallest is 1, every plugin's default).
pub const MAX_WEIGHT: i64 = 1000;
/// The most runs at once a concurrency limit may allow.
pub(super) const MAX_CONCURRENCY: i64 = 100_000;
/// The most starts a rate limit may allow in its window, and the longest window (a day, ms).
pub const MAX_RATE: i64 = 1_000_000;
pub const MAX_RATE_WINDOW_MS: i64 = 86_400_000;
/// The longest time limit per run an admin may give a plugin (ms).
pub const MAX_TIME_LIMIT_MS: i64 = 3_600_000;
/// The smallest memory cap a plugin may have (bytes).
pub const MIN_MEMORY_BYTES: i64 = 1 << 20;
pub(super) const MAX_MEMORY_BYTES: i64 = crate::plugins::MAX_MEMORY_BYTES as i64;
pub(super) const MAX_PENDING: i64 = MAX_MAX_PENDING as i64;
/// The most names of a `config`, and the longest name and value (bytes).
pub(super) const MAX_CONFIG_NAMES: usize = 64;
pub(super) const MAX_CONFIG_NAME: usize = 128;
pub(super) const MAX_CONFIG_VALUE: usize = 4096;

/// What `Some(None)` means in each field: given as null, back to the default.
pub(super) type Setting<T> = Option<Option<T>>;

/// The rate limit a body asks for.
pub(super) fn rate(r: RateLimitBody) -> RateLimit {
    RateLimit {
        max: r.max as u32,
        per_ms: r.per_ms as u64,
    }
}

/// A rate limit: at most `max` starts in any `per_ms` ms.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RateLimitBody {
    #[serde(deserialize_with = "bounded::<_, 1, MAX_RATE>")]
    #[schema(value_type = u32, minimum = 1, maximum = 1000000)]
    pub(super) max: i64,
    #[serde(deserialize_with = "bounded::<_, 1, MAX_RATE_WINDOW_MS>")]
    #[schema(value_type = u64, minimum = 1, maximum = 86400000)]
    pub(super) per_ms: i64,
}

/// A nested object given: `Some(None)` for null, else its value.
pub(super) fn given<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Setting<T>, D::Error> {
    super::body::field::object(d).map(Some)
}

/// An integer from `LO` to `HI`.
fn bounded<'de, D: Deserializer<'de>, const LO: i64, const HI: i64>(d: D) -> Result<i64, D::Error> {
    let r = <&RawValue>::deserialize(d)?;
    super::body::integer(r.get())
        .filter(|n| (LO..=HI).contains(n))
        .ok_or_else(|| {
            D::Error::custom(format!(
                "must be an integer from {LO} to {HI}; got {}",
                super::body::short(r.get())
            ))
        })
}

/// A setting that is an integer from `LO` to `HI`, or null.
pub(super) fn ranged<'de, D: Deserializer<'de>, const LO: i64, const HI: i64>(
    d: D,
) -> Result<Setting<i64>, D::Error> {
    let Some(r) = Option::<&RawValue>::deserialize(d)? else {
        return Ok(Some(None));
    };
    super::body::integer(r.get())
        .filter(|n| (LO..=HI).contains(n))
        .map(|n| Some(Some(n)))
        .ok_or_else(|| {
            D::Error::custom(format!(
                "must be an integer from {LO} to {HI}, or null; got {}",
                super::body::short(r.get())
            ))
        })
}
