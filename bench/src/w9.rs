//! W9: events in. `--w9-listening` tasks (`e<i>`, of `noop`, a day away) each listen on its own
//! key of the topic `w9` (even ones `cancel`, odd ones `run`); then events for 100,000 of them
//! arrive over HTTP at 10,000 per second (a request of 100 every 10 ms) while W1 runs for
//! another plugin's tasks on the same runner. Reports event → task cancelled (the request's
//! time: a publish answers once its tasks are cancelled) and event → task started (the handler's
//! start − the event's time), W1's lateness meanwhile, that every event reached its task exactly
//! once, and the Redis memory a listener costs: the same tasks scheduled without and with `on`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use eggtimer::clock::system_ms as now_ms;
use eggtimer::store::{Listener, NewTask, Then};
use serde_json::{Value, json};

use crate::recorder::Recorder;
use crate::report::{self, lateness};
use crate::workloads::{Bench, schedule_all, tasks};

/// Events sent, 100 every 10 ms.
const EVENTS: usize = 100_000;
const PER_REQUEST: usize = 100;

impl Bench {
    /// The listening tasks `e<i>`, a day away (`on` none when `listen` is false).
    fn w9_tasks(&self, listen: bool) -> Vec<NewTask> {
        let far = now_ms() + 86_400_000;
        let m = self.args.w9_listening;
        let mut all = tasks(0, &vec![far; m], "noop");
        for (i, t) in all.iter_mut().enumerate() {
            t.id = format!("e{i}");
            if listen {
                t.on = vec![Listener {
                    topic: "w9".into(),
                    key: t.id.clone(),
                    then: if i % 2 == 0 { Then::Cancel } else { Then::Run },
                }];
                t.lookback_ms = 60_000;
            }
        }
        all
    }

    async fn w9_fill(&self, listen: bool) -> Result<(f64, f64)> {
        self.flush().await?;
        let before = self.nodes.info(0, "memory", "used_memory").await?;
        let t0 = Instant::now();
        let mut all = self.w9_tasks(listen);
        while !all.is_empty() {
            let chunk: Vec<NewTask> = all.drain(..all.len().min(100_000)).collect();
            schedule_all(&self.store, chunk).await?;
        }
        let took = t0.elapsed().as_secs_f64();
        let after = self.nodes.info(0, "memory", "used_memory").await?;
        Ok((after - before, took))
    }

    pub async fn w9(&self) -> Result<report::W9> {
        let m = self.args.w9_listening;
        if m < EVENTS {
            bail!("--w9-listening must be at least {EVENTS}");
        }
        let (plain, _) = self.w9_fill(false).await?;
        let (listening, fill_s) = self.w9_fill(true).await?;
        // of it, the event shards' listener index
        let mut index = 0;
        let mut c = self.redis.clone();
        for shard in 0..self.store.shards() {
            let bytes: Option<i64> = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(&self.store.keys().shard(shard).listeners)
                .arg("SAMPLES")
                .arg(0)
                .query_async(&mut c)
                .await?;
            index += bytes.unwrap_or(0);
        }
        let (addr, server) = self.api().await?;
        let url = format!("http://{addr}/v1/events/w9");
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()?;
        // the events start with W1's first due tasks and run beside them
        let starts_in = Duration::from_millis(3000 + (self.args.n as u64 / 50));
        let rec = Recorder::with_events(Arc::clone(&self.plugins), self.args.n, m);
        let sender = self.http.spawn(async move {
            tokio::time::sleep(starts_in).await;
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut sent = Vec::new();
            for r in 0..EVENTS / PER_REQUEST {
                tick.tick().await;
                let body: Vec<Value> = (0..PER_REQUEST)
                    .map(|j| json!({"key": format!("e{}", r * PER_REQUEST + j)}))
                    .collect();
                let (client, url) = (client.clone(), url.clone());
                sent.push(tokio::spawn(async move {
                    let t0 = Instant::now();
                    let reply: Value = client.post(url).json(&body).send().await?.json().await?;
                    anyhow::Ok((t0.elapsed().as_secs_f64() * 1000.0, reply))
                }));
            }
            let mut out = Vec::new();
            for s in sent {
                out.push(s.await??);
            }
            anyhow::Ok(out)
        });
        let w1 = self.w1_with("W9-W1", "noop", Arc::clone(&rec)).await?;
        let replies = sender.await??;
        server.abort();
        let mut cancel_ms: Vec<f64> = Vec::new();
        let mut matched = 0;
        for (ms, reply) in &replies {
            matched += reply["matched"].as_u64().unwrap_or(0);
            // half of each request's events cancel (the even ones)
            cancel_ms.extend(std::iter::repeat_n(*ms, PER_REQUEST / 2));
        }
        cancel_ms.sort_by(|a, b| a.total_cmp(b));
        let (run_ms, runs, twice) = rec.event_runs(EVENTS);
        // what is left: the listening tasks no event was sent for, and none of those sent for
        let left = self.scheduled().await?;
        Ok(report::W9 {
            workload: "W9",
            listening: m,
            events: EVENTS,
            matched,
            missed: EVENTS as u64 - matched,
            started: runs,
            started_twice: twice,
            left_scheduled: left,
            cancelled_ms: lateness(&cancel_ms),
            started_ms: lateness(&run_ms),
            fill_s: report::round(fill_s),
            bytes_per_listening_task: ((listening - plain) / m as f64).round(),
            listener_index_bytes_per_task: (index as f64 / m as f64).round(),
            w1_lateness_ms: w1.lateness_ms,
            w1_outcomes: w1.outcomes,
            redis_cpu_share: w1.redis_cpu_share,
            runner_cpu_share: w1.runner_cpu_share,
        })
    }
}
