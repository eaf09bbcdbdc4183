//! Reading request bodies: content type, size, and JSON read as borrowed raw values, so a large
//! body is checked (batch length, payload sizes) without being built into a tree first, and
//! every field is parsed on its own with a message that names it.

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, header};
use serde::Deserialize;
use serde::de::{self, DeserializeSeed, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::error::ApiError;
use crate::limits;

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

/// The elements of a raw JSON array, refusing (400) more than `max` as soon as it sees one more.
pub fn array<'a>(v: &'a RawValue, max: usize, what: &str) -> ApiResult<Vec<&'a RawValue>> {
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
            let mut out = Vec::new();
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
    Capped(max).deserialize(&mut d).map_err(|e| {
        let msg = format!("{what}: {e}");
        if msg.contains("more than") {
            ApiError::too_large(msg)
        } else {
            ApiError::bad(msg)
        }
    })
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

/// An optional time field, within [0, MAX_TIME_MS].
pub fn time(v: Option<&RawValue>, at: &str, name: &str) -> ApiResult<Option<i64>> {
    int(v, at, name)?
        .map(|t| limits::time(&format!("{at}{name}"), t))
        .transpose()
        .map_err(Into::into)
}

/// An optional string field.
pub fn string(v: Option<&RawValue>, at: &str, name: &str) -> ApiResult<Option<String>> {
    match v {
        None => Ok(None),
        Some(r) if r.get() == "null" => Ok(None),
        Some(r) => serde_json::from_str::<String>(r.get())
            .map(Some)
            .map_err(|_| ApiError::bad(format!("{at}{name} must be a string"))),
    }
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
        assert_eq!(array(ok, 3, "tasks").unwrap().len(), 3);
        let over = raw(b"[1, 2, 3, 4]").unwrap();
        assert_eq!(array(over, 3, "tasks").unwrap_err().status, 413);
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
        let max = raw(b"9223372036854775807").unwrap();
        let e = time(Some(max), "", "run_at").unwrap_err();
        assert!(e.message.contains("run_at must be a time"), "{}", e.message);
        assert_eq!(
            int(Some(raw(b"1.5").unwrap()), "", "x").unwrap_err().status,
            400
        );
        assert_eq!(int(Some(raw(b"null").unwrap()), "", "x").unwrap(), None);
    }
}
