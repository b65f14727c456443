//! A client of Envoy's rate-limit service protocol
//! (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`), the
//! protocol fusebox and envoyproxy/ratelimit both serve. The messages are
//! written out by hand: only the fields the load tool sends and reads, with
//! their upstream names and field numbers, so that the tool measures any
//! server of the protocol without depending on the server's own crates.

use tonic::Status;

use crate::channel::{self, Channel};

/// `envoy.service.ratelimit.v3.RateLimitRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RateLimitRequest {
    #[prost(string, tag = "1")]
    pub(crate) domain: String,
    #[prost(message, repeated, tag = "2")]
    pub(crate) descriptors: Vec<RateLimitDescriptor>,
    #[prost(uint32, tag = "3")]
    pub(crate) hits_addend: u32,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RateLimitDescriptor {
    #[prost(message, repeated, tag = "1")]
    pub(crate) entries: Vec<Entry>,
    #[prost(message, optional, tag = "2")]
    pub(crate) limit: Option<RateLimitOverride>,
    /// `google.protobuf.UInt64Value`: set (even to 0) overrides the
    /// request's `hits_addend` for this descriptor.
    #[prost(message, optional, tag = "3")]
    pub(crate) hits_addend: Option<UInt64Value>,
}

/// `RateLimitDescriptor.Entry`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Entry {
    #[prost(string, tag = "1")]
    pub(crate) key: String,
    #[prost(string, tag = "2")]
    pub(crate) value: String,
}

/// `RateLimitDescriptor.RateLimitOverride`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RateLimitOverride {
    #[prost(uint32, tag = "1")]
    pub(crate) requests_per_unit: u32,
    /// `envoy.type.v3.RateLimitUnit`: 1 second, 2 minute, 3 hour, 4 day.
    #[prost(int32, tag = "2")]
    pub(crate) unit: i32,
}

/// `google.protobuf.UInt64Value`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct UInt64Value {
    #[prost(uint64, tag = "1")]
    pub(crate) value: u64,
}

/// `envoy.service.ratelimit.v3.RateLimitResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RateLimitResponse {
    /// 0 unknown, 1 OK, 2 OVER_LIMIT.
    #[prost(int32, tag = "1")]
    pub(crate) overall_code: i32,
    #[prost(message, repeated, tag = "2")]
    pub(crate) statuses: Vec<DescriptorStatus>,
}

/// `RateLimitResponse.DescriptorStatus`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct DescriptorStatus {
    #[prost(int32, tag = "1")]
    pub(crate) code: i32,
    #[prost(message, optional, tag = "2")]
    pub(crate) current_limit: Option<RateLimit>,
    #[prost(uint32, tag = "3")]
    pub(crate) limit_remaining: u32,
    #[prost(message, optional, tag = "4")]
    pub(crate) duration_until_reset: Option<Duration>,
}

/// `google.protobuf.Duration`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Duration {
    #[prost(int64, tag = "1")]
    pub(crate) seconds: i64,
    #[prost(int32, tag = "2")]
    pub(crate) nanos: i32,
}

/// `RateLimitResponse.RateLimit`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RateLimit {
    #[prost(uint32, tag = "1")]
    pub(crate) requests_per_unit: u32,
    /// 1 second, 2 minute, 3 hour, 4 day.
    #[prost(int32, tag = "2")]
    pub(crate) unit: i32,
    #[prost(string, tag = "3")]
    pub(crate) name: String,
}

/// `RateLimitResponse.Code::OVER_LIMIT`.
pub(crate) const OVER_LIMIT: i32 = 2;

/// The name of a `RateLimitResponse.Code`.
pub(crate) fn code_name(code: i32) -> &'static str {
    match code {
        1 => "OK",
        2 => "OVER_LIMIT",
        _ => "UNKNOWN",
    }
}

/// The name of a `RateLimit.Unit`.
pub(crate) fn unit_name(unit: i32) -> &'static str {
    match unit {
        1 => "second",
        2 => "minute",
        3 => "hour",
        4 => "day",
        5 => "month",
        6 => "year",
        7 => "week",
        _ => "unknown",
    }
}

/// A one-descriptor request of `domain` with one entry `key=value`.
pub(crate) fn one_entry(domain: &str, key: &str, value: String) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: key.to_owned(),
                value,
            }],
            limit: None,
            hits_addend: None,
        }],
        hits_addend: 0,
    }
}

/// A `RateLimitService` client on one connection.
pub(crate) struct Client {
    grpc: tonic::client::Grpc<Channel>,
}

impl Client {
    pub(crate) fn new(channel: Channel) -> Client {
        Client {
            grpc: tonic::client::Grpc::new(channel),
        }
    }

    /// One `ShouldRateLimit` call.
    pub(crate) async fn should_rate_limit(
        &mut self,
        request: RateLimitRequest,
    ) -> Result<RateLimitResponse, Status> {
        channel::unary(
            &mut self.grpc,
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            request,
            "rate-limit service",
        )
        .await
    }
}
