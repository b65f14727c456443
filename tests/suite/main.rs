//! fusebox's test suite: one binary, one module per layer.

mod admin;
mod auth;
mod bad_input;
mod cli;
mod cli_ops;
mod client_tool;
mod command;
mod compose;
mod dashboard;
mod decide;
mod determinism;
mod durable;
mod failover;
mod fleet;
mod fuzz;
mod guard;
mod half_open;
mod harness;
mod hostile;
mod http;
mod in_process;
mod outcomes;
mod process;
mod properties;
mod queues;
mod quorum;
// The Redis module's harness (real redis-servers with the module loaded).
#[path = "../../redis/tests/module/harness.rs"]
#[allow(dead_code)]
mod redis_harness;
mod reference;
mod reload;
#[path = "../../redis/tests/module/resp.rs"]
#[allow(dead_code)]
mod resp;
mod rls;
mod scale;
mod scenarios;
mod servers;
mod service;
mod shadow;
mod shares;
mod store;
mod store_down;
mod store_trust;
mod telemetry;
mod tenants;
mod tls;
mod tools;
mod vectors;
mod watch;
