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
    /// Spans dropped because `max_queued_spans` were waiting for export.
    pub dropped: AtomicU64,
    /// Spans waiting for export now (handed to the batch, not yet to an
    /// export).
    queued: AtomicU64,
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
        let queue = config.max_queued_spans.max(1);
        let batch = BatchSpanProcessor::builder(exporter)
            .with_batch_config(
                opentelemetry_sdk::trace::BatchConfigBuilder::default()
                    .with_max_queue_size(queue)
                    .with_max_export_batch_size(queue.min(512))
                    .build(),
            )
            .build();
        let processor = Bounded {
            inner: batch,
            figures: figures.clone(),
            cap: queue as u64,
        };
        let builder = SdkTracerProvider::builder().with_span_processor(processor);
        let builder = if config.follow_caller_sampling {
            builder.with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                config.sample_ratio,
            ))))
        } else {
            builder.with_sampler(OwnRatio(config.sample_ratio))
        };
        let provider = builder
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
        Trace(Some(Box::new(Recorded {
            span,
            pending: Vec::new(),
        })))
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
pub struct Trace(Option<Box<Recorded>>);

/// A recorded span and what is known of its call, put on the span only
/// once the call is past authorization ([`Trace::ended`]): a refused
/// call's span carries nothing its caller chose.
#[derive(Debug)]
struct Recorded {
    span: opentelemetry_sdk::trace::Span,
    pending: Vec<KeyValue>,
}

impl Trace {
    /// No span: telemetry is off.
    pub const OFF: Trace = Trace(None);

    /// Whether a span is being recorded.
    pub fn is_on(&self) -> bool {
        self.0.as_ref().is_some_and(|r| r.span.is_recording())
    }

    /// Keeps the attribute `make` builds, only when a span is recorded;
    /// it is set when the call ends past authorization ([`Trace::ended`]).
    pub fn attribute(&mut self, make: impl FnOnce() -> KeyValue) {
        if let Some(recorded) = self.0.as_mut().filter(|r| r.span.is_recording()) {
            recorded.pending.push(make());
        }
    }

    /// `fusebox.key`.
    pub fn key(&mut self, key: &str) {
        self.attribute(|| KeyValue::new("fusebox.key", key.to_owned()));
    }

    /// The gRPC status of the call (`rpc.grpc.status_code`), and the span's
    /// error status when it failed. The attributes kept so far are set
    /// only when the call was not refused for its credential
    /// (UNAUTHENTICATED, PERMISSION_DENIED): such a span carries the
    /// method and the code, and no word its caller chose (not even the
    /// refusal's message, which names the key).
    pub fn ended<T>(&mut self, result: &Result<T, tonic::Status>) {
        let Some(recorded) = self.0.as_mut().filter(|r| r.span.is_recording()) else {
            return;
        };
        let refused = matches!(
            result,
            Err(s) if matches!(s.code(), tonic::Code::Unauthenticated | tonic::Code::PermissionDenied)
        );
        let pending = std::mem::take(&mut recorded.pending);
        let span = &mut recorded.span;
        if !refused {
            for attribute in pending {
                span.set_attribute(attribute);
            }
        }
        match result {
            Ok(_) => span.set_attribute(KeyValue::new("rpc.grpc.status_code", 0_i64)),
            Err(status) => {
                span.set_attribute(KeyValue::new("rpc.grpc.status_code", status.code() as i64));
                let message = if refused {
                    format!("{:?}", status.code())
                } else {
                    status.message().to_owned()
                };
                span.set_status(SpanStatus::error(message));
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
        // Attributes never settled by `ended` are not set.
        if let Some(recorded) = self.0.as_mut() {
            recorded.span.end();
        }
    }
}

/// The sampler with `[telemetry] follow_caller_sampling = false`: the
/// share `sample_ratio` of calls, drawn at random, whatever the caller's
/// `traceparent` says (its sampled flag and its trace id, both its own
/// choice). The caller's trace is still continued when kept.
#[derive(Clone, Debug)]
struct OwnRatio(f64);

impl opentelemetry_sdk::trace::ShouldSample for OwnRatio {
    fn should_sample(
        &self,
        parent: Option<&Context>,
        _trace_id: opentelemetry::trace::TraceId,
        _name: &str,
        _kind: &SpanKind,
        _attributes: &[KeyValue],
        _links: &[opentelemetry::trace::Link],
    ) -> opentelemetry_sdk::trace::SamplingResult {
        use opentelemetry::trace::TraceContextExt as _;
        let keep = self.0 >= 1.0 || rand::random::<f64>() < self.0;
        opentelemetry_sdk::trace::SamplingResult {
            decision: if keep {
                opentelemetry_sdk::trace::SamplingDecision::RecordAndSample
            } else {
                opentelemetry_sdk::trace::SamplingDecision::Drop
            },
            attributes: Vec::new(),
            trace_state: parent
                .map(|cx| cx.span().span_context().trace_state().clone())
                .unwrap_or_default(),
        }
    }
}

/// The batch processor, with its queue bounded here so that what does
/// not fit is counted (`fusebox_trace_spans_dropped_total`): at most `cap`
/// spans wait for export; past it a new span is dropped.
#[derive(Debug)]
struct Bounded<P> {
    inner: P,
    figures: Arc<Figures>,
    cap: u64,
}

impl<P: opentelemetry_sdk::trace::SpanProcessor> opentelemetry_sdk::trace::SpanProcessor
    for Bounded<P>
{
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        let room = self
            .figures
            .queued
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.cap).then_some(n + 1)
            });
        if room.is_ok() {
            self.inner.on_end(span);
        } else if let Some(n) = crate::connections::seldom(&self.figures.dropped, 1) {
            tracing::warn!(
                dropped = n,
                "dropping a span: [telemetry] max_queued_spans ({}) wait for the receiver already; it is slow or down, or spans come faster than it takes them",
                self.cap
            );
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
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
        // Out of the queue ([`Bounded`]), whatever the export's fate.
        let _ = self
            .figures
            .queued
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(count))
            });
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
