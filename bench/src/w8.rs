//! W8: a deploy checked against the work waiting for it. A plugin (`orders`, noop's code: any
//! JSON) holds `--w8-waiting` scheduled tasks, three of them without `user_id`; a new version
//! (order-cancel's code, which needs it) is uploaded over HTTP while W1 runs for another plugin:
//! the upload checks every waiting payload and is refused (409, the three named). Reports how
//! long the check took, how many it read per second, and W1's lateness meanwhile.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use eggtimer::clock::system_ms as now_ms;
use eggtimer::store::NewTask;
use serde_json::Value;

use crate::report;
use crate::workloads::{Bench, schedule_all, tasks};

/// Tasks of `orders` the deploy finds without `user_id`.
const MISFITS: [usize; 3] = [17, 4242, 99_999];

impl Bench {
    pub async fn w8(&self) -> Result<report::W8> {
        self.flush().await?;
        let waiting = self.args.w8_waiting;
        let dir = &self.args.plugins_dir;
        let read = |name: &str| {
            std::fs::read(dir.join(format!("{name}.wasm")))
                .with_context(|| format!("reading {name}.wasm"))
        };
        let (v1, v2) = (read("noop")?, read("order-cancel")?);
        let (addr, server) = self.api().await?;
        let base = format!("http://{addr}");
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(600))
            .build()?;
        let url = format!("{base}/v1/plugins/orders");
        let put = move |wasm: Vec<u8>| {
            let (client, url) = (client.clone(), url.clone());
            async move {
                let r = client
                    .put(url)
                    .header("content-type", "application/wasm")
                    .body(wasm)
                    .send()
                    .await?;
                let status = r.status().as_u16();
                anyhow::Ok((status, r.json::<Value>().await.unwrap_or(Value::Null)))
            }
        };
        let (s, v) = self.http.spawn(put(v1)).await??;
        if s != 201 {
            bail!("uploading v1 of orders: {s} {v}");
        }
        let far = now_ms() + 86_400_000;
        let mut all = tasks(0, &vec![far; waiting], "orders");
        for (i, t) in all.iter_mut().enumerate() {
            t.id = format!("w{i}");
            t.payload = if MISFITS.contains(&i) {
                format!(r#"{{"order_id":"o{i}"}}"#)
            } else {
                format!(r#"{{"order_id":"o{i}","user_id":"u1"}}"#)
            };
        }
        while !all.is_empty() {
            let chunk: Vec<NewTask> = all.drain(..all.len().min(100_000)).collect();
            schedule_all(&self.store, chunk).await?;
        }
        // the deploy starts with W1's first due tasks and runs beside them
        let starts_in = Duration::from_millis(3000 + (self.args.n as u64 / 50));
        let deploy = self.http.spawn(async move {
            tokio::time::sleep(starts_in).await;
            let t0 = Instant::now();
            let r = put(v2).await;
            (t0.elapsed(), r)
        });
        let w1 = self.w1_of("W8-W1", "noop").await?;
        let (took, r) = deploy.await?;
        let (status, v) = r?;
        server.abort();
        let e = &v["error"];
        if status != 409 || e["code"] != "incompatible_payloads" {
            bail!("the deploy was not refused: {status} {v}");
        }
        let checked = e["checked"].as_u64().unwrap_or(0);
        let failing = e["failing"].as_u64().unwrap_or(0);
        if checked != waiting as u64 || failing != MISFITS.len() as u64 {
            bail!("the deploy checked {checked} of {waiting} and refused {failing}: {v}");
        }
        Ok(report::W8 {
            workload: "W8",
            waiting,
            checked,
            failing,
            deploy_s: report::round(took.as_secs_f64()),
            checked_per_s: (checked as f64 / took.as_secs_f64()).round(),
            w1_lateness_ms: w1.lateness_ms,
            w1_outcomes: w1.outcomes,
        })
    }
}
