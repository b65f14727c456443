//! Programs the tests run, and the `fusebox serve` processes they talk to:
//! started with their output piped, their addresses read, their admin API
//! reached. Shared by the black-box suite (`tests/suite`) and the load
//! tool's tests (`src/bench/tests`), which include this file.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use fusebox::proto::v1 as pb;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};
use tonic::transport::Channel;

/// Starts `cmd` with standard input closed and standard output piped,
/// killed when dropped (standard error goes where the caller set it);
/// panics saying `what` did not happen if it cannot start.
pub fn spawn(cmd: &mut Command, what: &str) -> Child {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// Reads the addresses a starting `fusebox serve` prints first, each
/// within `patience`: `listening on ADDR` (the gRPC port), then `http on
/// ADDR` when it serves HTTP. The rest of its standard output is read and
/// dropped, so that it never blocks on a full pipe. Panics, with what it
/// wrote on standard error when that is piped, if it exits first.
pub async fn addresses(child: &mut Child, patience: Duration) -> (String, Option<String>) {
    let stdout = child.stdout.take().expect("stdout piped");
    let mut lines = BufReader::new(stdout).lines();
    let first = tokio::time::timeout(patience, lines.next_line())
        .await
        .unwrap_or_else(|_| panic!("the server prints its address within {patience:?}"))
        .expect("stdout readable");
    let Some(first) = first else {
        let mut err = String::new();
        if let Some(mut stderr) = child.stderr.take() {
            let _ = stderr.read_to_string(&mut err).await;
        }
        panic!("the server exited before printing its address: {err}");
    };
    let addr = first
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("first line is `listening on ADDR`, not {first:?}"))
        .to_owned();
    let second = tokio::time::timeout(patience, lines.next_line())
        .await
        .expect("the server prints its HTTP address")
        .expect("stdout readable");
    let http_addr = second.and_then(|l| l.strip_prefix("http on ").map(str::to_owned));
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (addr, http_addr)
}

/// What one run of a program did.
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl From<std::process::Output> for Run {
    fn from(output: std::process::Output) -> Run {
        Run {
            code: output.status.code(),
            stdout: String::from_utf8(output.stdout).expect("stdout is UTF-8"),
            stderr: String::from_utf8(output.stderr).expect("stderr is UTF-8"),
        }
    }
}

/// Runs `program ARGS` to the end, with standard input closed; panics if
/// it takes longer than `patience`.
pub async fn run(program: &Path, args: &[&str], patience: Duration) -> Run {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let name = program.file_name().unwrap_or(program.as_os_str());
    let output = tokio::time::timeout(patience, output)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "`{} {}` ends within {patience:?}",
                name.to_string_lossy(),
                args.join(" ")
            )
        })
        .unwrap_or_else(|e| panic!("{} runs: {e}", program.display()));
    Run::from(output)
}

/// What a program that ended said: whether it succeeded, its standard
/// output and its standard error (any bytes that are not UTF-8 replaced).
pub fn said(out: &std::process::Output) -> (bool, String, String) {
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A new connection (its own HTTP/2 channel) to the gRPC port at `addr`.
pub async fn channel(addr: &str) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("an address")
        .connect()
        .await
        .expect("the server accepts connections")
}

/// Reads `key` through `admin`.
pub async fn get_key(
    admin: &mut pb::admin_client::AdminClient<Channel>,
    key: &str,
) -> pb::KeyState {
    admin
        .get_key(pb::GetKeyRequest { key: key.into() })
        .await
        .expect("GetKey answers")
        .into_inner()
}
