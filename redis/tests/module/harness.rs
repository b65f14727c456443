//! Real Redis servers with the module loaded, on free loopback ports: one
//! standalone server, or a 3-primary, 3-replica cluster. Every server is
//! stopped (kill, then wait) when its handle is dropped.
//!
//! Tools: `redis-server` from `FUSEBOX_REDIS_SERVER` or `PATH`, `redis-cli`
//! from `FUSEBOX_REDIS_CLI`, beside `redis-server`, or `PATH`; the module
//! from `FUSEBOX_REDIS_MODULE` or beside the test binary
//! (`target/<profile>/deps/libfusebox_redis.so`: `cargo test` builds the
//! cdylib with the rlib the tests link, but copies it up to
//! `target/<profile>/` only on `cargo build`). Without the tools a test is skipped, saying so,
//! unless `FUSEBOX_TEST_REQUIRE_TOOLS=1` (as `./scripts/test` sets), under
//! which it fails.

use std::ffi::{OsStr, OsString};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::resp::{Conn, Reply};

/// True when a missing tool must fail the test (`FUSEBOX_TEST_REQUIRE_TOOLS=1`).
fn required() -> bool {
    std::env::var("FUSEBOX_TEST_REQUIRE_TOOLS").is_ok_and(|v| v == "1")
}

/// `None` after saying why `test` is skipped, or a panic when tools are
/// required. The fusebox suite's other tools follow this rule too.
pub fn missing<T>(test: &str, why: &str) -> Option<T> {
    assert!(
        !required(),
        "{test}: {why} (FUSEBOX_TEST_REQUIRE_TOOLS=1: missing tools fail the test; \
         ./scripts/test installs them)"
    );
    println!("SKIPPED {test}: {why}; ./scripts/test installs what it needs");
    None
}

/// `program` when it is a path, else the first match on `PATH`.
fn find_program(program: &Path) -> Option<PathBuf> {
    if program.components().count() > 1 {
        return program.is_file().then(|| program.to_owned());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

fn env_path(var: &str) -> Option<PathBuf> {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// What a test needs to start servers: `redis-server`, `redis-cli` and the
/// module.
#[derive(Clone, Debug)]
pub struct Tools {
    /// `redis-server`.
    pub server: PathBuf,
    /// `redis-cli`.
    pub cli: PathBuf,
    /// The module, `libfusebox_redis.so`.
    pub module: PathBuf,
}

impl Tools {
    /// The tools, or `None` (the test is skipped) when one is missing.
    pub fn find(test: &str) -> Option<Tools> {
        let server_name = env_path("FUSEBOX_REDIS_SERVER").unwrap_or("redis-server".into());
        let Some(server) = find_program(&server_name) else {
            return missing(
                test,
                &format!(
                    "no {} (set FUSEBOX_REDIS_SERVER, or: apt-get install redis-server)",
                    server_name.display()
                ),
            );
        };
        let cli = env_path("FUSEBOX_REDIS_CLI")
            .and_then(|p| find_program(&p))
            .or_else(|| find_program(&server.with_file_name("redis-cli")))
            .or_else(|| find_program(Path::new("redis-cli")));
        let Some(cli) = cli else {
            return missing(
                test,
                "no redis-cli (set FUSEBOX_REDIS_CLI, or: apt-get install redis-tools)",
            );
        };
        let module = module_path();
        assert!(
            module.is_file(),
            "{test}: the module is not at {} (build it with `cargo build -p fusebox-redis`, \
             or set FUSEBOX_REDIS_MODULE)",
            module.display()
        );
        Some(Tools {
            server,
            cli,
            module,
        })
    }
}

/// `FUSEBOX_REDIS_MODULE`, else `libfusebox_redis.so` beside this test
/// binary (`target/<profile>/deps/`, where `cargo test` builds the cdylib
/// along with the rlib the tests link, from the same sources), else in the
/// profile directory (where `cargo build -p fusebox-redis` puts it).
fn module_path() -> PathBuf {
    if let Some(p) = env_path("FUSEBOX_REDIS_MODULE") {
        return p;
    }
    let file = format!(
        "{}fusebox_redis{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe.parent().expect("target/<profile>/deps");
    let beside = deps.join(&file);
    if beside.is_file() {
        return beside;
    }
    deps.parent().unwrap_or(deps).join(file)
}

/// A free loopback port, as the kernel hands one out. Released before it
/// is returned, so another process may take it first: callers retry.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local address").port()
}

/// Starts `program ARGS` with no standard input or output.
pub fn spawn<S: AsRef<OsStr>>(program: &Path, args: &[S]) -> std::io::Result<Child> {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
}

/// True when the server on `port` answers PING.
fn pong(port: u16) -> bool {
    Conn::connect(port).is_ok_and(
        |mut conn| matches!(conn.call(&["PING"]), Ok(Reply::Simple(ref s)) if s == "PONG"),
    )
}

/// A running `redis-server` with the module loaded.
pub struct Server {
    /// Its client port on 127.0.0.1.
    pub port: u16,
    /// Its working directory (RDB, AOF, nodes.conf, the log).
    pub dir: PathBuf,
    child: Child,
    /// The program and arguments it was started with, to restart it in
    /// place (the fusebox suite does; these tests do not).
    #[allow(dead_code)]
    program: PathBuf,
    #[allow(dead_code)]
    args: Vec<OsString>,
}

impl Server {
    /// Starts `redis-server` on a free port with the module and `extra`
    /// arguments, in `dir` (created), and waits until it answers PING.
    /// Retries on a new port when the server exits (a port taken meanwhile).
    /// `cluster`: also give it a free port for the cluster bus.
    pub fn start(tools: &Tools, dir: &Path, extra: &[&str], cluster: bool) -> Server {
        Server::start_with(tools, dir, &[], extra, cluster, None)
    }

    /// Starts `redis-server` as [`Server::start`] does, but with
    /// `module_args` after the module's path (e.g. `secret-file PATH`) and,
    /// with `tls` (redis-cli's TLS arguments, e.g. `--tls --cacert CA
    /// --cert C --key K`), on a TLS port only: `--port 0 --tls-port PORT`
    /// (`extra` names the server's certificate files); it is ready once
    /// redis-cli with those arguments gets PONG. `port` is then the TLS
    /// port. Retries on a new port when the server exits.
    pub fn start_with(
        tools: &Tools,
        dir: &Path,
        module_args: &[&str],
        extra: &[&str],
        cluster: bool,
        tls: Option<&[&str]>,
    ) -> Server {
        let mut last_log = String::new();
        for _attempt in 0..5 {
            let port = free_port();
            let node_dir = dir.join(port.to_string());
            std::fs::create_dir_all(&node_dir).expect("create the server's directory");
            let log = node_dir.join("redis.log");
            let mut args: Vec<OsString> = match tls {
                Some(_) => vec![
                    "--port".into(),
                    "0".into(),
                    "--tls-port".into(),
                    port.to_string().into(),
                ],
                None => vec!["--port".into(), port.to_string().into()],
            };
            args.extend([
                "--bind".into(),
                "127.0.0.1".into(),
                "--dir".into(),
                node_dir.clone().into(),
                "--logfile".into(),
                log.clone().into(),
                "--daemonize".into(),
                "no".into(),
                "--loadmodule".into(),
                tools.module.clone().into(),
            ]);
            args.extend(module_args.iter().map(OsString::from));
            if cluster {
                // The bus port is explicit: port + 10000 may be past 65535.
                args.extend(["--cluster-port".into(), free_port().to_string().into()]);
            }
            args.extend(extra.iter().map(OsString::from));
            let child = spawn(&tools.server, &args)
                .unwrap_or_else(|e| panic!("start {}: {e}", tools.server.display()));
            let mut server = Server {
                port,
                dir: node_dir,
                child,
                program: tools.server.clone(),
                args,
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = server.child.try_wait() {
                    break; // exited: most likely the port was taken
                }
                let ready = match tls {
                    Some(tls) => redis_cli(tools, port, tls, &["PING"]).trim() == "PONG",
                    None => pong(port),
                };
                if ready {
                    return server;
                }
                sleep(Duration::from_millis(10));
            }
            last_log = std::fs::read_to_string(&log).unwrap_or_default();
            drop(server);
        }
        panic!("redis-server did not start in 5 attempts; its last log:\n{last_log}");
    }

    /// A new connection to the server.
    pub fn conn(&self) -> Conn {
        Conn::connect(self.port)
            .unwrap_or_else(|e| panic!("connect to redis on port {}: {e}", self.port))
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }
}

/// Stopping and restarting a server, for the fusebox suite's failover tests
/// (these tests do not use them).
#[allow(dead_code)]
impl Server {
    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The process's id (to stop and continue it with signals).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the process with SIGKILL (no shutdown, no AOF flush) and reaps
    /// it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        self.child.wait().expect("reap the killed redis-server");
    }

    /// Sends `SHUTDOWN` with `modifiers` (e.g. `NOSAVE`) and waits up to
    /// `timeout` for the process to exit; panics if it answers with an
    /// error or does not exit.
    pub fn shutdown(&mut self, modifiers: &[&str], timeout: Duration) {
        let mut args = vec!["SHUTDOWN"];
        args.extend_from_slice(modifiers);
        // On success the server closes the connection without a reply.
        if let Ok(reply) = self.conn().call(&args) {
            panic!(
                "SHUTDOWN on port {} answered {reply:?}; its log:\n{}",
                self.port,
                self.log()
            );
        }
        let port = self.port;
        let status = wait_for(
            &format!("redis-server on port {port} to exit after SHUTDOWN"),
            timeout,
            || self.child.try_wait().expect("try_wait"),
        );
        assert!(
            status.success(),
            "redis-server on port {port} exited with {status} after SHUTDOWN"
        );
    }

    /// Starts the server again after it exited: the same program, port,
    /// directory and arguments (the cluster bus port too, so `nodes.conf`
    /// still describes the cluster), and waits until it answers PING (its
    /// data loaded). Panics if the port was taken meanwhile or it does not
    /// come up in `timeout`.
    pub fn restart(&mut self, timeout: Duration) {
        assert!(
            !self.is_running(),
            "restart: redis-server on port {} is still running",
            self.port
        );
        self.child = spawn(&self.program, &self.args)
            .unwrap_or_else(|e| panic!("restart {}: {e}", self.program.display()));
        let port = self.port;
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "redis-server restarted on port {port} exited ({status}); its log:\n{}",
                    self.log()
                );
            }
            if pong(port) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server restarted on port {port} did not answer PING within {timeout:?}; its log:\n{}",
                self.log()
            );
            sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A standalone server for unit-like tests: no RDB snapshots, no AOF.
pub struct Standalone {
    /// The server.
    pub server: Server,
    _dir: tempfile::TempDir,
}

impl Standalone {
    /// Starts one server, or `None` (skipped) without the tools.
    pub fn start(test: &str) -> Option<Standalone> {
        Standalone::start_with(test, &[])
    }

    /// Starts one server and opens a connection to it, or `None` (skipped)
    /// without the tools.
    pub fn connected(test: &str) -> Option<(Standalone, Conn)> {
        let redis = Standalone::start(test)?;
        let conn = redis.server.conn();
        Some((redis, conn))
    }

    /// Starts one server with `extra` arguments after the defaults (a later
    /// setting wins), or `None` (skipped) without the tools.
    pub fn start_with(test: &str, extra: &[&str]) -> Option<Standalone> {
        let tools = Tools::find(test)?;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut args = vec!["--save", "", "--appendonly", "no"];
        args.extend_from_slice(extra);
        let server = Server::start(&tools, dir.path(), &args, false);
        Some(Standalone { server, _dir: dir })
    }
}

/// A standalone primary and its replica, linked, with the AOF on or off
/// and no RDB snapshots.
pub struct Replicated {
    /// The primary.
    pub primary: Server,
    /// Its replica (`--replicaof`), whose link is up.
    pub replica: Server,
    /// The directory holding both servers' files (AOF, RDB), deleted when
    /// dropped, after the servers.
    _dir: tempfile::TempDir,
}

impl Replicated {
    /// Starts both and waits for the replica's link, or `None` (skipped)
    /// without the tools.
    pub fn start(test: &str, aof: bool) -> Option<Replicated> {
        let tools = Tools::find(test)?;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let base = [
            "--save",
            "",
            "--appendonly",
            if aof { "yes" } else { "no" },
            "--repl-diskless-sync-delay",
            "0",
        ];
        let primary = Server::start(&tools, dir.path(), &base, false);
        let port = primary.port.to_string();
        let mut args = base.to_vec();
        args.extend(["--replicaof", "127.0.0.1", &port]);
        let replica = Server::start(&tools, dir.path(), &args, false);
        wait_for(
            "the replica's link to its primary",
            Duration::from_secs(30),
            || {
                let info = replica.conn().cmd(&["INFO", "replication"]);
                (info_field(&info, "master_link_status").as_deref() == Some("up")).then_some(())
            },
        );
        Some(Replicated {
            primary,
            replica,
            _dir: dir,
        })
    }
}

impl Replicated {
    /// Starts both as [`Replicated::start`] does and opens a connection to
    /// the primary, or `None` (skipped) without the tools.
    pub fn connected(test: &str, aof: bool) -> Option<(Replicated, Conn)> {
        let redis = Replicated::start(test, aof)?;
        let conn = redis.primary.conn();
        Some((redis, conn))
    }
}

/// The fields of an INFO or CLUSTER INFO reply.
pub fn info_field(info: &Reply, field: &str) -> Option<String> {
    info.text().lines().find_map(|l| {
        l.trim_end()
            .strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::to_owned)
    })
}

/// Polls `check` every 20 ms until it returns `Some`, or panics with
/// `what` after `timeout`.
pub fn wait_for<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        sleep(Duration::from_millis(20));
    }
}

/// A Redis Cluster of three primaries and three replicas, each with the
/// module, AOF on, in a temporary directory; stopped when dropped.
pub struct Cluster {
    /// The six servers, in the order given to `redis-cli --cluster create`.
    pub nodes: Vec<Server>,
    /// How long it took from the first spawn to a healthy cluster.
    pub start_time: Duration,
    /// When each step ended, from the first spawn: six servers answer PING,
    /// `--cluster create` returned, `cluster_state:ok`, replicas linked.
    pub steps: Vec<(&'static str, Duration)>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts six servers, joins them with `redis-cli --cluster create
    /// --cluster-replicas 1`, and waits until every node says
    /// `cluster_state:ok` and every replica's link to its primary is up.
    /// `None` (skipped) without the tools.
    pub fn start(test: &str) -> Option<Cluster> {
        let tools = Tools::find(test)?;
        let started = Instant::now();
        let dir = tempfile::tempdir().expect("a temporary directory");
        let args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "2000",
            "--repl-diskless-sync-delay",
            "0",
            "--appendonly",
            "yes",
        ];
        let nodes: Vec<Server> = (0..6)
            .map(|_| Server::start(&tools, dir.path(), &args, true))
            .collect();
        let mut steps = vec![("six servers up", started.elapsed())];
        let mut create = Command::new(&tools.cli);
        create.args(["--cluster", "create"]);
        create.args(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)));
        create.args(["--cluster-replicas", "1", "--cluster-yes"]);
        let out = create
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run {}: {e}", tools.cli.display()));
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        steps.push(("cluster created", started.elapsed()));
        let mut cluster = Cluster {
            nodes,
            start_time: Duration::ZERO,
            steps,
            _dir: dir,
        };
        cluster.wait_for_every_node("cluster_state:ok on all six nodes", |n| {
            let info = n.conn().cmd(&["CLUSTER", "INFO"]);
            info_field(&info, "cluster_state").as_deref() == Some("ok")
        });
        cluster.steps.push(("cluster_state:ok", started.elapsed()));
        wait_for(
            "three replicas with master_link_status:up",
            Duration::from_secs(30),
            || {
                let up = cluster
                    .nodes
                    .iter()
                    .filter(|n| {
                        let info = n.conn().cmd(&["INFO", "replication"]);
                        info_field(&info, "role").as_deref() == Some("slave")
                            && info_field(&info, "master_link_status").as_deref() == Some("up")
                    })
                    .count();
                (up == 3).then_some(())
            },
        );
        cluster.steps.push(("replicas linked", started.elapsed()));
        // PUBLISH reaches another node over the cluster bus, and a message
        // sent while a node's link is still being made is lost there: wait
        // until every node's link to every other node is connected.
        cluster.wait_for_every_node(
            "every node's cluster-bus link to every other node connected",
            |n| {
                let nodes = n.conn().cmd(&["CLUSTER", "NODES"]).text();
                let lines: Vec<&str> = nodes.lines().filter(|l| !l.is_empty()).collect();
                lines.len() == 6
                    && lines
                        .iter()
                        .all(|l| l.split(' ').nth(7) == Some("connected"))
            },
        );
        cluster.start_time = started.elapsed();
        cluster
            .steps
            .push(("cluster-bus links connected", cluster.start_time));
        Some(cluster)
    }

    /// Waits up to 30 s until `check` holds on every node.
    fn wait_for_every_node(&self, what: &str, check: impl Fn(&Server) -> bool) {
        wait_for(what, Duration::from_secs(30), || {
            self.nodes.iter().all(&check).then_some(())
        });
    }

    /// The primaries.
    pub fn primaries(&self) -> Vec<&Server> {
        self.with_role("master")
    }

    /// The replicas.
    pub fn replicas(&self) -> Vec<&Server> {
        self.with_role("slave")
    }
}

/// Crashing and waiting on nodes, for the fusebox suite's failover tests
/// (these tests do not use them).
#[allow(dead_code)]
impl Cluster {
    /// The node on `port`.
    pub fn node_mut(&mut self, port: u16) -> &mut Server {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no node of the cluster on port {port}"))
    }

    /// Kills the node on `port` with SIGKILL, as a crash would.
    pub fn kill(&mut self, port: u16) {
        self.node_mut(port).kill();
    }

    /// Waits until every node in `ports` says `cluster_state:ok`.
    pub fn wait_ok(&self, ports: &[u16], timeout: Duration) {
        wait_for(
            &format!("cluster_state:ok on nodes {ports:?}"),
            timeout,
            || {
                ports
                    .iter()
                    .all(|&port| {
                        Conn::connect(port)
                            .and_then(|mut c| c.call(&["CLUSTER", "INFO"]))
                            .is_ok_and(|info| {
                                info_field(&info, "cluster_state").as_deref() == Some("ok")
                            })
                    })
                    .then_some(())
            },
        );
    }
}

impl Cluster {
    fn with_role(&self, role: &str) -> Vec<&Server> {
        self.nodes
            .iter()
            .filter(|n| {
                let info = n.conn().cmd(&["INFO", "replication"]);
                info_field(&info, "role").as_deref() == Some(role)
            })
            .collect()
    }
}

/// Runs `redis-cli -h 127.0.0.1 -p port` with `options` (TLS, a user)
/// then `args`, and returns what it printed (standard output, then
/// standard error).
pub fn redis_cli(tools: &Tools, port: u16, options: &[&str], args: &[&str]) -> String {
    let out = Command::new(&tools.cli)
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(options)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", tools.cli.display()));
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    text
}
