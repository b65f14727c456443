//! Running the `fusebox` command as a subprocess, for the CLI tests.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::harness::{Server, BIN};

/// The longest any one command may take before the test gives up on it.
pub const PATIENCE: Duration = Duration::from_secs(30);

pub use crate::process::Run;

/// What a run of the command must have done.
impl Run {
    /// The standard output of a run that must have succeeded quietly.
    pub fn ok(&self) -> &str {
        assert_eq!(
            self.code,
            Some(0),
            "the command succeeds; stdout {:?}, stderr {:?}",
            self.stdout,
            self.stderr
        );
        assert_eq!(self.stderr, "", "nothing on standard error");
        &self.stdout
    }

    /// The one JSON document printed by a run that must have succeeded.
    pub fn json(&self) -> Value {
        let out = self.ok();
        assert_eq!(out.lines().count(), 1, "--json prints one line: {out:?}");
        serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out:?}"))
    }

    /// The error message of a run that must have failed with exit code
    /// `code`, saying `start` first.
    pub fn failed_saying(&self, code: i32, start: &str) -> &str {
        let message = self.failed(code);
        assert!(
            message.starts_with(start),
            "not {start:?} first: {message:?}"
        );
        message
    }

    /// The error message of a run that must have failed with exit code `code`.
    pub fn failed(&self, code: i32) -> &str {
        assert_eq!(
            self.code,
            Some(code),
            "the command fails with exit code {code}; stdout {:?}, stderr {:?}",
            self.stdout,
            self.stderr
        );
        assert_eq!(self.stdout, "", "a failed command prints nothing on stdout");
        &self.stderr
    }
}

/// Runs `fusebox ARGS` to the end.
pub async fn fusebox(args: &[&str]) -> Run {
    crate::process::run(Path::new(BIN), args, PATIENCE).await
}

/// Runs a client command against `server`: `ARGS --server ADDR`.
pub async fn client(server: &Server, args: &[&str]) -> Run {
    let mut all = args.to_vec();
    all.extend(["--server", server.addr.as_str()]);
    fusebox(&all).await
}

/// Runs a client command with `--json` and parses what it printed.
pub async fn client_json(server: &Server, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    client(server, &all).await.json()
}
