//! Observability: /metrics read by a real exposition parser after a known workload, the Grafana
//! dashboard and alert rules naming only metrics that exist, and a task's spans received by an
//! OTLP/HTTP endpoint in the trace its `traceparent` named, carried on to its follow-up and events.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use eggtimer_tests::{
    RedisServer, RunnerProcess, call, events_key, eventually, http, post_tasks, runner_fast_retry,
    wait_state, workspace,
};
use prometheus_parse::{Scrape, Value};
use prost::Message;
use serde_json::json;

const T: Duration = Duration::from_secs(30);

async fn scrape(base: &str) -> (String, Scrape) {
    let text = http()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
        .unwrap_or_else(|e| panic!("the exposition does not parse: {e}\n{text}"));
    (text, scrape)
}

/// The value of a counter or gauge sample with these labels (0 when absent).
fn value(s: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    s.samples
        .iter()
        .filter(|x| x.metric == name && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
        .map(|x| match &x.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
            other => panic!("{name} is not a counter or gauge: {other:?}"),
        })
        .sum()
}

/// The observation count of a histogram with these labels.
fn histogram_count(s: &Scrape, name: &str, labels: &[(&str, &str)]) -> u64 {
    s.samples
        .iter()
        .filter(|x| x.metric == name && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
        .map(|x| match &x.value {
            Value::Histogram(h) => h.iter().map(|b| b.count).fold(0.0, f64::max) as u64,
            other => panic!("{name} is not a histogram: {other:?}"),
        })
        .sum()
}

/// The metric names an ops file's queries use (`eggtimer_…`).
fn names_in(path: &str) -> HashSet<String> {
    let text = std::fs::read_to_string(workspace().join(path)).unwrap();
    let mut names = HashSet::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("eggtimer_") {
        let name: String = rest[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[i + name.len()..];
        names.insert(name);
    }
    names
}

#[tokio::test]
async fn metrics_count_what_ran_and_the_dashboards_name_only_real_metrics() {
    let redis = RedisServer::start();
    let runner = runner_fast_retry(&redis, &[]);
    let base = &runner.url;
    let noop: Vec<_> = (0..20)
        .map(|i| json!({"id": format!("ok-{i}"), "plugin": "noop", "payload": {}}))
        .collect();
    post_tasks(base, json!(noop)).await;
    let panics: Vec<_> = (0..3)
        .map(|i| json!({"id": format!("bad-{i}"), "plugin": "test-panic", "max_attempts": 2}))
        .collect();
    post_tasks(base, json!(panics)).await;
    for i in 0..20 {
        wait_state(base, &format!("ok-{i}"), "done", T).await;
    }
    for i in 0..3 {
        wait_state(base, &format!("bad-{i}"), "dead", T).await;
    }
    let noop = [("plugin", "noop")];
    let bad = [("plugin", "test-panic")];
    let expect = [
        ("eggtimer_tasks_scheduled_total", &noop, 20.0),
        ("eggtimer_tasks_fired_total", &noop, 20.0),
        ("eggtimer_tasks_succeeded_total", &noop, 20.0),
        ("eggtimer_tasks_retried_total", &noop, 0.0),
        ("eggtimer_tasks_scheduled_total", &bad, 3.0),
        ("eggtimer_tasks_fired_total", &bad, 6.0),
        ("eggtimer_tasks_succeeded_total", &bad, 0.0),
        ("eggtimer_tasks_retried_total", &bad, 3.0),
        ("eggtimer_tasks_dead_total", &bad, 3.0),
    ];
    // an outcome is counted just after its script answered: wait until every count is in (the
    // last scrape's text is in the message if they never are)
    let mut last = String::new();
    let settled = tokio::time::timeout(T, async {
        loop {
            let (text, s) = scrape(base).await;
            if expect
                .iter()
                .all(|(n, l, want)| value(&s, n, &l[..]) == *want)
            {
                return (text, s);
            }
            last = text;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let (text, s) =
        settled.unwrap_or_else(|_| panic!("the counts never matched {expect:?}:\n{last}"));
    assert_eq!(
        histogram_count(&s, "eggtimer_firing_lateness_ms", &noop),
        20,
        "{text}"
    );
    assert_eq!(
        histogram_count(&s, "eggtimer_handler_duration_seconds", &bad),
        6,
        "{text}"
    );
    // every start was a claim: 20 + 3 · 2 attempts
    assert_eq!(value(&s, "eggtimer_claims_total", &[]), 26.0, "{text}");
    assert_eq!(value(&s, "eggtimer_dead", &[]), 3.0, "{text}");
    assert_eq!(value(&s, "eggtimer_pending", &[]), 0.0, "{text}");
    assert_eq!(value(&s, "eggtimer_due_backlog", &[]), 0.0, "{text}");
    assert_eq!(
        value(&s, "eggtimer_owner_due_backlog_rest", &[]),
        0.0,
        "{text}"
    );
    assert_eq!(value(&s, "eggtimer_runner_inflight", &[]), 0.0, "{text}");
    assert_eq!(value(&s, "eggtimer_runners", &[]), 1.0, "{text}");
    let shards = s
        .samples
        .iter()
        .filter(|x| x.metric == "eggtimer_pending")
        .count();
    assert!(shards > 0, "{text}");
    assert_eq!(
        value(&s, "eggtimer_owned_shards", &[]),
        shards as f64,
        "{text}"
    );
    for script in ["schedule", "claim", "finish"] {
        let n = histogram_count(&s, "eggtimer_redis_seconds", &[("script", script)]);
        assert!(n > 0, "no round trips of the {script} script timed\n{text}");
    }

    // the Grafana dashboard and the alert rules name only metrics this exposition has
    let exposed: HashSet<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap())
        .collect();
    for file in ["ops/grafana-dashboard.json", "ops/alerts.yml"] {
        let used = names_in(file);
        assert!(used.len() >= 5, "{file} names {used:?}");
        let missing: Vec<_> = used
            .iter()
            .filter(|n| !exposed.contains(n.as_str()))
            .collect();
        assert!(
            missing.is_empty(),
            "{file} names metrics /metrics lacks: {missing:?}\n{text}"
        );
    }
}

/// One span as the test receiver got it.
#[derive(Clone, Debug)]
struct Got {
    name: String,
    trace: String,
    id: String,
    parent: String,
    attrs: HashMap<String, String>,
}

/// A small OTLP/HTTP (protobuf) trace receiver; returns its base URL and what it received.
async fn otlp_receiver() -> (String, Arc<Mutex<Vec<Got>>>) {
    use opentelemetry_proto::tonic::collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
    };
    let got: Arc<Mutex<Vec<Got>>> = Arc::default();
    let sink = Arc::clone(&got);
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let sink = Arc::clone(&sink);
            async move {
                let req = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                let mut out = sink.lock().unwrap();
                for rs in req.resource_spans {
                    for ss in rs.scope_spans {
                        for s in ss.spans {
                            let attrs = s
                                .attributes
                                .iter()
                                .map(|kv| {
                                    let v = kv.value.as_ref().and_then(|v| v.value.as_ref());
                                    (kv.key.clone(), format!("{v:?}"))
                                })
                                .collect();
                            out.push(Got {
                                name: s.name,
                                trace: hex(&s.trace_id),
                                id: hex(&s.span_id),
                                parent: hex(&s.parent_span_id),
                                attrs,
                            });
                        }
                    }
                }
                (
                    [("content-type", "application/x-protobuf")],
                    ExportTraceServiceResponse::default().encode_to_vec(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), got)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Every entry of a stream as its fields.
fn stream_fields(redis: &RedisServer, key: &str) -> Vec<HashMap<String, String>> {
    let rows: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(key)
        .arg("-")
        .arg("+")
        .query(&mut redis.conn())
        .unwrap();
    rows.into_iter()
        .map(|(_, f)| f.into_iter().collect())
        .collect()
}

#[tokio::test]
async fn a_task_run_joins_the_trace_of_its_traceparent_and_carries_it_on() {
    let (otlp, got) = otlp_receiver().await;
    let redis = RedisServer::start();
    let dir = eggtimer_tests::plugins_dir();
    let runner = RunnerProcess::start_with_env(
        &redis.url(),
        &[
            "--plugins-dir",
            dir.to_str().unwrap(),
            "--otlp-endpoint",
            &otlp,
        ],
        &[("OTEL_BSP_SCHEDULE_DELAY", "100")],
    );
    let base = &runner.url;
    let (trace, parent) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let tp = format!("00-{trace}-{parent}-01");

    // a malformed traceparent is refused, naming it
    let r = http()
        .post(format!("{base}/v1/tasks"))
        .header("traceparent", "00-xyz-01")
        .json(&json!({"plugin": "noop"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let body = r.text().await.unwrap();
    assert!(body.contains("traceparent"), "{body}");

    // an auto-feed meal with one card: it emits two events and schedules the next finish
    let r = http()
        .post(format!("{base}/v1/tasks"))
        .header("traceparent", &tp)
        .json(&json!({"id": "meal-1", "plugin": "auto-feed", "payload":
            {"pet_id": "p1", "user_id": "u1", "meal_ms": 1000, "auto_feed_cards": 1}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let (s, task) = call("GET", &format!("{base}/v1/tasks/meal-1"), None).await;
    assert_eq!(s, 200);
    assert_eq!(task["traceparent"], json!(tp), "{task}");

    // the runs of the meal and of its follow-up, each with its children
    let spans = eventually(T, "the spans of both runs", || async {
        let spans = got.lock().unwrap().clone();
        let runs = spans
            .iter()
            .filter(|s| s.name == "task.run" && s.trace == trace)
            .count();
        let finishes = spans
            .iter()
            .filter(|s| s.name == "task.finish" && s.trace == trace)
            .count();
        (runs >= 2 && finishes >= 2).then_some(spans)
    })
    .await;
    let in_trace: Vec<&Got> = spans.iter().filter(|s| s.trace == trace).collect();
    let first = in_trace
        .iter()
        .find(|s| s.name == "task.run" && s.parent == parent)
        .unwrap_or_else(|| {
            panic!("no run span with the traceparent's span as parent: {in_trace:#?}")
        });
    assert!(
        first
            .attrs
            .get("task.id")
            .is_some_and(|v| v.contains("meal-1")),
        "{first:?}"
    );
    for child in ["plugin.call", "effects.commit", "task.finish"] {
        assert!(
            in_trace
                .iter()
                .any(|s| s.name == child && s.parent == first.id),
            "no {child} span under the run: {in_trace:#?}"
        );
    }
    let carried = format!("00-{trace}-{}-01", first.id);
    let follow = in_trace
        .iter()
        .find(|s| s.name == "task.run" && s.parent == first.id)
        .unwrap_or_else(|| panic!("the follow-up's run is not a child of the run: {in_trace:#?}"));
    assert_ne!(follow.id, first.id);

    // every event of the meal's run carries the run's context; the follow-up's events its own
    let events = stream_fields(&redis, &events_key("auto-feed", "pet"));
    let of_meal: Vec<_> = events.iter().filter(|e| e["task_id"] == "meal-1").collect();
    assert_eq!(of_meal.len(), 2, "{events:?}");
    for e in &of_meal {
        assert_eq!(e.get("traceparent"), Some(&carried), "{e:?}");
    }
    let follow_id = events
        .iter()
        .find(|e| e["task_id"] != "meal-1")
        .map(|e| e["task_id"].clone())
        .unwrap_or_else(|| panic!("the follow-up emitted nothing: {events:?}"));
    let (s, task) = call("GET", &format!("{base}/v1/tasks/{follow_id}"), None).await;
    assert_eq!(s, 200, "{task}");
    assert_eq!(task["traceparent"], json!(carried), "{task}");
    for e in events.iter().filter(|e| e["task_id"] == follow_id) {
        let tp = &e["traceparent"];
        assert_eq!(tp, &format!("00-{trace}-{}-01", follow.id), "{e:?}");
    }
}
