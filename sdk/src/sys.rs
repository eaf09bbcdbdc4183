//! The host calls: the real imports on wasm, the recording test host elsewhere.

use crate::{FollowUp, Level, Result};

#[cfg(target_family = "wasm")]
mod imp {
    use super::*;
    use crate::bindings::eggtimer::plugin::{host, types};

    pub fn log(level: Level, message: &str) {
        let level = match level {
            Level::Debug => types::Level::Debug,
            Level::Info => types::Level::Info,
            Level::Warn => types::Level::Warn,
            Level::Error => types::Level::Error,
        };
        host::log(level, message)
    }

    pub fn now() -> i64 {
        host::now()
    }

    /// (`priority` is a constant at each call site: only the `Some` arm's import is linked
    /// where a plugin gives priorities)
    #[inline(always)]
    pub fn schedule(t: FollowUp, priority: Option<u8>) -> Result<String> {
        let f = types::FollowUp {
            plugin: t.plugin,
            payload: t.payload,
            run_at: t.run_at,
            owner: t.owner,
            max_attempts: t.max_attempts,
        };
        // without a priority the plain import: the follow-up has its task's priority
        Ok(match priority {
            None => host::schedule(&f)?,
            Some(p) => host::schedule_with_priority(&f, p)?,
        })
    }

    pub fn cancel(id: &str) {
        host::cancel(id)
    }

    pub fn emit(topic: &str, data: &str) -> Result<()> {
        Ok(host::emit(topic, data)?)
    }

    pub fn kv_get(key: &str) -> Result<Option<String>> {
        Ok(host::kv_get(key)?)
    }

    pub fn kv_set(key: &str, value: &str, ttl_ms: Option<u64>) -> Result<()> {
        Ok(host::kv_set(key, value, ttl_ms)?)
    }

    pub fn kv_delete(key: &str) -> Result<()> {
        Ok(host::kv_delete(key)?)
    }

    pub fn config(name: &str) -> Option<String> {
        host::config(name)
    }

    pub fn event() -> Option<String> {
        host::event()
    }

    pub fn batch() -> Vec<String> {
        host::batch()
    }

    pub fn secret(name: &str) -> Result<Option<String>> {
        Ok(host::secret(name)?)
    }

    pub fn http_send(r: crate::http::Request) -> Result<crate::http::Response> {
        let resp = host::http_send(&types::HttpRequest {
            method: r.method,
            url: r.url,
            headers: r.headers,
            body: r.body,
        })?;
        Ok(crate::http::Response {
            status: resp.status,
            headers: resp.headers,
            body: resp.body,
        })
    }
}

#[cfg(not(target_family = "wasm"))]
mod imp {
    use super::*;
    use crate::testing::with_host;

    pub fn log(level: Level, message: &str) {
        with_host(|h| {
            if h.spend(message.len()).is_ok() {
                h.logs.push((level, message.to_owned()))
            }
        })
    }

    pub fn now() -> i64 {
        with_host(|h| h.now)
    }

    pub fn schedule(t: FollowUp, priority: Option<u8>) -> Result<String> {
        with_host(|h| h.schedule(t, priority))
    }

    pub fn cancel(id: &str) {
        with_host(|h| h.cancel(id))
    }

    pub fn emit(topic: &str, data: &str) -> Result<()> {
        with_host(|h| h.emit(topic, data))
    }

    pub fn kv_get(key: &str) -> Result<Option<String>> {
        with_host(|h| h.kv_get(key))
    }

    pub fn kv_set(key: &str, value: &str, ttl_ms: Option<u64>) -> Result<()> {
        with_host(|h| h.kv_set(key, value, ttl_ms))
    }

    pub fn kv_delete(key: &str) -> Result<()> {
        with_host(|h| h.kv_delete(key))
    }

    pub fn config(name: &str) -> Option<String> {
        with_host(|h| h.config.get(name).cloned())
    }

    pub fn event() -> Option<String> {
        with_host(|h| h.event.clone())
    }

    pub fn batch() -> Vec<String> {
        with_host(|h| h.batch.clone())
    }

    pub fn secret(name: &str) -> Result<Option<String>> {
        with_host(|h| Ok(h.secrets.get(name).cloned()))
    }

    pub fn http_send(r: crate::http::Request) -> Result<crate::http::Response> {
        with_host(|h| h.http_send(r))
    }
}

pub use imp::*;
