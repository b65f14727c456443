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
//! - [`engine`]: keyed state in a sharded map (or in Redis), tickets,
//!   waiters, the timer, the clock, the rules and the engine's caps. It
//!   knows nothing of the config file, credentials or connections.
//! - [`auth`]: who may do what; [`tls`]: certificates, reloaded when their
//!   files change; [`connections`]: the ports' caps and handshakes.
//! - [`config`]: the config file, validated into what each part takes.
//! - [`node`]: one server's own part beside its store (who may call, its
//!   caps, its counters and figures, its budget of unread answers, its
//!   TLS): nothing of a server is a process-wide static, so that two
//!   servers in one process stay apart; [`reload`]: the config watcher.
//! - [`server`]: the gRPC services, which only convert and delegate.
//! - [`http`]: metrics, health and the dashboard over HTTP.
//! - [`telemetry`]: traces over OTLP (`[telemetry]`), off by default.
//! - [`serve`]: start-up, from the config to both ports.
//! - [`outbox`]: what a stream answered and its client has not read,
//!   bounded per stream, per credential and per server; [`log_gate`]:
//!   log lines at most once a second.
//! - [`guard`]: a client library for services that call through fusebox
//!   (guard a call: acquire, run, complete; renewal, local short-circuit,
//!   fail open or closed). It uses only [`proto`].
//! - [`proto`]: the generated wire types, and the conversions ([`proto::wire`])
//!   that the gRPC services, the HTTP side and the client commands share.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod auth;
pub mod config;
pub mod connections;
pub use fusebox_domain as domain;
pub mod engine;
pub use fusebox_guard as guard;
pub mod http;
pub mod log_gate;
pub mod memory;
pub mod node;
pub mod outbox;
pub use fusebox_proto as proto;
pub mod reload;
pub mod rls;
pub mod serve;
pub mod server;
pub mod telemetry;
pub mod tls;

// HTTP keeps answering (`/readyz` 503) for as long as gRPC calls may drain.
const _: () = assert!(http::SHUTDOWN_LINGER.as_millis() == server::SHUTDOWN_GRACE.as_millis());
