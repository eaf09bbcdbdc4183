//! The data layout of a namespace, checked when a store opens.
//!
//! Each shard records its layout in its meta hash (`layout`). This build reads and writes the
//! layout of eggtimer 0.1.0; data of the builds before 0.1.0 is refused with what to do, since
//! only 0.1.0 knows how to bring it up to date.

use anyhow::{Result, bail};
use futures::future::try_join_all;

use super::Store;

/// The layout this build keeps: the one eggtimer 0.1.0 wrote.
pub const LAYOUT: &str = "5";

/// What a shard holds, as far as its layout goes.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct ShardLayout {
    /// The shard's recorded layout (None: never recorded).
    pub recorded: Option<String>,
    /// The shard holds tasks or dead letters.
    pub has_tasks: bool,
    /// A key that only builds before 0.1.0 write (`due`, `inflight`) is there.
    pub old_keys: Vec<&'static str>,
}

impl ShardLayout {
    /// Why this build can't use the shard (None: it can), for a person.
    pub fn refusal(&self) -> Option<String> {
        match &self.recorded {
            Some(l) if l == LAYOUT && self.old_keys.is_empty() => None,
            Some(l) if l == LAYOUT => Some(format!(
                "it holds the keys {} of a build before 0.1.0 (a runner of that build may still be running)",
                self.old_keys.join(", ")
            )),
            Some(l) => Some(format!("its data layout is {l}, not {LAYOUT}")),
            None if self.has_tasks || !self.old_keys.is_empty() => {
                Some("it holds tasks but records no data layout".into())
            }
            None => None,
        }
    }
}

impl Store {
    /// Checks every shard's layout (recording it on a shard never used); refuses data written by
    /// a build before 0.1.0.
    pub(super) async fn check_layout(&self) -> Result<()> {
        let calls = (0..self.shards()).map(|shard| async move {
            let layout = self.shard_layout(shard).await?;
            if let Some(why) = layout.refusal() {
                bail!(
                    "namespace {:?} was written by an eggtimer build before 0.1.0 (shard {shard}: {why}); \
                     start eggtimer 0.1.0 on it once (it brings the data up to date), stop it, then start this version",
                    self.inner.opts.namespace
                );
            }
            if layout.recorded.is_none() {
                let k = self.keys().shard(shard);
                let _: i64 = redis::cmd("HSETNX")
                    .arg(&k.meta)
                    .arg("layout")
                    .arg(LAYOUT)
                    .query_async(&mut self.conn())
                    .await?;
            }
            Ok(())
        });
        try_join_all(calls).await?;
        Ok(())
    }

    async fn shard_layout(&self, shard: u32) -> Result<ShardLayout> {
        let k = self.keys().shard(shard);
        let tag = format!("{{{}:{shard}}}", self.keys().ns());
        let (recorded, tasks, dead, due, inflight): (Option<String>, bool, bool, bool, bool) =
            redis::pipe()
                .cmd("HGET")
                .arg(&k.meta)
                .arg("layout")
                .cmd("EXISTS")
                .arg(&k.tasks)
                .cmd("EXISTS")
                .arg(&k.dead)
                .cmd("EXISTS")
                .arg(format!("{tag}:due"))
                .cmd("EXISTS")
                .arg(format!("{tag}:inflight"))
                .query_async(&mut self.conn())
                .await?;
        let old_keys = [("due", due), ("inflight", inflight)]
            .into_iter()
            .filter_map(|(name, there)| there.then_some(name))
            .collect();
        Ok(ShardLayout {
            recorded,
            has_tasks: tasks || dead,
            old_keys,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(recorded: Option<&str>, has_tasks: bool, old_keys: &[&'static str]) -> ShardLayout {
        ShardLayout {
            recorded: recorded.map(str::to_owned),
            has_tasks,
            old_keys: old_keys.to_vec(),
        }
    }

    #[test]
    fn a_new_shard_and_one_of_this_layout_are_used() {
        assert_eq!(shard(None, false, &[]).refusal(), None);
        assert_eq!(shard(Some(LAYOUT), true, &[]).refusal(), None);
    }

    #[test]
    fn data_of_builds_before_the_release_is_refused() {
        assert!(
            shard(None, true, &[])
                .refusal()
                .unwrap()
                .contains("no data layout")
        );
        assert!(
            shard(Some("4"), true, &[])
                .refusal()
                .unwrap()
                .contains("is 4")
        );
        let beside = shard(Some(LAYOUT), true, &["due"]).refusal().unwrap();
        assert!(beside.contains("due"), "{beside}");
    }
}
