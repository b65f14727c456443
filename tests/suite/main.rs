//! fusebox's test suite: one binary, one module per layer.

mod bad_input;
mod cli;
mod compose;
mod fleet;
mod harness;
mod properties;
mod queues;
mod reference;
mod service;
mod vectors;
