//! W10 limit: the least Redis work a claim and a finish can be, on the same private
//! redis-server: one script takes a batch of due ids from a sorted set and marks them claimed,
//! another deletes the marks. Nothing else (no record, no lease renewal, no outcome, no index,
//! no fair share): eggtimer's claim and finish (W2's) read as a ratio to it. Beside it, the
//! runner's floor: one warm call of `noop` (W4's), and W2's runner CPU per task as a ratio to it.

use anyhow::Result;

use crate::report::{self, per_task, round};
use crate::workloads::Bench;

/// Takes up to ARGV[2] ids due by ARGV[1] from KEYS[1] and marks each claimed (ARGV[3]) in
/// KEYS[2]; returns them.
const CLAIM: &str = r"
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
if #ids == 0 then return ids end
redis.call('ZREM', KEYS[1], unpack(ids))
local marks = {}
for i, id in ipairs(ids) do
  marks[2 * i - 1] = id
  marks[2 * i] = ARGV[3]
end
redis.call('HSET', KEYS[2], unpack(marks))
return ids
";

/// Deletes the marks of the ids in ARGV from KEYS[1].
const FINISH: &str = "return redis.call('HDEL', KEYS[1], unpack(ARGV))";

impl Bench {
    /// `w2`: W2's report, when it ran in this session.
    pub async fn w10(&self, w2: Option<&report::W2>) -> Result<report::W10> {
        let w2_us = w2.map(|r| r.redis_cpu_us_per_task_claim_and_finish);
        self.flush().await?;
        let n = self.args.n;
        let (due, claimed) = ("{w10}:due", "{w10}:claimed");
        let mut c = self.redis.clone();
        let ids: Vec<String> = (0..n).map(|i| format!("b{i}")).collect();
        for chunk in ids.chunks(10_000) {
            let mut zadd = redis::cmd("ZADD");
            zadd.arg(due);
            for id in chunk {
                zadd.arg(0).arg(id);
            }
            let () = zadd.query_async(&mut c).await?;
        }
        let (claim, finish) = (redis::Script::new(CLAIM), redis::Script::new(FINISH));
        // loaded before the measure, as the runner's scripts are
        let _: Vec<String> = claim
            .key(due)
            .key(claimed)
            .arg(-1)
            .arg(1)
            .arg("")
            .invoke_async(&mut c)
            .await?;
        let _: i64 = finish.key(claimed).arg("none").invoke_async(&mut c).await?;
        let cpu0 = self.redis_cpu().await?;
        let mut done = 0;
        loop {
            let batch: Vec<String> = claim
                .key(due)
                .key(claimed)
                .arg(1)
                .arg(self.args.claim_batch)
                .arg("lease")
                .invoke_async(&mut c)
                .await?;
            if batch.is_empty() {
                break;
            }
            let _: i64 = finish.key(claimed).arg(&batch).invoke_async(&mut c).await?;
            done += batch.len();
        }
        let cpu = self.redis_cpu().await? - cpu0;
        let limit = per_task(cpu, done);
        let noop_warm_call_us = self.call_us("noop", "null", 20_000, false).await?;
        let runner = w2.map(|r| r.runner_cpu_us_per_task);
        Ok(report::W10 {
            workload: "W10",
            n: done,
            redis_cpu_us_per_task_claim_and_finish: limit,
            w2_redis_cpu_us_per_task_claim_and_finish: w2_us,
            w2_ratio: w2_us.map(|w| round(w / limit.max(0.01))),
            noop_warm_call_us,
            w2_runner_cpu_us_per_task: runner,
            w2_runner_ratio: runner.map(|r| round(r / noop_warm_call_us.max(0.01))),
        })
    }
}
