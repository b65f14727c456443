//! The client side of the `fusebox` command: calls to a server and what
//! they print, for people and (`--json`) for programs.
//!
//! The `fusebox` binary parses its flags and calls in here; the load tool
//! (`fusebox-bench`) reaches servers through [`mod@connect`] too, so that a
//! connection, its credentials and its TLS are set up in one place. The
//! crate speaks gRPC through `fusebox-proto` only: it holds none of the
//! server.
//!
//! Layout, each module using only those listed before it:
//! - [`mod@connect`]: the server's address, the bearer token and TLS
//!   ([`ClientOptions`]), the connection, and failed calls in words that
//!   say what to do ([`call_error`]).
//! - [`mod@print`]: keys, decisions and transitions in words and in JSON, and
//!   times and durations for people.
//! - [`table`]: the aligned tables the commands and the load tool print.
//! - [`signal`]: the signals that stop a command that runs until stopped.
//! - [`calls`]: the one-call commands (`acquire`, `complete`, `get`,
//!   `isolate`, `close`, `advance`).
//! - [`mod@keys`], [`mod@watch`], [`mod@top`]: the operations commands.
//! - [`mod@policies`]: the rules in force and the default.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod calls;
pub mod connect;
pub mod keys;
pub mod policies;
pub mod print;
pub mod signal;
pub mod table;
pub mod top;
pub mod watch;

pub use connect::{call_error, connect, tls_config_of, ClientOptions, Conn, Credentials};
pub use keys::{keys, PhaseArg};
pub use policies::policies;
pub use table::render_table;
pub use top::top;
pub use watch::watch;
