//! fusebox's test suite: one binary, one module per layer.

mod admin;
mod auth;
mod bad_input;
mod bench;
mod cli;
mod cli_ops;
mod command;
mod compose;
mod dashboard;
mod durable;
mod fleet;
mod fuzz;
mod harness;
mod hostile;
mod http;
mod properties;
mod queues;
mod reference;
mod reload;
mod scale;
mod scenarios;
mod service;
mod tls;
mod tools;
mod vectors;
mod watch;
