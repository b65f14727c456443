//! fusebox's test suite: one binary, one module per layer.

mod cli;
mod compose;
mod harness;
mod properties;
mod reference;
mod vectors;
