//! `[telemetry]`: where the server sends its traces (OTLP over gRPC), as
//! written and validated. Without the section no trace is made at all.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::ConfigError;

/// The service name spans carry by default (`service.name`).
pub const DEFAULT_SERVICE_NAME: &str = "fusebox";

/// The most headers `[telemetry] headers` may hold.
pub const MAX_HEADERS: usize = 32;

/// `[telemetry]` as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySpec {
    /// The OTLP/gRPC receiver (a collector, Jaeger, Tempo):
    /// `http://HOST:PORT`.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the spans; `"fusebox"` by default.
    pub service_name: Option<String>,
    /// The share of new traces kept, from 0 to 1 (1 by default); a caller's
    /// trace is kept when the caller kept it (parent-based).
    pub sample_ratio: Option<f64>,
    /// gRPC metadata sent with every export (for a receiver's
    /// authentication), lower-case names.
    pub headers: Option<BTreeMap<String, String>>,
    /// Whether a caller's sampled flag (`traceparent`) decides if its
    /// trace is kept (true by default); false: only `sample_ratio` does,
    /// drawn at random, whatever the caller sent.
    pub follow_caller_sampling: Option<bool>,
    /// Spans kept for export at most; past it new spans are dropped and
    /// counted (2048 by default).
    pub max_queued_spans: Option<u64>,
}

/// `[telemetry]`, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct TelemetryConfig {
    /// The receiver, `http://HOST:PORT`.
    pub otlp_endpoint: String,
    /// `service.name`.
    pub service_name: String,
    /// The share of new traces kept (0..=1).
    pub sample_ratio: f64,
    /// Metadata sent with every export.
    pub headers: Vec<(String, String)>,
    /// Whether a caller's sampled flag decides if its trace is kept.
    pub follow_caller_sampling: bool,
    /// Spans kept for export at most.
    pub max_queued_spans: usize,
}

/// The most spans `[telemetry] max_queued_spans` may keep.
pub const MAX_QUEUED_SPANS: u64 = 65_536;

/// Spans kept for export by default.
pub const DEFAULT_QUEUED_SPANS: u64 = 2_048;

/// Whether a header `name` carries a credential: sent in the clear to a
/// plain `http://` receiver, anyone on the path could read it.
fn is_credential(name: &str) -> bool {
    matches!(name, "authorization" | "proxy-authorization" | "cookie")
        || [
            "token", "secret", "password", "api-key", "apikey", "api_key", "auth",
        ]
        .iter()
        .any(|w| name.contains(w))
}

fn invalid(field: &str, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        rule: "[telemetry]".into(),
        field: field.into(),
        problem: problem.into(),
    }
}

impl TelemetrySpec {
    /// Checks every field; errors name it.
    pub fn validate(&self) -> Result<TelemetryConfig, ConfigError> {
        let endpoint = self.otlp_endpoint.as_deref().ok_or_else(|| {
            invalid(
                "otlp_endpoint",
                "is missing: name the OTLP/gRPC receiver, e.g. \"http://127.0.0.1:4317\", or remove [telemetry] to send no traces",
            )
        })?;
        let otlp_endpoint = endpoint_of(endpoint).map_err(|p| invalid("otlp_endpoint", p))?;
        let service_name = self
            .service_name
            .clone()
            .unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_owned());
        if service_name.trim().is_empty()
            || service_name.len() > 256
            || service_name.chars().any(char::is_control)
        {
            return Err(invalid(
                "service_name",
                "must be 1 to 256 printable characters, e.g. \"fusebox\"",
            ));
        }
        let sample_ratio = self.sample_ratio.unwrap_or(1.0);
        if !(0.0..=1.0).contains(&sample_ratio) {
            return Err(invalid(
                "sample_ratio",
                format!("is {sample_ratio}: must be from 0 (keep only the callers' sampled traces) to 1 (keep every trace)"),
            ));
        }
        let headers: Vec<(String, String)> = self
            .headers
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();
        if headers.len() > MAX_HEADERS {
            return Err(invalid(
                "headers",
                format!("has {} entries, more than {MAX_HEADERS}", headers.len()),
            ));
        }
        for (name, value) in &headers {
            let name_ok = !name.is_empty()
                && !name.ends_with("-bin")
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b));
            if !name_ok {
                return Err(invalid(
                    &format!("headers.{name}"),
                    "is not a gRPC header name: use lower-case letters, digits, '-', '_' or '.' (e.g. \"authorization\")",
                ));
            }
            if value.bytes().any(|b| !(0x20..0x7f).contains(&b)) {
                return Err(invalid(
                    &format!("headers.{name}"),
                    "must be printable ASCII text",
                ));
            }
            // Every endpoint is plain http:// today (TLS is refused above).
            if is_credential(name) {
                return Err(invalid(
                    &format!("headers.{name}"),
                    format!("is a credential, and otlp_endpoint {otlp_endpoint:?} is plain http://: anyone on the path could read it; run a collector beside the server that adds it on a TLS link, or remove the header"),
                ));
            }
        }
        let max_queued_spans = match self.max_queued_spans {
            None => DEFAULT_QUEUED_SPANS,
            Some(n) if (1..=MAX_QUEUED_SPANS).contains(&n) => n,
            Some(n) => {
                return Err(invalid(
                    "max_queued_spans",
                    format!("is {n}: must be from 1 to {MAX_QUEUED_SPANS}"),
                ))
            }
        };
        Ok(TelemetryConfig {
            otlp_endpoint,
            service_name,
            sample_ratio,
            headers,
            follow_caller_sampling: self.follow_caller_sampling.unwrap_or(true),
            max_queued_spans: max_queued_spans as usize,
        })
    }
}

/// `text` as an OTLP/gRPC endpoint: `http://HOST:PORT`, nothing after.
fn endpoint_of(text: &str) -> Result<String, String> {
    let example =
        "write it as \"http://HOST:PORT\", e.g. \"http://127.0.0.1:4317\" (OTLP over gRPC)";
    if text.starts_with("https://") {
        return Err(format!(
            "{text:?}: TLS to the receiver is not supported yet; {example} and run a collector beside the server"
        ));
    }
    let Some(rest) = text.strip_prefix("http://") else {
        return Err(format!("{text:?} is not an http:// address; {example}"));
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.contains(['/', '?', '#', '@']) {
        return Err(format!(
            "{text:?} must be a host and a port and nothing else; {example}"
        ));
    }
    let uri: http::uri::Authority = authority
        .parse()
        .map_err(|_| format!("{text:?} has no valid host and port; {example}"))?;
    if uri.port_u16().is_none() || uri.host().is_empty() {
        return Err(format!(
            "{text:?} must be a host and a port and nothing else; {example}"
        ));
    }
    Ok(format!("http://{authority}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(spec: TelemetrySpec) -> String {
        match spec.validate() {
            Err(ConfigError::Invalid { rule, field, .. }) => {
                assert_eq!(rule, "[telemetry]");
                field
            }
            other => panic!("{spec:?}: {other:?}"),
        }
    }

    fn at(endpoint: &str) -> TelemetrySpec {
        TelemetrySpec {
            otlp_endpoint: Some(endpoint.to_owned()),
            ..TelemetrySpec::default()
        }
    }

    #[test]
    fn an_endpoint_is_a_host_and_a_port_over_http() {
        let config = at("http://collector.internal:4317/")
            .validate()
            .expect("valid");
        assert_eq!(config.otlp_endpoint, "http://collector.internal:4317");
        assert_eq!(config.service_name, "fusebox");
        assert_eq!(config.sample_ratio, 1.0);
        for bad in [
            "collector:4317",
            "http://collector",
            "http://collector:4317/v1/traces",
            "https://collector:4317",
            "http://:4317",
            "http://a b:1",
            "",
        ] {
            assert_eq!(field_of(at(bad)), "otlp_endpoint", "{bad:?}");
        }
        assert_eq!(field_of(TelemetrySpec::default()), "otlp_endpoint");
    }

    #[test]
    fn every_other_field_is_checked_by_name() {
        let ratio = TelemetrySpec {
            sample_ratio: Some(1.5),
            ..at("http://127.0.0.1:4317")
        };
        assert_eq!(field_of(ratio), "sample_ratio");
        let nan = TelemetrySpec {
            sample_ratio: Some(f64::NAN),
            ..at("http://127.0.0.1:4317")
        };
        assert_eq!(field_of(nan), "sample_ratio");
        let name = TelemetrySpec {
            service_name: Some(" ".into()),
            ..at("http://127.0.0.1:4317")
        };
        assert_eq!(field_of(name), "service_name");
        let header = TelemetrySpec {
            headers: Some([("Authorization".to_owned(), "x".to_owned())].into()),
            ..at("http://127.0.0.1:4317")
        };
        assert_eq!(field_of(header), "headers.Authorization");
        let value = TelemetrySpec {
            headers: Some([("authorization".to_owned(), "a\nb".to_owned())].into()),
            ..at("http://127.0.0.1:4317")
        };
        assert_eq!(field_of(value), "headers.authorization");
        let queue = TelemetrySpec {
            max_queued_spans: Some(0),
            ..at("http://127.0.0.1:4317")
        };
        assert_eq!(field_of(queue), "max_queued_spans");
    }

    /// A credential header would cross the network in the clear to a
    /// plain http:// receiver: refused at load, naming the field; other
    /// headers are taken.
    #[test]
    fn credential_headers_on_a_plain_endpoint_are_refused() {
        for name in [
            "authorization",
            "x-api-key",
            "x-auth-token",
            "proxy-authorization",
        ] {
            let spec = TelemetrySpec {
                headers: Some([(name.to_owned(), "Bearer s3cret".to_owned())].into()),
                ..at("http://collector.internal:4317")
            };
            assert_eq!(field_of(spec), format!("headers.{name}"));
        }
        let tenant = TelemetrySpec {
            headers: Some([("x-scope-orgid".to_owned(), "team-a".to_owned())].into()),
            ..at("http://collector.internal:4317")
        };
        let config = tenant.validate().expect("not a credential");
        assert_eq!(config.headers.len(), 1);
        assert!(config.follow_caller_sampling, "the default");
        assert_eq!(config.max_queued_spans, 2048);
    }
}
