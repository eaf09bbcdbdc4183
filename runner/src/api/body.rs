//! Reading request bodies: content type, size, then JSON into the body's type, each field through
//! a `field` reader that bounds it, so an error names the field by its path (`[3].plugin`). A
//! batch is capped as it is read and payloads stay borrowed raw JSON (never built into a tree).

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

/// A body read into its type (a JSON object); an error names where it is (`run_at`).
pub fn typed<'a, T: Deserialize<'a>>(v: &'a RawValue) -> ApiResult<T> {
    typed_at(v, "")
}

/// A JSON array read into its element type (each a JSON object), refusing (400, as the schema's
/// `maxItems` says) more than `max` as soon as it sees one more; an error names the element and field (`[3].plugin`).
pub fn typed_array<'a, T: Deserialize<'a>>(
    v: &'a RawValue,
    max: usize,
    what: &str,
) -> ApiResult<Vec<T>> {
    struct Capped(usize);
    impl<'de> DeserializeSeed<'de> for Capped {
        type Value = Vec<&'de RawValue>;
        fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_seq(self)
        }
    }
    impl<'de> Visitor<'de> for Capped {
        type Value = Vec<&'de RawValue>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "an array of at most {} elements", self.0)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(self.0));
            while let Some(e) = seq.next_element::<&'de RawValue>()? {
                if out.len() == self.0 {
                    return Err(de::Error::custom(format!("more than {} elements", self.0)));
                }
                out.push(e);
            }
            Ok(out)
        }
    }
    let mut d = serde_json::Deserializer::from_str(v.get());
    let items = Capped(max)
        .deserialize(&mut d)
        .map_err(|e| ApiError::bad(format!("{what}: {}", without_position(&e.to_string()))))?;
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| typed_at(item, &format!("[{i}]")))
        .collect()
}

/// An object read into its type; `at` is where it is (`[3]`, or nothing for the body).
fn typed_at<'a, T: Deserialize<'a>>(v: &'a RawValue, at: &str) -> ApiResult<T> {
    read_object(v).map_err(|(path, msg)| {
        let at = if at.is_empty() && path.is_empty() && msg == NOT_AN_OBJECT {
            "the body"
        } else {
            at
        };
        let joined = join(&format!("{at}{path}"), &msg);
        ApiError::bad(joined.strip_prefix('.').unwrap_or(&joined))
    })
}

/// Why a value is not an object.
const NOT_AN_OBJECT: &str = "must be a JSON object";

/// An object read into its type, or where it failed inside it (`[3].plugin`, `.run_at`, or
/// empty for the value itself) and why. (serde reads a struct from an array of its fields too:
/// only an object is one here.)
fn read_object<'a, T: Deserialize<'a>>(v: &'a RawValue) -> Result<T, (String, String)> {
    use serde_path_to_error::Segment;
    if !v.get().trim_start().starts_with('{') {
        return Err((String::new(), NOT_AN_OBJECT.to_owned()));
    }
    let mut d = serde_json::Deserializer::from_str(v.get());
    serde_path_to_error::deserialize(&mut d).map_err(|e| {
        let inner = e.inner().to_string();
        let msg = without_position(&inner);
        let mut segments: Vec<&Segment> = e.path().iter().collect();
        if let Some(Segment::Map { key }) = segments.last()
            && msg.starts_with(&format!("unknown field `{key}`"))
        {
            segments.pop(); // the message names the field; the path is of the object
        }
        let path = segments
            .iter()
            .map(|s| match s {
                Segment::Seq { index } => format!("[{index}]"),
                Segment::Map { key } => format!(".{key}"),
                Segment::Enum { .. } | Segment::Unknown => String::new(),
            })
            .collect();
        (path, msg.to_owned())
    })
}

/// A message about what is at `path` (`[3].plugin`, `.run_at`): a field reader's (`must be …`)
/// reads on from the field's name; serde's own (`invalid type: …`), and any about a whole
/// element, follow a colon; one handed on by a nested object's reader (`.max must be …`)
/// continues the path.
fn join(path: &str, msg: &str) -> String {
    if msg.starts_with(['.', '[']) {
        format!("{path}{msg}")
    } else if path.is_empty() {
        msg.to_owned()
    } else if path.ends_with(']') || SERDE_MESSAGES.iter().any(|m| msg.starts_with(m)) {
        format!("{path}: {msg}")
    } else {
        format!("{path} {msg}")
    }
}

/// A serde_json message without where it is in the text (the path says it better).
fn without_position(msg: &str) -> &str {
    msg.rsplit_once(" at line ").map_or(msg, |(m, _)| m)
}

/// How serde's own errors begin.
const SERDE_MESSAGES: [&str; 7] = [
    "invalid type",
    "invalid value",
    "invalid length",
    "unknown field",
    "unknown variant",
    "missing field",
    "duplicate field",
];

/// `deserialize_with` readers of a typed body's fields: each refuses a value out of its bounds
/// with a message that the body's reader prefixes with the field's path. `null` is absent.
pub mod field {
    use serde::Deserialize;
    use serde::de::{Deserializer, Error};
    use serde_json::value::RawValue;

    use eggtimer_base::limits;

    fn raw<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
        Option::<&'de RawValue>::deserialize(d)
    }

    /// Any integer that fits i64.
    pub fn int<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
        let Some(r) = raw(d)? else { return Ok(None) };
        super::integer(r.get()).map(Some).ok_or_else(|| {
            D::Error::custom(format!(
                "must be an integer from {} to {}, got {}",
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

    /// A nested object, or null; an error inside it hands on its path (`.max must be …`).
    pub fn object<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
        d: D,
    ) -> Result<Option<T>, D::Error> {
        let Some(r) = raw(d)? else { return Ok(None) };
        super::read_object(r)
            .map(Some)
            .map_err(|(path, msg)| D::Error::custom(super::join(&path, &msg)))
    }

    /// A number of attempts: 1 to MAX_ATTEMPTS.
    pub fn max_attempts<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
        // not an integer at all reads as one out of range: one message for both
        let n = int(d).unwrap_or(Some(0));
        n.map(|n| limits::attempts("", n).map_err(|e| D::Error::custom(e.0.trim_start())))
            .transpose()
    }

    /// A priority: 0 to MAX_PRIORITY.
    pub fn priority<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u8>, D::Error> {
        // not an integer at all reads as one out of range: one message for both
        let n = int(d).unwrap_or(Some(-1));
        n.map(|n| limits::priority("", n).map_err(|e| D::Error::custom(e.0.trim_start())))
            .transpose()
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

    /// A required id (a key of an event or a debounce).
    pub fn required_id<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        id(d)?.ok_or_else(|| D::Error::custom("must be a string"))
    }

    /// A required duration.
    pub fn required_duration<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        duration(d)?.ok_or_else(|| D::Error::custom("must be an integer"))
    }

    /// A plugin's name.
    pub fn plugin<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        let s = string(d)?;
        if let Some(name) = &s {
            limits::plugin("", name).map_err(|e| D::Error::custom(e.0.trim_start()))?;
        }
        Ok(s)
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

/// A JSON number that is an integer: `12`, or `12.0` / `1.2e1` (JSON Schema counts those as
/// integers too) when exact (|v| < 2^53).
pub(super) fn integer(text: &str) -> Option<i64> {
    if let Ok(i) = serde_json::from_str::<i64>(text) {
        return Some(i);
    }
    let f = serde_json::from_str::<f64>(text).ok()?;
    (f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0).then_some(f as i64)
}

/// The start of a raw value, for messages.
pub(super) fn short(s: &str) -> String {
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
        let ok = raw(b"[{}, {}, {}]").unwrap();
        assert_eq!(typed_array::<Spec>(ok, 3, "tasks").unwrap().len(), 3);
        let over = raw(b"[{}, {}, {}, 4]").unwrap();
        let e = typed_array::<Spec>(over, 3, "tasks").unwrap_err();
        assert_eq!(
            (e.status.as_u16(), e.message.as_str()),
            (400, "tasks: more than 3 elements")
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
        assert_eq!(m, "[1]: must be a JSON object");
        // serde would take an array of the fields for the struct
        let m = msg(br#"[[5]]"#);
        assert_eq!(m, "[0]: must be a JSON object");
        let e = typed::<Spec>(raw(br#"[null]"#).unwrap()).unwrap_err();
        assert_eq!(e.message, "the body must be a JSON object");
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
        let e = typed_array::<Spec>(
            raw(br#"[{}, {}, {"run_at": 9223372036854775808}]"#).unwrap(),
            10,
            "specs",
        )
        .unwrap_err();
        assert!(
            e.message.starts_with("[2].run_at must be an integer"),
            "{}",
            e.message
        );
        let e = typed::<Spec>(raw(br#"{"run_at": 1.5}"#).unwrap()).unwrap_err();
        assert_eq!(e.status, 400);
        let ok: Spec = typed(raw(br#"{"run_at": null}"#).unwrap()).unwrap();
        assert_eq!(ok.run_at, None);
    }
}
