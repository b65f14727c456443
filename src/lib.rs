//! fusebox: a shared circuit-breaker and permit service.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod domain;
