//! Plugins' secrets, encrypted at rest with XChaCha20-Poly1305 under the operator's key
//! (`--secrets-key-file`). Each value is sealed with a random 24-byte nonce and bound to its
//! namespace, plugin and name (the AEAD's associated data), so a sealed value copied to another
//! plugin or name does not open. Redis holds `{ns}:plugin:secrets:<plugin>`: HASH name ->
//! `{"at": ms, "sealed": base64(nonce || ciphertext)}`; values are never returned by the API.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use base64::Engine as _;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use serde::{Deserialize, Serialize};

use super::Store;

/// The longest secret value (characters, as JSON Schema's `maxLength` counts them; at most four
/// bytes each) and name (bytes).
pub const MAX_SECRET_CHARS: usize = 64 << 10;
pub const MAX_SECRET_NAME: usize = 128;

/// The operator's secrets key (32 bytes). Its Debug shows nothing of it.
#[derive(Clone)]
pub struct SecretsKey(Arc<[u8; 32]>);

impl std::fmt::Debug for SecretsKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretsKey(..)")
    }
}

impl SecretsKey {
    /// Reads a key file: 64 hex digits (the private setup writes one, 0600). A file others
    /// can read is refused.
    pub fn read(path: &Path) -> Result<SecretsKey> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path)
            .with_context(|| format!("reading the secrets key file {}", path.display()))?;
        if meta.mode() & 0o077 != 0 {
            bail!(
                "the secrets key file {} can be read by others (mode {:o}): chmod 600 it",
                path.display(),
                meta.mode() & 0o777
            );
        }
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the secrets key file {}", path.display()))?;
        let bytes = hex::decode(text.trim()).ok().filter(|b| b.len() == 32);
        match bytes {
            Some(b) => Ok(SecretsKey(Arc::new(b.try_into().expect("32 bytes")))),
            None => bail!(
                "the secrets key file {} must hold 64 hex digits (make one with `openssl rand -hex 32`)",
                path.display()
            ),
        }
    }

    /// Makes a new key file (0600) at `path` unless one is there; returns the key.
    pub fn read_or_create(path: &Path) -> Result<SecretsKey> {
        use std::os::unix::fs::OpenOptionsExt;
        if !path.exists() {
            let key: [u8; 32] = rand::random();
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .with_context(|| format!("creating the secrets key file {}", path.display()))?;
            std::io::Write::write_all(&mut f, format!("{}\n", hex::encode(key)).as_bytes())?;
        }
        SecretsKey::read(path)
    }

    fn cipher(&self) -> XChaCha20Poly1305 {
        XChaCha20Poly1305::new(self.0.as_ref().into())
    }
}

/// What Redis holds for one secret.
#[derive(Serialize, Deserialize)]
struct Sealed {
    at: i64,
    sealed: String,
}

/// A secret's name and when it was last set (its value is never shown).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct SecretInfo {
    pub name: String,
    /// ms since the Unix epoch.
    pub updated_at: i64,
}

/// A secret's name: 1 to 128 of A-Z a-z 0-9 _ - .
pub fn valid_secret_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= MAX_SECRET_NAME
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
}

fn aad(ns: &str, plugin: &str, name: &str) -> Vec<u8> {
    format!("eggtimer secret\0{ns}\0{plugin}\0{name}").into_bytes()
}

impl Store {
    fn secrets_key(&self) -> Result<&SecretsKey> {
        self.inner.opts.secrets_key.as_ref().context(
            "this runner has no secrets key: start it with --secrets-key-file (`eggtimer serve` makes one in its data dir)",
        )
    }

    /// Whether this runner can seal and open secrets.
    pub fn has_secrets_key(&self) -> bool {
        self.inner.opts.secrets_key.is_some()
    }

    /// Seals and stores a plugin's secret.
    pub async fn secret_set(&self, plugin: &str, name: &str, value: &str) -> Result<()> {
        let key = self.secrets_key()?;
        let nonce: [u8; 24] = rand::random();
        let ct = key
            .cipher()
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: value.as_bytes(),
                    aad: &aad(self.keys().ns(), plugin, name),
                },
            )
            .map_err(|_| anyhow::anyhow!("sealing the secret failed"))?;
        let mut blob = nonce.to_vec();
        blob.extend_from_slice(&ct);
        let sealed = Sealed {
            at: self.clock().now_ms(),
            sealed: base64::engine::general_purpose::STANDARD.encode(blob),
        };
        redis::cmd("HSET")
            .arg(self.keys().plugin_secrets(plugin))
            .arg(name)
            .arg(serde_json::to_string(&sealed)?)
            .query_async::<()>(&mut self.conn())
            .await
            .context("storing a secret")
    }

    /// Deletes a plugin's secret; false when it had none of that name.
    pub async fn secret_delete(&self, plugin: &str, name: &str) -> Result<bool> {
        let n: u32 = redis::cmd("HDEL")
            .arg(self.keys().plugin_secrets(plugin))
            .arg(name)
            .query_async(&mut self.conn())
            .await
            .context("deleting a secret")?;
        Ok(n > 0)
    }

    /// The names of a plugin's secrets, sorted.
    pub async fn secret_list(&self, plugin: &str) -> Result<Vec<SecretInfo>> {
        let all: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
            .arg(self.keys().plugin_secrets(plugin))
            .query_async(&mut self.conn())
            .await
            .context("listing secrets")?;
        let mut out: Vec<SecretInfo> = all
            .into_iter()
            .map(|(name, v)| SecretInfo {
                name,
                updated_at: serde_json::from_str::<Sealed>(&v).map_or(0, |s| s.at),
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// A plugin's secret, opened; None when it has none of that name.
    pub async fn secret_get(&self, plugin: &str, name: &str) -> Result<Option<String>> {
        let v: Option<String> = redis::cmd("HGET")
            .arg(self.keys().plugin_secrets(plugin))
            .arg(name)
            .query_async(&mut self.conn())
            .await
            .context("reading a secret")?;
        let Some(v) = v else { return Ok(None) };
        self.open_secret(plugin, name, &v).map(Some)
    }

    fn open_secret(&self, plugin: &str, name: &str, stored: &str) -> Result<String> {
        let key = self.secrets_key()?;
        let fail = || {
            anyhow::anyhow!(
                "secret {name:?} of plugin {plugin:?} does not open with this runner's secrets key (--secrets-key-file): it was set under another key; set it again"
            )
        };
        let sealed: Sealed = serde_json::from_str(stored).map_err(|_| fail())?;
        let blob = base64::engine::general_purpose::STANDARD
            .decode(sealed.sealed)
            .map_err(|_| fail())?;
        if blob.len() < 24 {
            return Err(fail());
        }
        let (nonce, ct) = blob.split_at(24);
        let plain = key
            .cipher()
            .decrypt(
                XNonce::from_slice(nonce),
                Payload {
                    msg: ct,
                    aad: &aad(self.keys().ns(), plugin, name),
                },
            )
            .map_err(|_| fail())?;
        String::from_utf8(plain).map_err(|_| fail())
    }

    /// Checks that every plugin's secrets open with this runner's key: the problems found, one
    /// line each (said at start).
    pub async fn secrets_check(&self, plugins: &[String]) -> Result<Vec<String>> {
        let mut problems = Vec::new();
        for plugin in plugins {
            let all: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
                .arg(self.keys().plugin_secrets(plugin))
                .query_async(&mut self.conn())
                .await
                .context("reading secrets")?;
            if all.is_empty() {
                continue;
            }
            if !self.has_secrets_key() {
                problems.push(format!(
                    "plugin {plugin:?} has secrets but this runner has no --secrets-key-file: its secret() calls fail"
                ));
                continue;
            }
            for (name, v) in all {
                if let Err(e) = self.open_secret(plugin, &name, &v) {
                    problems.push(format!("{e:#}"));
                }
            }
        }
        Ok(problems)
    }
}
