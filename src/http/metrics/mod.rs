//! `/metrics`: the server in the Prometheus text format (version 0.0.4),
//! written by the Prometheus project's Rust client (`prometheus-client`)
//! from a collector that reads the figures at scrape time. Every name
//! starts with `fusebox_`; every family, its type, help and labels are in
//! one table, [`FAMILIES`] (and, as a reference, in `reference.md` beside
//! this file, which a test keeps equal to the table).
//!
//! A scrape costs the same with a million keys as with ten: engine-wide
//! figures come from the store's totals, kept as they change, never from a
//! walk over the keys. Per-key series (label `key`) exist only for a
//! bounded set: the keys that exact rules name (each read on its own) and
//! the [`TOP_KEYS`] busiest keys; every other live key is counted in the
//! `fusebox_other_keys*` aggregates, which are the totals less the keys
//! shown.
//!
//! `process_resident_memory_bytes` (the standard name, so that load tools
//! and dashboards find it; the only name without the `fusebox_` prefix) is
//! the process's resident memory, from `/proc/self/status` (Linux only).
//!
//! The figures are one server's ([`crate::node::Node`]): two servers in
//! one process each show their own.
//!
//! `scrape` reads what a scrape needs first (the store's figures, the keys
//! shown); `families` is the table, with how each family is read;
//! `collector` writes the text.
#![doc = ""]
#![doc = include_str!("reference.md")]

mod collector;
mod families;
mod scrape;

pub use collector::{render, CONTENT_TYPE};
pub use families::{Family, Sink, Type, Value, When, FAMILIES};
pub use scrape::{resident_memory_bytes, Scrape, Shown, TOP_KEYS};

#[cfg(test)]
mod tests;
