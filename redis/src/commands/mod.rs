//! The module's commands, one file per job: each parses its arguments,
//! opens the key, runs one domain step and stores it ([`crate::keyed`]).
//! Every command is deterministic given what gets replicated: what it
//! wrote goes to the replicas and the AOF as bytes (`FB.PATCH`), so they
//! reach the same state without running the step.
//!
//! A step that fails is refused before anything is written (SPEC E3): the
//! arguments and the conditions the domain would refuse (a time before the
//! key's last, a ticket id in use, an unknown ticket) are checked first.
//! Errors are `ERR <field>: <what to do>` ([`crate::refusal`]).
//!
//! - [`node`]: what a node says of itself and of a key's name
//!   (`FB.VERSION`, `FB.KEYCHECK`, `FB.FENCE`);
//! - [`tickets`]: a caller's decisions (`FB.ACQUIRE`, `FB.COMPLETE`,
//!   `FB.RENEW`), the hot path;
//! - [`operator`]: an operator's or a server's changes to a key
//!   (`FB.ISOLATE`, `FB.CLOSE`, `FB.POLICY`);
//! - [`waiters`]: queued requests (`FB.SETTLE`, `FB.WITHDRAW`);
//! - [`charges`]: charges without tickets over several keys of one
//!   slot, all or nothing (`FB.CHARGE`, Envoy's rate-limit service);
//! - [`reads`]: reads that write nothing (`FB.GET`, `FB.LIST`,
//!   `FB.CENSUS`).

pub mod charges;
pub mod node;
pub mod operator;
pub mod reads;
pub mod tickets;
pub mod waiters;

pub use charges::charge;
pub use node::{fence, keycheck, version};
pub use operator::{close, isolate, set_policy};
pub use reads::{census, get, list, LIST_MAX_COUNT};
pub use tickets::{acquire, complete, renew};
pub use waiters::{settle, withdraw};
