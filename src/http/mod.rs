//! The HTTP side of fusebox (`--http ADDR`): `/metrics` in the Prometheus
//! text format, `/healthz`, `/readyz`, and the live dashboard at `/`. Like
//! the gRPC services, it only converts and delegates to the engine.
//!
//! | route | what |
//! |---|---|
//! | `GET /metrics` | the Prometheus text format ([`metrics`]) |
//! | `GET /healthz` | 200 while the process answers |
//! | `GET /readyz` | 200 while the engine takes requests, 503 once it shuts down |
//! | `GET /` | the dashboard (assets embedded in the binary) |
//! | `GET /api/overview?prefix=` | totals, the keys not closed, the busiest keys, their sparklines ([`api::Overview`]) |
//! | `GET /api/keys?prefix=&after=&limit=` | a page of keys in key order, at most 100 ([`api::Page`]) |
//! | `GET /api/transitions?prefix=` | the last transitions, oldest first |
//! | `GET /api/events?prefix=` | server-sent events: the overview every round, and changes ([`events`]) |
//! | `POST /api/keys/{key}/isolate` | isolate, with `{"reason": "..."}` (who: `dashboard:PEER`) |
//! | `POST /api/keys/{key}/close` | close, with `{"reason": "..."}` |
//!
//! Nothing here walks every key: totals come from [`Engine::totals`](crate::engine::Engine::totals), the
//! rows from bounded reads ([`Engine::busiest`](crate::engine::Engine::busiest), [`Engine::list`](crate::engine::Engine::list) pages),
//! and one sampler task ([`trends`]) serves every viewer.
//!
//! Connections are capped (`[server] max_http_connections`, lowered if
//! need be to fit the open-file limit); one that does not send a request's
//! headers within `[server] handshake_timeout` is closed, and so is one
//! whose peer reads nothing of an answer for `[server] http_write_timeout`
//! (a connection is busy until its answer is written: `slots`); a body past
//! [`api::MAX_BODY_BYTES`] is refused (413) before it is read.
//!
//! A key in a path is percent-encoded (`payments%2Fcharge`). API errors are
//! `{"error": {"field": ..., "message": ...}}`. There is no authentication:
//! like the gRPC Admin service, the port is for operators only (the default
//! address is loopback). With `[tls]` (unless `http = false`) the port
//! speaks TLS with the gRPC port's certificate ([`serve_upgraded`]), and with
//! `client_ca` it asks for client certificates in the same way.
//!
//! This file only names the others and opens their doors; none of them
//! imports a file that imports it: `json` (the JSON forms), `history`
//! (the timeline), `error` (refusals as HTTP statuses, in one place),
//! [`trends`] (the sampler), `slots` (connection slots), `state` (what
//! the handlers share, one per server), [`guard`], [`api`], [`events`],
//! [`metrics`], `dashboard`, `routes` and `serve`.

pub mod api;
mod dashboard;
mod error;
pub mod events;
pub mod guard;
mod history;
mod json;
pub mod metrics;
mod routes;
mod serve;
mod slots;
mod state;
pub mod trends;

pub use error::ApiError;
pub use history::{History, HISTORY};
pub use json::{unix_ms, KeyJson, PhaseCounts, TotalsJson, TransitionJson};
pub use routes::{router, router_of, router_with};
pub use serve::{serve, serve_upgraded, serve_with, DEFAULT_HTTP_ADDR, SHUTDOWN_LINGER};
pub use slots::SlotFigures;
pub use state::{AppState, HttpFigures, Options, StreamSlot, Streams, MAX_EVENT_STREAMS};
