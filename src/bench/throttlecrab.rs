//! A client of throttlecrab-server's gRPC API (`throttlecrab.RateLimiter`,
//! its `proto/throttlecrab.proto`), written out by hand: one unary call,
//! `Throttle`, a GCRA rate-limit check of one key.
//!
//! The check asks for a limit no caller of the benchmark reaches (a burst
//! and a rate of 1,000,000,000 per 60 s), so that every check is allowed and
//! does the same work: read the key's state, decide, write it back.

use tonic::Status;

use crate::channel::{self, Channel};

/// `throttlecrab.ThrottleRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ThrottleRequest {
    #[prost(string, tag = "1")]
    pub(crate) key: String,
    #[prost(int32, tag = "2")]
    pub(crate) max_burst: i32,
    #[prost(int32, tag = "3")]
    pub(crate) count_per_period: i32,
    #[prost(int32, tag = "4")]
    pub(crate) period: i32,
    #[prost(int32, tag = "5")]
    pub(crate) quantity: i32,
}

/// `throttlecrab.ThrottleResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ThrottleResponse {
    #[prost(bool, tag = "1")]
    pub(crate) allowed: bool,
    #[prost(int32, tag = "2")]
    pub(crate) limit: i32,
    #[prost(int32, tag = "3")]
    pub(crate) remaining: i32,
    #[prost(int32, tag = "4")]
    pub(crate) retry_after: i32,
    #[prost(int32, tag = "5")]
    pub(crate) reset_after: i32,
}

/// The limit every check asks for: never reached by the benchmark.
const LIMIT: i32 = 1_000_000_000;

/// A `throttlecrab.RateLimiter` client on one connection.
pub(crate) struct Client {
    grpc: tonic::client::Grpc<Channel>,
}

impl Client {
    pub(crate) fn new(channel: Channel) -> Client {
        Client {
            grpc: tonic::client::Grpc::new(channel),
        }
    }

    /// One `Throttle` check of `key`, quantity 1.
    pub(crate) async fn throttle(&mut self, key: String) -> Result<ThrottleResponse, Status> {
        let request = ThrottleRequest {
            key,
            max_burst: LIMIT,
            count_per_period: LIMIT,
            period: 60,
            quantity: 1,
        };
        channel::unary(
            &mut self.grpc,
            "/throttlecrab.RateLimiter/Throttle",
            request,
            "throttlecrab",
        )
        .await
    }
}
