//! What the tests of `fusebox-bench` run: the tool as cargo built it, and
//! real `fusebox serve` processes on port 0 from the `fusebox` binary next
//! to it (the one the tool itself starts by default).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use fusebox::proto::v1 as pb;
use tokio::process::{Child, Command};

// The suite's way of starting programs and reaching a server, shared.
#[path = "../../../../tests/suite/process.rs"]
#[allow(dead_code)]
mod process;

pub use process::Run;

/// The load tool under test.
pub const BENCH: &str = env!("CARGO_BIN_EXE_fusebox-bench");

/// The longest one run of the tool may take before the test gives up on it.
const PATIENCE: Duration = Duration::from_secs(120);

/// The `fusebox` binary next to the tool. Cargo builds it there in the same
/// run as the tool whenever the workspace is tested (`cargo test
/// --workspace`); testing this crate alone needs it built first.
pub fn server_bin() -> PathBuf {
    let bin = Path::new(BENCH).with_file_name(format!("fusebox{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "no fusebox binary at {}: run `cargo build --bin fusebox` first, or test the whole \
         workspace (`cargo test --workspace`), which builds it",
        bin.display()
    );
    bin
}

/// Runs `program ARGS` to the end.
pub async fn run(program: &Path, args: &[&str]) -> Run {
    process::run(program, args, PATIENCE).await
}

/// Runs `fusebox-bench ARGS` to the end (after checking that the server it
/// starts by default is there, so that a missing one fails as such).
pub async fn bench(args: &[&str]) -> Run {
    server_bin();
    run(Path::new(BENCH), args).await
}

/// A running `fusebox serve`, killed when dropped.
pub struct Server {
    _child: Child,
    /// `127.0.0.1:PORT` of its gRPC port.
    pub addr: String,
    /// `127.0.0.1:PORT` of its HTTP port.
    pub http_addr: Option<String>,
}

impl Server {
    /// Starts `fusebox serve` on free ports and reads the addresses it prints.
    pub async fn start() -> Server {
        let mut child = process::spawn(
            Command::new(server_bin())
                .args(["serve", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"])
                .stderr(Stdio::null()),
            "fusebox starts",
        );
        let (addr, http_addr) = process::addresses(&mut child, PATIENCE).await;
        Server {
            _child: child,
            addr,
            http_addr,
        }
    }

    /// An Admin client on a new connection.
    pub async fn admin(&self) -> pb::admin_client::AdminClient<tonic::transport::Channel> {
        pb::admin_client::AdminClient::new(process::channel(&self.addr).await)
    }

    /// Reads a key.
    pub async fn get(&self, key: &str) -> pb::KeyState {
        process::get_key(&mut self.admin().await, key).await
    }
}
