//! fusebox's test suite: one binary, one module per layer.

mod vectors;
