//! A real `fusebox serve` process on port 0, and gRPC clients to it.
//!
//! Tests start the binary that cargo built, read the address it prints
//! first (`listening on ADDR`), and talk to it over gRPC. The process is
//! killed when the [`Server`] is dropped.

use std::io::Write;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fusebox::proto::v1 as pb;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStderr, Command};
use tonic::transport::Channel;

use crate::process;

/// The fusebox binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_fusebox");

/// A running server.
pub struct Server {
    pub child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// The HTTP address (`--http`), as printed on the second line.
    pub http_addr: Option<String>,
    /// Everything the server wrote to standard error (its logs) so far. It
    /// is read continuously, so that a chatty server never blocks on a full
    /// pipe.
    logs: Arc<Mutex<String>>,
    drained: Option<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

fn drain(stderr: ChildStderr, logs: Arc<Mutex<String>>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut lines = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let mut logs = logs.lock().expect("logs lock");
            logs.push_str(&line);
            logs.push('\n');
        }
    })
}

/// How to start a server.
#[derive(Default, Clone)]
pub struct Options<'a> {
    /// TOML written to a file and passed as `--config`.
    pub config: Option<&'a str>,
    /// Pass `--manual-clock`.
    pub manual_clock: bool,
    /// More arguments.
    pub args: Vec<&'a str>,
    /// The working directory (the test's own by default).
    pub cwd: Option<&'a std::path::Path>,
    /// Environment variables set for the server.
    pub env: Vec<(&'a str, String)>,
}

impl Server {
    /// Starts `fusebox serve --listen 127.0.0.1:0` with `options`.
    pub async fn start(options: Options<'_>) -> Server {
        let dir = tempfile::tempdir().expect("a temp dir");
        let mut cmd = Command::new(BIN);
        cmd.arg("serve").arg("--listen").arg("127.0.0.1:0");
        if let Some(text) = options.config {
            let path = dir.path().join("fusebox.toml");
            std::fs::File::create(&path)
                .and_then(|mut f| f.write_all(text.as_bytes()))
                .expect("config written");
            cmd.arg("--config").arg(&path);
        }
        if options.manual_clock {
            cmd.arg("--manual-clock");
        }
        cmd.args(&options.args);
        if let Some(cwd) = options.cwd {
            cmd.current_dir(cwd);
        }
        cmd.envs(options.env.iter().map(|(k, v)| (*k, v.as_str())));
        if !options.args.contains(&"--http") {
            // Never the default port: tests run side by side.
            cmd.arg("--http").arg("127.0.0.1:0");
        }
        let mut child = process::spawn(cmd.stderr(Stdio::piped()), "fusebox starts");
        let (addr, http_addr) = process::addresses(&mut child, Duration::from_secs(30)).await;
        let logs = Arc::new(Mutex::new(String::new()));
        let drained = Some(drain(
            child.stderr.take().expect("stderr piped"),
            logs.clone(),
        ));
        Server {
            child,
            addr,
            http_addr,
            logs,
            drained,
            _dir: dir,
        }
    }

    /// Everything the server logged, once it has closed standard error
    /// (that is, exited).
    pub async fn all_logs(&mut self) -> String {
        if let Some(drained) = self.drained.take() {
            tokio::time::timeout(Duration::from_secs(30), drained)
                .await
                .expect("the server closes standard error")
                .expect("the log reader ends");
        }
        self.logs()
    }

    /// Waits (20 s at most) until the server has logged `text`: what it
    /// logged by then.
    pub async fn until_logged(&self, text: &str) -> String {
        let found = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                let logs = self.logs();
                if logs.contains(text) {
                    return logs;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        found.unwrap_or_else(|_| panic!("no {text:?} in the log:\n{}", self.logs()))
    }

    /// What the server logged so far.
    pub fn logs(&self) -> String {
        self.logs.lock().expect("logs lock").clone()
    }

    /// Starts a server on a manual clock with `config`.
    pub async fn manual(config: Option<&str>) -> Server {
        Server::start(Options {
            config,
            manual_clock: true,
            ..Options::default()
        })
        .await
    }

    /// A new connection (its own HTTP/2 channel).
    pub async fn channel(&self) -> Channel {
        process::channel(&self.addr).await
    }

    /// A Fusebox client on a new connection.
    pub async fn fusebox(&self) -> pb::fusebox_client::FuseboxClient<Channel> {
        pb::fusebox_client::FuseboxClient::new(self.channel().await)
    }

    /// An Admin client on a new connection.
    pub async fn admin(&self) -> pb::admin_client::AdminClient<Channel> {
        pb::admin_client::AdminClient::new(self.channel().await)
    }

    /// A Clock client on a new connection.
    pub async fn clock(&self) -> pb::clock_client::ClockClient<Channel> {
        pb::clock_client::ClockClient::new(self.channel().await)
    }

    /// Reads a key.
    pub async fn get(&self, key: &str) -> pb::KeyState {
        process::get_key(&mut self.admin().await, key).await
    }

    /// Polls `GetKey` on `key` until `check` holds for its state (for 20 s
    /// at most); returns that state.
    pub async fn until(
        &self,
        what: &str,
        key: &str,
        check: impl Fn(&pb::KeyState) -> bool,
    ) -> pb::KeyState {
        let admin = self.admin().await;
        eventually(what, Duration::from_secs(20), || {
            let mut admin = admin.clone();
            let check = &check;
            async move {
                let s = process::get_key(&mut admin, key).await;
                check(&s).then_some(s)
            }
        })
        .await
    }

    /// Kills the server and waits until it is gone (nothing it does can
    /// reach a store after this).
    pub async fn stop(mut self) {
        self.child.kill().await.expect("the server is killed");
    }

    /// Sends the signal `name` (`HUP`, `TERM`, ...).
    pub fn signal(&self, name: &str) {
        let pid = self.child.id().expect("running");
        assert!(signal(pid, name), "kill -{name} {pid}");
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        self.signal("TERM");
    }
}

/// Runs `fusebox serve` on free ports with `args` (and the environment
/// variable `env`), which must stop the start: what it printed on standard
/// error, which says that the server did not start.
pub async fn refused_start(args: &[&str], env: Option<(&str, &str)>) -> String {
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"])
        .args(args)
        .kill_on_drop(true);
    if let Some((name, value)) = env {
        cmd.env(name, value);
    }
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("the server stops in time")
        .expect("the server runs");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{args:?} starts: {err}");
    assert!(err.contains("did not start"), "{args:?}: {err}");
    err
}

/// Sends the signal `name` (`HUP`, `TERM`, `STOP`, ...) to the process
/// `pid`: true when `kill` did.
pub fn signal(pid: u32, name: &str) -> bool {
    std::process::Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .is_ok_and(|s| s.success())
}

/// Polls `check` until it returns `Some`, at most `limit`; panics with
/// `what` otherwise. For conditions reached asynchronously (never a sleep
/// used as synchronisation: the check itself decides).
pub async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `count` fusebox servers keeping their state in the store at `store` (a
/// URL for `--store`), each with `config`.
pub async fn servers_on(
    store: &str,
    config: &str,
    manual_clock: bool,
    count: usize,
) -> Vec<Server> {
    let mut servers = Vec::with_capacity(count);
    for _ in 0..count {
        servers.push(
            Server::start(Options {
                config: Some(config),
                manual_clock,
                args: vec!["--store", store],
                ..Options::default()
            })
            .await,
        );
    }
    servers
}

/// A duration in milliseconds, for requests.
pub fn ms(ms: u64) -> prost_types::Duration {
    fusebox::proto::wire::duration_of(ms)
}

/// Milliseconds of a duration from a response.
pub fn millis(d: Option<prost_types::Duration>) -> Option<u64> {
    fusebox::proto::wire::millis_of("duration", d).expect("a valid duration")
}

/// A request that names its operator in the `x-fusebox-operator` header,
/// as Isolate and Close record it.
pub fn by<T>(who: &str, message: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    r.metadata_mut()
        .insert("x-fusebox-operator", who.parse().expect("an ASCII name"));
    r
}

/// Isolates `key` (with `isolate`) or closes it, for `reason`, as the
/// operator `who` when one is named (see [`by`]; without, the server
/// records the caller's address): the state after the call, or the status
/// it failed with.
pub async fn steer(
    admin: &mut pb::admin_client::AdminClient<Channel>,
    isolate: bool,
    who: Option<&str>,
    key: &str,
    reason: &str,
) -> Result<pb::KeyState, tonic::Status> {
    fn request_as<T>(who: Option<&str>, message: T) -> tonic::Request<T> {
        match who {
            Some(who) => by(who, message),
            None => tonic::Request::new(message),
        }
    }
    let (key, reason) = (key.to_owned(), reason.to_owned());
    let reply = if isolate {
        let request = request_as(who, pb::IsolateRequest { key, reason });
        admin.isolate(request).await
    } else {
        let request = request_as(who, pb::CloseRequest { key, reason });
        admin.close(request).await
    };
    reply.map(tonic::Response::into_inner)
}

/// A request for one permit of `key`, for tests that fill an engine in
/// process before serving it.
pub fn ask(key: &str) -> fusebox::engine::AcquireArgs {
    fusebox::engine::AcquireArgs {
        caller: Default::default(),
        key: key.to_owned(),
        permits: 1,
        max_wait: 0,
        lease: None,
        attempt: 0,
    }
}

/// One request on `key` in process, completed with `outcome` when granted.
pub async fn call(engine: &fusebox::engine::Engine, key: &str, outcome: fusebox::domain::Outcome) {
    let reply = engine.acquire(ask(key)).await.expect("acquire answers");
    if let Some(ticket) = reply.ticket {
        engine.complete(&ticket, outcome).expect("complete answers");
    }
}

/// A redis-server with the module loaded, started off the runtime's
/// threads; `None` where Redis or the module is missing (the test is then
/// skipped, as every store test is).
pub async fn standalone(test: &'static str) -> Option<crate::redis_harness::Standalone> {
    tokio::task::spawn_blocking(move || crate::redis_harness::Standalone::start(test))
        .await
        .expect("redis starts")
}
