//! fusebox: a shared circuit-breaker and permit service.
//!
//! A fleet asks fusebox before it calls a dependency: `Acquire(key)` answers
//! with a decision and a ticket, the caller does its call, then reports
//! `Complete(ticket, outcome)`. Because the state is central, the whole fleet
//! shares one breaker per key: after a break exactly one probe goes out.
//!
//! Layout, with doors that open one way only:
//! - [`domain`]: the pure rules (breaker, limiters, permit book, the
//!   combined decision). No I/O, no clock: every call takes `now`.
//! - [`engine`]: keyed state in a sharded map, tickets, waiters, the timer,
//!   the clock and the config.
//! - [`server`]: the gRPC services, which only convert and delegate.
//! - [`http`]: metrics, health and the dashboard over HTTP.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod domain;
pub mod engine;
pub mod http;
pub mod proto;
pub mod server;
