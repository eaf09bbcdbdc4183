//! The data layout of a namespace, checked when a store opens.
//!
//! Each shard records its layout in its meta hash (`layout`). This build writes layout 6 (task
//! records stored under `<plugin>\x1f<id>`) and reads eggtimer 0.1.0's layout 5 as well: a shard
//! of layout 5 is marked `legacy` (its records under a bare id are read and replaced as tasks of
//! their plugin, see `lua/schedule.lua`) and recorded as 6. Data of the builds before 0.1.0 is
//! refused with what to do, since only 0.1.0 knows how to bring it up to date.

use anyhow::{Result, bail};
use futures::future::try_join_all;

use super::Store;

/// The layout this build writes.
pub const LAYOUT: &str = "6";

/// The layout eggtimer 0.1.0 wrote (task records under their bare id), read as well.
pub const LAYOUT_0_1: &str = "5";

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
            Some(l) if (l == LAYOUT || l == LAYOUT_0_1) && self.old_keys.is_empty() => None,
            Some(l) if l == LAYOUT || l == LAYOUT_0_1 => Some(format!(
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
            let k = self.keys().shard(shard);
            match layout.recorded.as_deref() {
                None => {
                    let _: i64 = redis::cmd("HSETNX")
                        .arg(&k.meta)
                        .arg("layout")
                        .arg(LAYOUT)
                        .query_async(&mut self.conn())
                        .await?;
                }
                // 0.1.0's shard (a runner of it may still write there): its bare ids are read
                // from now on, and the mark stays
                Some(LAYOUT_0_1) => {
                    let () = redis::cmd("HSET")
                        .arg(&k.meta)
                        .arg("legacy")
                        .arg(1)
                        .arg("layout")
                        .arg(LAYOUT)
                        .query_async(&mut self.conn())
                        .await?;
                }
                Some(_) => {}
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
        assert_eq!(shard(Some(LAYOUT_0_1), true, &[]).refusal(), None);
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
