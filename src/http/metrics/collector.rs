//! The exposition: a `prometheus-client` collector that writes every
//! family of [`FAMILIES`] from one [`Scrape`], in the Prometheus text
//! format 0.0.4.

use std::fmt;
use std::sync::Arc;

use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::families::{Sink, Type, When, FAMILIES};
use super::scrape::{Scrape, Shown};
use crate::engine::Store;
use crate::http::state::HttpFigures;
use crate::node::Node;

/// The content type of the text format served (Prometheus text 0.0.4,
/// what Prometheus asks for first and every scraper reads).
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Writes one scrape's families when the registry is encoded.
#[derive(Debug)]
struct Collector(Scrape);

impl Collector {
    /// Whether the families of `when` are in this scrape.
    fn has(&self, when: When) -> bool {
        let node = &self.0.node;
        match when {
            When::Always => true,
            When::Embedded => matches!(node.store(), Store::Embedded(_)),
            When::DataDir => node.store().storage_figures().is_some(),
            When::Store => node.store().store_figures().is_some(),
            When::Tls => node.tls().is_some(),
            When::Telemetry => node.telemetry().is_some(),
            When::TlsExpiry => node.tls().and_then(|t| t.expires_at()).is_some(),
            When::Linux => self.0.resident_memory.is_some(),
        }
    }
}

impl prometheus_client::collector::Collector for Collector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        let scrape = &self.0;
        // With a store, some figures are the whole store's, some this
        // server's own: their help says which.
        let fleet_wide = scrape.figures.fleet_wide;
        for family in FAMILIES.iter().filter(|f| self.has(f.when)) {
            let help = match (fleet_wide, family.store_help) {
                (true, Some(help)) => help,
                _ => family.help,
            };
            let metric_type = match family.kind {
                Type::Counter => MetricType::Counter,
                Type::Gauge => MetricType::Gauge,
            };
            let metric = encoder.encode_descriptor(family.base_name(), help, None, metric_type)?;
            family.read(scrape, &mut Sink::new(metric, family.kind))?;
        }
        Ok(())
    }
}

/// The whole exposition of `node`, with its HTTP side's figures `http`;
/// per-key series for the keys `shown`. A scrape costs the same with a
/// million keys as with ten (see the module's doc).
pub async fn render(node: &Arc<Node>, http: &HttpFigures, shown: &Shown) -> String {
    text_of(Scrape::read(node.clone(), *http, shown).await)
}

/// The text of `scrape`.
pub(super) fn text_of(scrape: Scrape) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Collector(scrape)));
    let mut text = String::with_capacity(16 * 1024);
    if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut text, &registry) {
        // Writing into a String fails only if a family's reader does.
        tracing::error!("/metrics could not be written whole ({e}); the scrape is cut short");
    }
    text
}
