//! Revocations: a cancel or a move of a task claimed ahead (running to the store, its due time
//! still to come) is asked of the runner that holds it, which takes it out of its wait and
//! applies the request, or refuses it when the task has already started. Redis's clock judges
//! (`revoke.lua`): a request not applied within its deadline can't be applied any more, so the
//! answer the asker gets and what the holder does agree.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use redis::Value;

use futures::future::try_join_all;

use super::tasks::{int, string};
use super::{Store, TaskState};

/// How often the asker reads whether its revocation was applied.
const POLL: Duration = Duration::from_millis(2);
/// How long the asker waits at most, by its own clock (the request's deadline, 200 ms of Redis's
/// clock, ends it first; this only bounds a wait on a Redis whose clock stalls).
const LONGEST: Duration = Duration::from_secs(2);

/// Whether the message heard on the wake channel is a revocation, and of what: (shard, claim
/// token, task key).
pub fn revocation_of(msg: &str) -> Option<(u32, u64, &str)> {
    let rest = msg.strip_prefix('v')?;
    let (shard, rest) = rest.split_once(':')?;
    let (token, key) = rest.split_once(':')?;
    Some((shard.parse().ok()?, token.parse().ok()?, key))
}

impl Store {
    /// The tasks of `owner` (None: any owner, or none) of the plugins `plugins` names (None: any
    /// plugin) that runners hold claimed ahead (running to the store, their due time still to
    /// come by this runner's clock): each one's key and claim token. Read from every shard's
    /// claim batches at once (at most the tasks runners have claimed), for an owner's shift or
    /// cancel, or a plugin's delete, to revoke them as well.
    pub async fn claimed_ahead(
        &self,
        owner: Option<&str>,
        plugins: &[Option<String>],
    ) -> Result<Vec<(String, u64)>> {
        let now = self.clock().now_ms();
        let shards = try_join_all((0..self.shards()).map(|s| self.claimed_records(s))).await?;
        Ok(shards
            .into_iter()
            .flatten()
            .filter(|(_, _, r)| {
                r.state == TaskState::Running
                    && r.run_at > now
                    && owner.is_none_or(|o| r.owner.as_deref() == Some(o))
                    && plugins
                        .iter()
                        .any(|p| p.as_deref().is_none_or(|p| p == r.plugin))
            })
            .map(|(key, token, _)| (key, token))
            .collect())
    }

    /// Waits for the runner holding the task `key` to apply a revocation asked of it: its due
    /// time after the request (0 for a cancel), or None when it was refused (the task had
    /// started, or its runner did not answer in time: it runs).
    pub(super) async fn await_revocation(&self, shard: u32, key: &str) -> Result<Option<i64>> {
        // an asker killed here leaves its request behind: a later request sweeps it
        eggtimer_base::failpoint::hit("revocation-asked");
        let started = tokio::time::Instant::now();
        loop {
            let mut inv = self.shard_script(&self.inner.scripts.revoke, shard);
            inv.arg("wait").arg(key);
            let v: Vec<Value> = inv
                .invoke_async(&mut self.conn())
                .await
                .context("revoke script")?;
            let word = string(v.first().context("an empty reply")?)?;
            match word.as_str() {
                "applied" => return Ok(Some(int(v.get(1).context("applied without a due")?)?)),
                "refused" => return Ok(None),
                "pending" if started.elapsed() < LONGEST => tokio::time::sleep(POLL).await,
                "pending" => return Ok(None),
                other => bail!("the revoke script answered {other:?}"),
            }
        }
    }

    /// The holder of the claim `token` of the task `key`, which took the task out of its wait,
    /// applies the revocation asked of it: true when applied (the task must not start), false
    /// when it may not be (past its deadline, or the claim ended): the task starts after all.
    pub async fn apply_revocation(&self, shard: u32, key: &str, token: u64) -> Result<bool> {
        let w = self.revoke_call("apply", shard, key, token).await?;
        Ok(w == "ok")
    }

    /// The holder of the claim `token` of the task `key` has already started it: the revocation
    /// is refused at once.
    pub async fn refuse_revocation(&self, shard: u32, key: &str, token: u64) -> Result<()> {
        self.revoke_call("refuse", shard, key, token).await?;
        Ok(())
    }

    async fn revoke_call(&self, mode: &str, shard: u32, key: &str, token: u64) -> Result<String> {
        let mut inv = self.shard_script(&self.inner.scripts.revoke, shard);
        inv.arg(mode)
            .arg(key)
            .arg(token)
            .arg(self.keys().wake_channel())
            .arg(shard);
        let w: String = inv
            .invoke_async(&mut self.conn())
            .await
            .context("revoke script")?;
        match w.as_str() {
            "ok" | "no" => Ok(w),
            other => bail!("the revoke script answered {other:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revocation_message_names_its_shard_claim_and_task() {
        assert_eq!(
            revocation_of("v3:17:order-cancel\u{1f}o-1"),
            Some((3, 17, "order-cancel\u{1f}o-1"))
        );
        // a task key may hold ':' itself
        assert_eq!(revocation_of("v0:5:p\u{1f}a:b"), Some((0, 5, "p\u{1f}a:b")));
        assert_eq!(revocation_of("3:1700000000000"), None);
        assert_eq!(revocation_of("s"), None);
        assert_eq!(revocation_of("vx:1:k"), None);
    }
}
