//! The gRPC face of fusebox (SPEC section 8): services that convert wire
//! messages to engine calls and back, and nothing more. Errors become
//! `tonic::Status` in exactly one place (`status.rs`).
//!
//! This file only names the others and opens their doors; none of them
//! imports a file that imports it:
//! - `status`: errors and refusals as `tonic::Status`; `wire`: engine
//!   values in their wire forms; [`policy`]: policies on the wire.
//! - `bounds`: what one server's services bound together (Decide streams
//!   per connection, Decide frames in flight to the store, single calls
//!   that Decide parts yield to, Watch snapshot pages), made with its
//!   [`Api`], so that two servers in one process bound apart.
//! - `gate`: the credential checked on a call's headers; [`tls`]: what a
//!   request knows of its connection; `api`: the value the services share
//!   ([`Api`]), who called and what they may do.
//! - `unary`: Acquire, Complete and Renew as one call does them;
//!   [`decide`]: the Decide stream and the batches; `watch`: the Watch
//!   stream.
//! - `fusebox`, `admin`: the services; `calls`, `transport`, `run`:
//!   serving them until shutdown ([`run()`], [`run_with_tls`]).

mod admin;
mod api;
mod bounds;
mod calls;
pub mod decide;
mod fusebox;
mod gate;
pub mod policy;
mod rls;
mod run;
mod status;
pub mod tls;
mod transport;
mod unary;
mod watch;
mod wire;

pub use admin::{DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE};
pub use api::Api;
pub use run::{
    run, run_with_tls, MAX_ADMIN_REPLY_BYTES, MAX_MESSAGE_BYTES, RECEIVE_WINDOW_PER_CONNECTION,
    RECEIVE_WINDOW_PER_STREAM, SHUTDOWN_FLUSH, SHUTDOWN_GRACE,
};
pub use status::{status_of, status_of_refusal};
pub use wire::key_state_of;
