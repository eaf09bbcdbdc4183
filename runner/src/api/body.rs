//! Reading request bodies: content type, size, then JSON into the body's type, each field through
//! a `field` reader that bounds it, so an error names the field by its path (`[3].plugin`). A
//! batch is capped as it is read and payloads stay borrowed raw JSON (never built into a tree).
//! Bodies not yet typed are read as objects of raw fields (`object`, `int`).

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, header};
use serde::Deserialize;
use serde::de::{self, DeserializeSeed, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::error::ApiError;

pub type ApiResult<T> = Result<T, ApiError>;

/// 415 unless the request says `want`.
pub fn require_content_type(headers: &HeaderMap, want: &str) -> ApiResult<()> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let essence = ct.split(';').next().unwrap_or("").trim();
    if essence.eq_ignore_ascii_case(want) {
        Ok(())
    } else {
        Err(ApiError::unsupported(format!(
            "expected Content-Type: {want}, got {ct:?}"
        )))
    }
}

/// The body's bytes; 413 over `limit`.
pub async fn read(body: Body, limit: usize) -> ApiResult<Bytes> {
    axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| ApiError::too_large(format!("the body is larger than {limit} bytes")))
}

/// A JSON body as a borrowed raw value (checked to be JSON, not built into a tree).
pub fn raw(bytes: &[u8]) -> ApiResult<&RawValue> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad(format!("the body is not valid JSON: {e}")))
}

/// Whether a raw JSON value is an array (without parsing it).
pub fn is_array(v: &RawValue) -> bool {
    v.get().trim_start().starts_with('[')
}

/// A body read into its type; an error names where it is (`run_at`, `[3].plugin`).
pub fn typed<'a, T: Deserialize<'a>>(v: &'a RawValue) -> ApiResult<T> {
    let mut d = serde_json::Deserializer::from_str(v.get());
    serde_path_to_error::deserialize(&mut d).map_err(named)
}

/// A JSON array read into its element type, refusing (413) more than `max` as soon as it sees
/// one more; an error names the element and field (`[3].plugin`).
pub fn typed_array<'a, T: Deserialize<'a>>(
    v: &'a RawValue,
    max: usize,
    what: &str,
) -> ApiResult<Vec<T>> {
    struct Capped<T>(usize, std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>> DeserializeSeed<'de> for Capped<T> {
        type Value = Vec<T>;
        fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_seq(self)
        }
    }
    impl<'de, T: Deserialize<'de>> Visitor<'de> for Capped<T> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "an array of at most {} elements", self.0)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(self.0));
            while let Some(e) = seq.next_element::<T>()? {
                if out.len() == self.0 {
                    return Err(de::Error::custom(format!("more than {} elements", self.0)));
                }
                out.push(e);
            }
            Ok(out)
        }
    }
    let mut d = serde_json::Deserializer::from_str(v.get());
    let mut track = serde_path_to_error::Track::new();
    Capped(max, std::marker::PhantomData)
        .deserialize(serde_path_to_error::Deserializer::new(&mut d, &mut track))
        .map_err(|e| {
            let e = named(serde_path_to_error::Error::new(track.path(), e));
            if e.message.starts_with("more than") {
                ApiError::too_large(format!("{what}: {}", e.message))
            } else {
                e
            }
        })
}

/// A typed read's error as a 400 naming where it is: `run_at must be …` for a field,
/// `[3]: unknown field …` for an element, the message alone for the body.
fn named(e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    use serde_path_to_error::Segment;
    let mut segments: Vec<&Segment> = e.path().iter().collect();
    let inner = e.inner().to_string();
    // serde_json ends each message with where it is in the text; the path says it better
    let msg = inner
        .rsplit_once(" at line ")
        .map_or(inner.as_str(), |(m, _)| m);
    if msg.starts_with("unknown field") {
        segments.pop(); // the message names the field; the path is of the object that has none
    }
    let mut path = String::new();
    for s in &segments {
        match s {
            Segment::Seq { index } => path.push_str(&format!("[{index}]")),
            Segment::Map { key } if path.is_empty() => path.push_str(key),
            Segment::Map { key } => path.push_str(&format!(".{key}")),
            Segment::Enum { .. } | Segment::Unknown => {}
        }
    }
    ApiError::bad(match segments.last() {
        None => msg.to_owned(),
        Some(Segment::Seq { .. }) => format!("{path}: {msg}"),
        Some(_) => format!("{path} {msg}"),
    })
}

/// `deserialize_with` readers of a typed body's fields: each refuses a value out of its bounds
/// with a message that the body's reader prefixes with the field's path. `null` is absent.
pub mod field {
    use serde::Deserialize;
    use serde::de::{Deserializer, Error};
    use serde_json::value::RawValue;

    use crate::limits;

    fn raw<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
        Option::<&'de RawValue>::deserialize(d)
    }

    /// Any integer that fits i64.
    pub fn int<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
        let Some(r) = raw(d)? else { return Ok(None) };
        super::integer(r.get()).map(Some).ok_or_else(|| {
            D::Error::custom(format!(
                "must be an integer (ms) from {} to {}, got {}",
                i64::MIN,
                i64::MAX,
                super::short(r.get())
            ))
        })
    }

    /// A time, within [0, MAX_TIME_MS].
    pub fn time<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
        int(d)?
            .map(|t| limits::time("", t).map_err(|e| D::Error::custom(e.0.trim_start())))
            .transpose()
    }

    /// A non-negative duration, within [0, MAX_DURATION_MS].
    pub fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
        int(d)?
            .map(|t| limits::duration("", t).map_err(|e| D::Error::custom(e.0.trim_start())))
            .transpose()
    }

    /// A number of attempts: 1 to MAX_ATTEMPTS.
    pub fn max_attempts<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
        match int(d) {
            Ok(None) => Ok(None),
            Ok(Some(n)) if (1..=limits::MAX_ATTEMPTS as i64).contains(&n) => Ok(Some(n as u32)),
            _ => Err(D::Error::custom(format!(
                "must be an integer from 1 to {}",
                limits::MAX_ATTEMPTS
            ))),
        }
    }

    /// A shift, negative or not: within ±MAX_DURATION_MS.
    pub fn shift<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
        int(d)?
            .map(|t| limits::shift("", t).map_err(|e| D::Error::custom(e.0.trim_start())))
            .transpose()
    }

    /// A string.
    pub fn string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        match raw(d)? {
            None => Ok(None),
            Some(r) => serde_json::from_str(r.get())
                .map(Some)
                .map_err(|_| D::Error::custom("must be a string")),
        }
    }

    /// An id or an owner: 1 to MAX_ID_BYTES bytes without control characters.
    pub fn id<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        let s = string(d)?;
        if let Some(s) = &s {
            limits::id("", s).map_err(|e| D::Error::custom(e.0.trim_start()))?;
        }
        Ok(s)
    }

    /// A plugin's name.
    pub fn plugin<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        let s = string(d)?;
        match &s {
            Some(name) if !crate::plugins::valid_plugin_name(name) => Err(D::Error::custom(
                format!("{name:?} is not a plugin name ([a-z0-9][a-z0-9-]{{0,63}})"),
            )),
            _ => Ok(s),
        }
    }

    /// A W3C traceparent: given (`Some`), it is `Some(None)` for one of zeros (no trace).
    pub fn traceparent<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Option<String>>, D::Error> {
        string(d)?
            .map(|tp| crate::trace::parse_traceparent(&tp).map_err(D::Error::custom))
            .transpose()
    }
}

/// A JSON object whose fields are kept raw; unknown fields are refused naming the field.
pub fn object<'a, T: Deserialize<'a>>(v: &'a RawValue, at: &str, what: &str) -> ApiResult<T> {
    if !v.get().trim_start().starts_with('{') {
        return Err(ApiError::bad(format!("{at}{what} must be a JSON object")));
    }
    serde_json::from_str(v.get()).map_err(|e| {
        let msg = e.to_string();
        let msg = msg.split(" at line ").next().unwrap_or(&msg);
        ApiError::bad(format!("{at}{msg}"))
    })
}

/// An optional integer field: `null` or absent is None; anything but an integer that fits i64
/// is 400 naming the field.
pub fn int(v: Option<&RawValue>, at: &str, name: &str) -> ApiResult<Option<i64>> {
    match v {
        None => Ok(None),
        Some(r) if r.get() == "null" => Ok(None),
        Some(r) => integer(r.get()).map(Some).ok_or_else(|| {
            ApiError::bad(format!(
                "{at}{name} must be an integer (ms) from -9223372036854775808 to 9223372036854775807, got {}",
                short(r.get())
            ))
        }),
    }
}

/// A JSON number that is an integer: `12`, or `12.0` / `1.2e1` (JSON Schema counts those as
/// integers too) when exact (|v| < 2^53).
fn integer(text: &str) -> Option<i64> {
    if let Ok(i) = serde_json::from_str::<i64>(text) {
        return Some(i);
    }
    let f = serde_json::from_str::<f64>(text).ok()?;
    (f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0).then_some(f as i64)
}

/// A plugin name given in a field (`at` prefixes the message, e.g. "[3].").
pub fn plugin_name(at: &str, name: &str) -> ApiResult<()> {
    if crate::plugins::valid_plugin_name(name) {
        Ok(())
    } else {
        Err(ApiError::bad(format!(
            "{at}plugin {name:?} is not a plugin name ([a-z0-9][a-z0-9-]{{0,63}})"
        )))
    }
}

/// The start of a raw value, for messages.
fn short(s: &str) -> String {
    if s.len() <= 40 {
        s.to_owned()
    } else {
        let mut end = 40;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &s[..end])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrays_are_capped_as_they_are_read() {
        let ok = raw(b"[1, 2, 3]").unwrap();
        assert_eq!(typed_array::<i64>(ok, 3, "tasks").unwrap().len(), 3);
        let over = raw(b"[1, 2, 3, 4]").unwrap();
        let e = typed_array::<i64>(over, 3, "tasks").unwrap_err();
        assert_eq!(
            (e.status.as_u16(), e.message.as_str()),
            (413, "tasks: more than 3 elements")
        );
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Spec {
        #[serde(default, deserialize_with = "field::time")]
        run_at: Option<i64>,
    }

    #[test]
    fn a_typed_error_names_its_path() {
        let msg = |text: &'static [u8]| {
            typed_array::<Spec>(raw(text).unwrap(), 10, "specs")
                .unwrap_err()
                .message
        };
        let m = msg(br#"[{}, {"run_at": "x"}]"#);
        assert!(m.starts_with("[1].run_at must be an integer"), "{m}");
        let m = msg(br#"[{"run_at": -1}]"#);
        assert!(m.starts_with("[0].run_at must be a time from 0"), "{m}");
        let m = msg(br#"[{}, {"colour": 1}]"#);
        assert!(m.starts_with("[1]: unknown field `colour`"), "{m}");
        let m = msg(br#"[{}, 5]"#);
        assert!(m.starts_with("[1]: invalid type: integer `5`"), "{m}");
        let e = typed::<Spec>(raw(br#"{"run_at": 1.5}"#).unwrap()).unwrap_err();
        assert!(
            e.message.starts_with("run_at must be an integer"),
            "{}",
            e.message
        );
        let e = typed::<Spec>(raw(br#"{"x": 1}"#).unwrap()).unwrap_err();
        assert!(e.message.starts_with("unknown field `x`"), "{}", e.message);
        let ok: Spec = typed(raw(br#"{"run_at": 12.0}"#).unwrap()).unwrap();
        assert_eq!(ok.run_at, Some(12));
    }

    #[test]
    fn integers_are_checked_for_range_and_name_the_field() {
        let big = raw(b"9223372036854775808").unwrap();
        let e = int(Some(big), "[2].", "run_at").unwrap_err();
        assert!(
            e.message.starts_with("[2].run_at must be an integer"),
            "{}",
            e.message
        );
        assert_eq!(
            int(Some(raw(b"1.5").unwrap()), "", "x").unwrap_err().status,
            400
        );
        assert_eq!(int(Some(raw(b"null").unwrap()), "", "x").unwrap(), None);
    }
}
