//! Traces over OTLP (`[telemetry]`): one span per Acquire, Complete and
//! Renew call, per Decide frame and per call of the other services that
//! ask for one, continuing the caller's W3C trace context (`traceparent`,
//! `tracestate`) from the call's headers.
//!
//! Without `[telemetry]` a server has no [`Telemetry`] and every [`Trace`]
//! is [`Trace::OFF`]: no header is read, no span or attribute is made.
//!
//! Spans are batched and sent on the runtime by the SDK's batch processor;
//! a receiver that does not answer never fails or slows a call: its spans
//! are dropped and counted, and the log says so once until it answers
//! again. Shutdown sends what is left ([`Telemetry::shutdown`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{
    Span as _, SpanKind, Status as SpanStatus, Tracer as _, TracerProvider as _,
};
use opentelemetry::Context;
/// An attribute of a span, for [`Trace::attribute`].
pub use opentelemetry::KeyValue;
use opentelemetry_otlp::{WithExportConfig, WithTonicConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider, SpanData, SpanExporter,
};
use tonic::metadata::{KeyRef, MetadataMap};

use crate::config::telemetry::TelemetryConfig;
use crate::proto::v1 as pb;

/// How long one export may take before it counts as failed.
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long shutdown waits for the last spans to be sent.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// `rpc.service` of the Fusebox service.
pub const FUSEBOX_SERVICE: &str = "fusebox.v1.Fusebox";

/// Spans sent and spans lost, for `/metrics`.
#[derive(Debug, Default)]
pub struct Figures {
    /// Spans the receiver took.
    pub exported: AtomicU64,
    /// Spans dropped because an export failed.
    pub failed: AtomicU64,
    /// Whether the last export failed (the log said so once).
    failing: AtomicBool,
}

/// One server's tracing: the exporter's pipeline and its figures.
#[derive(Debug)]
pub struct Telemetry {
    config: TelemetryConfig,
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    figures: Arc<Figures>,
    propagator: TraceContextPropagator,
}

impl Telemetry {
    /// Starts sending spans as `config` says. Must run on the Tokio
    /// runtime the server serves on (exports run there).
    pub fn start(config: &TelemetryConfig) -> anyhow::Result<Telemetry> {
        let mut metadata = MetadataMap::new();
        for (name, value) in &config.headers {
            let name = tonic::metadata::AsciiMetadataKey::from_bytes(name.as_bytes())
                .map_err(|_| anyhow::anyhow!("[telemetry]: headers.{name}: not a header name"))?;
            let value = value
                .parse()
                .map_err(|_| anyhow::anyhow!("[telemetry]: headers.{name}: not header text"))?;
            metadata.insert(name, value);
        }
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(config.otlp_endpoint.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .with_metadata(metadata)
            .build()
            .map_err(|e| anyhow::anyhow!("[telemetry]: otlp_endpoint: {e}"))?;
        let figures = Arc::new(Figures::default());
        let exporter = OnRuntime {
            inner: Arc::new(exporter),
            runtime: tokio::runtime::Handle::current(),
            endpoint: config.otlp_endpoint.clone(),
            figures: figures.clone(),
        };
        let sampler =
            Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(config.sample_ratio)));
        let provider = SdkTracerProvider::builder()
            .with_span_processor(BatchSpanProcessor::builder(exporter).build())
            .with_sampler(sampler)
            .with_resource(
                opentelemetry_sdk::Resource::builder()
                    .with_service_name(config.service_name.clone())
                    .build(),
            )
            .build();
        let tracer = provider.tracer_with_scope(
            opentelemetry::InstrumentationScope::builder("fusebox")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
        );
        tracing::info!(
            endpoint = %config.otlp_endpoint,
            service_name = %config.service_name,
            sample_ratio = config.sample_ratio,
            "traces are sent over OTLP/gRPC ([telemetry])"
        );
        Ok(Telemetry {
            config: config.clone(),
            provider,
            tracer,
            figures,
            propagator: TraceContextPropagator::new(),
        })
    }

    /// The settings it runs with.
    pub fn config(&self) -> &TelemetryConfig {
        &self.config
    }

    /// Spans sent and lost.
    pub fn figures(&self) -> &Figures {
        &self.figures
    }

    /// The caller's trace context on `headers` (an empty context when it
    /// sent none: the span starts a trace).
    pub fn parent_of(&self, headers: &MetadataMap) -> Context {
        self.propagator.extract(&Headers(headers))
    }

    /// A span for `method` of `service`, a child of `parent`.
    pub fn span(&self, parent: &Context, service: &'static str, method: &'static str) -> Trace {
        let span = self
            .tracer
            .span_builder(format!("{service}/{method}"))
            .with_kind(SpanKind::Server)
            .with_attributes([
                KeyValue::new("rpc.system", "grpc"),
                KeyValue::new("rpc.service", service),
                KeyValue::new("rpc.method", method),
            ])
            .start_with_context(&self.tracer, parent);
        Trace(Some(Box::new(span)))
    }

    /// Sends the spans not yet sent (at most [`SHUTDOWN_TIMEOUT`]) and stops.
    /// Blocks: call it off the runtime's workers.
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT) {
            tracing::warn!(
                endpoint = %self.config.otlp_endpoint,
                "the last traces may not have reached the receiver at shutdown: {e}"
            );
        }
    }
}

/// The caller's headers, as the propagator reads them.
struct Headers<'a>(&'a MetadataMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                KeyRef::Ascii(k) => Some(k.as_str()),
                KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

/// One call's span, ended when dropped; [`Trace::OFF`] (telemetry off)
/// records nothing and every method returns at once.
#[derive(Debug)]
#[must_use]
pub struct Trace(Option<Box<opentelemetry_sdk::trace::Span>>);

impl Trace {
    /// No span: telemetry is off.
    pub const OFF: Trace = Trace(None);

    /// Whether a span is being recorded.
    pub fn is_on(&self) -> bool {
        self.0.as_ref().is_some_and(|s| s.is_recording())
    }

    /// Sets the attribute `make` builds, only when a span is recorded.
    pub fn attribute(&mut self, make: impl FnOnce() -> KeyValue) {
        if let Some(span) = self.0.as_mut().filter(|s| s.is_recording()) {
            span.set_attribute(make());
        }
    }

    /// `fusebox.key`.
    pub fn key(&mut self, key: &str) {
        self.attribute(|| KeyValue::new("fusebox.key", key.to_owned()));
    }

    /// The gRPC status of the call (`rpc.grpc.status_code`), and the span's
    /// error status when it failed.
    pub fn ended<T>(&mut self, result: &Result<T, tonic::Status>) {
        let Some(span) = self.0.as_mut().filter(|s| s.is_recording()) else {
            return;
        };
        match result {
            Ok(_) => span.set_attribute(KeyValue::new("rpc.grpc.status_code", 0_i64)),
            Err(status) => {
                span.set_attribute(KeyValue::new("rpc.grpc.status_code", status.code() as i64));
                span.set_status(SpanStatus::error(status.message().to_owned()));
            }
        }
    }

    /// What an Acquire answered: `fusebox.decision`, `fusebox.reason` (when
    /// there is one) and `fusebox.phase`.
    pub fn acquired(&mut self, result: &Result<pb::AcquireResponse, tonic::Status>) {
        if !self.is_on() {
            return;
        }
        if let Ok(r) = result {
            self.attribute(|| {
                KeyValue::new(
                    "fusebox.decision",
                    name_of(r.decision().as_str_name(), "DECISION_"),
                )
            });
            if r.reason() != pb::Reason::Unspecified {
                self.attribute(|| {
                    KeyValue::new(
                        "fusebox.reason",
                        name_of(r.reason().as_str_name(), "REASON_"),
                    )
                });
            }
            self.attribute(|| {
                KeyValue::new("fusebox.phase", name_of(r.phase().as_str_name(), "PHASE_"))
            });
        }
        self.ended(result);
    }

    /// What a Complete answered: `fusebox.stale` and `fusebox.phase`.
    pub fn completed(&mut self, result: &Result<pb::CompleteResponse, tonic::Status>) {
        if !self.is_on() {
            return;
        }
        if let Ok(r) = result {
            self.attribute(|| KeyValue::new("fusebox.stale", r.stale));
            self.attribute(|| {
                KeyValue::new("fusebox.phase", name_of(r.phase().as_str_name(), "PHASE_"))
            });
        }
        self.ended(result);
    }
}

impl Drop for Trace {
    fn drop(&mut self) {
        if let Some(span) = self.0.as_mut() {
            span.end();
        }
    }
}

/// A wire enum's name without its prefix: `DECISION_GRANTED` -> `GRANTED`.
fn name_of(name: &'static str, prefix: &str) -> &'static str {
    name.strip_prefix(prefix).unwrap_or(name)
}

/// The OTLP exporter, run on the server's runtime (the batch processor
/// calls it from a thread of its own), counting what it sent and lost and
/// saying once when the receiver stops answering and once when it answers
/// again.
#[derive(Debug)]
struct OnRuntime<E> {
    inner: Arc<E>,
    runtime: tokio::runtime::Handle,
    endpoint: String,
    figures: Arc<Figures>,
}

impl<E: SpanExporter + 'static> SpanExporter for OnRuntime<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let count = batch.len() as u64;
        let inner = self.inner.clone();
        let sent = self
            .runtime
            .spawn(async move { inner.export(batch).await })
            .await;
        let result = sent.unwrap_or_else(|e| {
            Err(opentelemetry_sdk::error::OTelSdkError::InternalFailure(
                e.to_string(),
            ))
        });
        let figures = &self.figures;
        match &result {
            Ok(()) => {
                figures.exported.fetch_add(count, Ordering::Relaxed);
                if figures.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(endpoint = %self.endpoint, "the trace receiver answers again; spans are sent");
                }
            }
            Err(e) => {
                figures.failed.fetch_add(count, Ordering::Relaxed);
                if !figures.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        endpoint = %self.endpoint,
                        "could not send {count} spans to the trace receiver ({e}); calls are served as before, and spans are dropped until it answers: check that a collector listens at [telemetry] otlp_endpoint"
                    );
                }
            }
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.set_resource(resource);
        }
    }
}
