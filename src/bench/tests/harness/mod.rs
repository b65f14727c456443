//! What the tests of `fusebox-bench` run: the tool as cargo built it, and
//! real `fusebox serve` processes on port 0 from the `fusebox` binary next
//! to it (the one the tool itself starts by default).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use fusebox::proto::v1 as pb;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

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

/// What one run of the tool did.
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `program ARGS` to the end.
pub async fn run(program: &Path, args: &[&str]) -> Run {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(PATIENCE, output)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "`{} {}` ends within {PATIENCE:?}",
                program.display(),
                args.join(" ")
            )
        })
        .expect("the program runs");
    Run {
        code: output.status.code(),
        stdout: String::from_utf8(output.stdout).expect("stdout is UTF-8"),
        stderr: String::from_utf8(output.stderr).expect("stderr is UTF-8"),
    }
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
        let mut child = Command::new(server_bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("fusebox starts");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout piped")).lines();
        let mut next = async || {
            tokio::time::timeout(PATIENCE, lines.next_line())
                .await
                .expect("the server prints its addresses")
                .expect("stdout readable")
                .expect("the server runs until it has printed its addresses")
        };
        let first = next().await;
        let addr = first
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("first line is `listening on ADDR`, not {first:?}"))
            .to_owned();
        let second = next().await;
        let http_addr = second.strip_prefix("http on ").map(str::to_owned);
        // Nothing more is expected; keep reading so the server never blocks.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Server {
            _child: child,
            addr,
            http_addr,
        }
    }

    /// An Admin client on a new connection.
    pub async fn admin(&self) -> pb::admin_client::AdminClient<tonic::transport::Channel> {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr))
            .expect("an address")
            .connect()
            .await
            .expect("the server accepts connections");
        pb::admin_client::AdminClient::new(channel)
    }

    /// Reads a key.
    pub async fn get(&self, key: &str) -> pb::KeyState {
        self.admin()
            .await
            .get_key(pb::GetKeyRequest { key: key.into() })
            .await
            .expect("GetKey answers")
            .into_inner()
    }
}
