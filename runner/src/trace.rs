//! Logs and traces: the `tracing` subscriber, and OpenTelemetry export over OTLP/HTTP when
//! `--otlp-endpoint` is given.
//!
//! A task may carry a W3C `traceparent` (sent with `POST /v1/tasks`, stored with the task). Its
//! run is a `task.run` span whose parent is that context, with `plugin.call`, `effects.commit`
//! and `task.finish` below it; follow-ups carry the run's context on, and each event the run
//! emits has a `traceparent` field, so a consumer's span joins the same trace.
//!
//! Task spans use the target [`TARGET`]: only the OpenTelemetry layer listens to it, so without
//! an endpoint those spans are disabled at their call sites and cost nothing on the hot path.

use anyhow::{Context as _, Result, bail};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, filter};

/// The target of the spans exported as traces (and never logged).
pub const TARGET: &str = "eggtimer::trace";

/// Keeps the exporter; flushes the spans not yet sent when dropped.
pub struct Tracing {
    provider: Option<SdkTracerProvider>,
}

impl Drop for Tracing {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take()
            && let Err(e) = p.shutdown()
        {
            eprintln!("eggtimer: flushing traces: {e}");
        }
    }
}

/// Installs the global subscriber: logs to stderr filtered by `log` (an `EnvFilter`, in colour
/// only when stderr is a terminal), and, with
/// an OTLP endpoint (`http://host:4318`, or a URL ending in `/v1/traces`), task spans exported.
pub fn init(log: &str, otlp_endpoint: Option<&str>) -> Result<Tracing> {
    let logs = EnvFilter::try_new(log)
        .unwrap_or_else(|_| EnvFilter::new("info"))
        .add_directive(format!("{TARGET}=off").parse().expect("a valid directive"));
    // colours only on a terminal: a log file or journald gets plain text
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(logs);
    let Some(endpoint) = otlp_endpoint else {
        tracing_subscriber::registry().with(fmt).init();
        return Ok(Tracing { provider: None });
    };
    let url = if endpoint.trim_end_matches('/').ends_with("/v1/traces") {
        endpoint.to_owned()
    } else {
        format!("{}/v1/traces", endpoint.trim_end_matches('/'))
    };
    if !url.starts_with("http://") && !url.starts_with("https://") {
        bail!("--otlp-endpoint {endpoint}: expected an http:// or https:// URL (OTLP over HTTP)");
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(url)
        .build()
        .context("building the OTLP exporter")?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name("eggtimer")
                .build(),
        )
        .build();
    let otel = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("eggtimer"))
        .with_filter(filter::Targets::new().with_target(TARGET, tracing::Level::INFO));
    tracing_subscriber::registry().with(fmt).with(otel).init();
    Ok(Tracing {
        provider: Some(provider),
    })
}

/// Checks a W3C `traceparent` (`00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`, lower
/// case): malformed is an error; well formed but naming no trace (an id of zeros) is `None`, to
/// be ignored as the W3C spec says; else the traceparent to store.
pub fn parse_traceparent(tp: &str) -> std::result::Result<Option<String>, String> {
    let parts: Vec<&str> = tp.split('-').collect();
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let well_formed = parts.len() == 4
        && parts[0] == "00"
        && hex(parts[1], 32)
        && hex(parts[2], 16)
        && hex(parts[3], 2);
    if !well_formed {
        return Err(format!(
            "must be a W3C traceparent 00-<32 hex trace id>-<16 hex span id>-<2 hex flags> in lower case, got {:?}",
            tp.chars().take(80).collect::<String>()
        ));
    }
    Ok(extract(tp)
        .span()
        .span_context()
        .is_valid()
        .then(|| tp.to_owned()))
}

/// The context a `traceparent` names (an empty context when it names none).
fn extract(tp: &str) -> opentelemetry::Context {
    let carrier = std::collections::HashMap::from([("traceparent".to_owned(), tp.to_owned())]);
    TraceContextPropagator::new().extract(&carrier)
}

/// Makes `span` a child of the trace `traceparent` names (nothing when there is none).
pub fn set_parent(span: &tracing::Span, traceparent: Option<&str>) {
    if let Some(tp) = traceparent
        && !span.is_disabled()
    {
        let _ = span.set_parent(extract(tp));
    }
}

/// The `traceparent` that work started by `span` carries on: the span's own context when it is
/// exported, else the one the task came with (so a trace passes through a runner that does not
/// export).
pub fn child_traceparent(span: &tracing::Span, came_with: Option<&str>) -> Option<String> {
    if !span.is_disabled() {
        let cx = span.context();
        let sc = cx.span().span_context().clone();
        if sc.is_valid() {
            return Some(format!(
                "00-{}-{}-{:02x}",
                sc.trace_id(),
                sc.span_id(),
                sc.trace_flags().to_u8()
            ));
        }
    }
    came_with.map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_traceparents() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(parse_traceparent(tp), Ok(Some(tp.to_owned())));
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        ] {
            assert!(parse_traceparent(bad).is_err(), "{bad:?}");
        }
        for none in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        ] {
            assert_eq!(parse_traceparent(none), Ok(None), "{none:?}");
        }
    }

    #[test]
    fn carries_the_traceparent_through_a_disabled_span() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let span = tracing::Span::none();
        assert_eq!(child_traceparent(&span, Some(tp)).as_deref(), Some(tp));
        assert_eq!(child_traceparent(&span, None), None);
    }
}
