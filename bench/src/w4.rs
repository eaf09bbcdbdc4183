//! W4 plugin cost: one plugin call, warm and with a fresh instance, without Redis.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Result, bail};
use eggtimer::executor::TaskHost;
use eggtimer::store::Claimed;
use futures::future::BoxFuture;

use crate::report::{self, PluginCost, median};
use crate::workloads::Bench;

/// A task host without kv (every read is empty) and one secret for every name.
struct NoKv;
impl TaskHost for NoKv {
    fn kv_get<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, String>> {
        Box::pin(std::future::ready(Ok(None)))
    }
    fn secret<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, String>> {
        Box::pin(std::future::ready(Ok(Some("w4-signing-key".into()))))
    }
}

/// A claimed task of `plugin` for calling the plugin host directly.
fn probe_task(plugin: &str, payload: &str) -> Claimed {
    Claimed {
        id: "w4".into(),
        shard: 0,
        token: 1,
        effects_claim: 1,
        attempt: 1,
        due: 0,
        max_attempts: 5,
        plugin: plugin.into(),
        owner: None,
        payload: payload.into(),
        created: 0,
        traceparent: None,
        start_by: None,
        event: None,
        batch: Vec::new(),
        priority: 0,
    }
}

impl Bench {
    /// One call of `plugin`, µs: warm (an idle instance reused, as the executor does) or with a
    /// `fresh` instance per call; the median of five rounds of `iters` calls.
    pub async fn call_us(
        &self,
        plugin: &str,
        payload: &str,
        iters: usize,
        fresh: bool,
    ) -> Result<f64> {
        let (task, host): (_, Arc<dyn TaskHost>) = (probe_task(plugin, payload), Arc::new(NoKv));
        let mut out = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            for _ in 0..iters {
                if fresh {
                    self.plugins.forget_warm();
                }
                if let Err(e) = self.plugins.call(&task, Arc::clone(&host)).await.outcome {
                    bail!("{plugin}: {e}");
                }
            }
            out.push(t.elapsed().as_secs_f64() * 1e6 / iters as f64);
        }
        Ok(median(out))
    }

    /// W4: one plugin call, warm (an idle instance reused, as the executor does) and with a fresh
    /// instance per task; no Redis.
    pub async fn w4(&self) -> Result<report::W4> {
        // a receiver on 127.0.0.1 for the webhook plugin's one request per call
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(|| async { axum::http::StatusCode::NO_CONTENT }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        let settings = eggtimer::plugin_settings::PluginSettings {
            allowed_hosts: Some(vec![format!("http://127.0.0.1:{port}")]),
            ..Default::default()
        };
        let policies = eggtimer::policy::Policies::default();
        policies.set([("webhook".to_owned(), settings)].into_iter().collect());
        self.plugins.follow(&policies);
        let hook =
            format!(r#"{{"url":"http://127.0.0.1:{port}/hook","body":{{"order_id":"o1"}}}}"#);
        let mut per_task = BTreeMap::new();
        let order = r#"{"order_id":"o1","user_id":"u1"}"#;
        let prints = r#"{"what":"print"}"#;
        // (name in the report, plugin, payload, warm calls, fresh instances) per round; the
        // TypeScript and Python builds of order-cancel when they were built (a Python instance
        // takes milliseconds); and a plugin that prints a line to stdout and one to stderr per
        // call (what the host does with a guest's output, on one instance for 10,000 calls)
        for (name, plugin, payload, warm_n, fresh_n) in [
            ("noop", "noop", "null", 20_000, 2000),
            ("order-cancel", "order-cancel", order, 20_000, 2000),
            ("order-cancel-ts", "order-cancel-ts", order, 5000, 200),
            ("order-cancel-py", "order-cancel-py", order, 2000, 20),
            ("test-flood (prints)", "test-flood", prints, 20_000, 2000),
            (
                "webhook (one POST to 127.0.0.1)",
                "webhook",
                &hook,
                5000,
                500,
            ),
        ] {
            if self.plugins.get(plugin).is_none() {
                eprintln!(
                    "W4: {plugin} is not built (cargo xtask plugins; the TypeScript and Python builds need node / python3): left out"
                );
                continue;
            }
            let warm = self.call_us(plugin, payload, warm_n, false).await?;
            let fresh = self.call_us(plugin, payload, fresh_n, true).await?;
            per_task.insert(
                name.to_owned(),
                PluginCost {
                    warm_us_per_task: warm,
                    fresh_instance_us_per_task: fresh,
                },
            );
        }
        Ok(report::W4 {
            workload: "W4",
            per_task,
            note: "instantiate (fresh) or reuse (warm) + call + effects collected; no Redis",
        })
    }
}
