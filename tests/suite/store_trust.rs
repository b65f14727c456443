//! A store on a network (`serve --store`): TLS to Redis with mutual TLS,
//! a least-privilege ACL user (the README's own line) whose password comes
//! from a file and never prints, and signed notices: forged answers,
//! transitions and policies published straight to Redis are dropped,
//! counted, and change nothing. Real `redis-server`s with the module, real
//! fusebox servers, every call over gRPC.
//!
//! Without redis-server these tests are skipped, saying so, unless
//! `FUSEBOX_TEST_REQUIRE_TOOLS=1` (as `./scripts/test` sets).

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use fusebox::proto::v1 as pb;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::admin::complete;
use crate::harness::{eventually, ms, refused_start, Options, Server, BIN};
use crate::redis_harness::{redis_cli, Server as Redis, Tools};
use crate::store::{pair, trip};
use crate::tls::{write, Ca};

/// How long a change may take to show.
const PATIENCE: Duration = Duration::from_secs(20);

/// A breaker that one failure trips, and one permit per key with a queue.
const CONFIG: &str = r#"
[default]
breaker = { mode = "consecutive", failures = 1, break = "10m" }
limiter = { kind = "concurrency", permits = 1, queue_limit = 10 }
"#;

/// A certificate from `ca` for `name` with the names `sans`, written as
/// `<name>.pem` and `<name>.key` in `dir`.
fn issue(ca: &Ca, dir: &Path, name: &str, sans: &[&str]) -> (PathBuf, PathBuf) {
    let pair = ca.issue(name, sans);
    (
        write(dir, &format!("{name}.pem"), &pair.cert),
        write(dir, &format!("{name}.key"), &pair.key),
    )
}

fn text(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

/// A fresh random token, in hex, for passwords and secrets.
fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).expect("random bytes");
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// `payload` signed for `channel` under `secret`, as the module signs.
fn sign(secret: &[u8], channel: &str, payload: &str) -> String {
    let mut m = Hmac::<Sha256>::new_from_slice(secret).expect("any key length");
    m.update(channel.as_bytes());
    m.update(b"\n");
    m.update(payload.as_bytes());
    let tag: String = m
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{tag} {payload}")
}

/// A sample of `/metrics`: the value of the line that starts with
/// `series` (a name, with its labels if it has any).
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        line.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

async fn metrics(server: &Server) -> String {
    let http = server.http_addr.as_deref().expect("an HTTP address");
    crate::http::get(http, "/metrics").await.body
}

fn dropped(channel: &str) -> String {
    format!("fusebox_store_notices_dropped_total{{channel=\"{channel}\"}}")
}

/// Waits until `/metrics` of `server` shows `series` at `value`.
async fn counted(server: &Server, series: &str, value: f64) {
    eventually(&format!("{series} = {value}"), PATIENCE, || async {
        let text = metrics(server).await;
        (sample(&text, series) == Some(value)).then_some(())
    })
    .await;
}

fn ask(key: &str, max_wait: Option<u64>) -> pb::AcquireRequest {
    pb::AcquireRequest {
        key: key.into(),
        permits: None,
        max_wait: max_wait.map(ms),
        lease: None,
        ..Default::default()
    }
}

/// A Watch of the keys under `prefix`, past its first snapshot.
async fn watch(server: &Server, prefix: &str) -> tonic::Streaming<pb::WatchEvent> {
    let mut stream = crate::watch::watch(server, prefix).await;
    let first = crate::watch::next(&mut stream, PATIENCE).await;
    assert!(
        matches!(first, pb::watch_event::Event::Snapshot(_)),
        "{first:?}"
    );
    stream
}

/// The next transition on a Watch stream.
async fn next_transition(stream: &mut tonic::Streaming<pb::WatchEvent>) -> pb::Transition {
    loop {
        if let pb::watch_event::Event::Transition(t) = crate::watch::next(stream, PATIENCE).await {
            return t;
        }
    }
}

/// The README's lines that make fusebox's ACL user, run as written (in
/// `dir`, which holds `fusebox-redis.password`), redis-cli reaching the
/// server on `port` with `options`.
fn make_the_readme_user(tools: &Tools, dir: &Path, port: u16, options: &[&str]) {
    let readme = include_str!("../../README.md");
    let line = |start: &str| {
        readme
            .lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("README has a line starting {start:?}"))
            .to_owned()
    };
    let hash = line("hash=$(");
    let acl = line("redis-cli ACL SETUSER fusebox ");
    let cli = format!(
        "{} -h 127.0.0.1 -p {port} {} ",
        tools.cli.display(),
        options.join(" ")
    );
    let script = format!("set -e\n{hash}\n{}\n", acl.replacen("redis-cli ", &cli, 1));
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(&script)
        .current_dir(dir)
        .output()
        .expect("sh runs");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.trim() == "OK",
        "the README's ACL line: {said}{}\n{script}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The certificates of a TLS test, written in its directory: a CA,
/// Redis's certificate (for 127.0.0.1 and localhost) and this server's
/// client certificate, both signed by the CA.
struct Pki {
    ca: PathBuf,
    redis: (PathBuf, PathBuf),
    client: (PathBuf, PathBuf),
}

impl Pki {
    fn new(dir: &Path) -> Pki {
        let ca = Ca::new("store-trust test CA");
        Pki {
            ca: write(dir, "ca.pem", &ca.pem()),
            redis: issue(&ca, dir, "redis", &["localhost", "127.0.0.1"]),
            client: issue(&ca, dir, "fusebox-server", &["fusebox-server"]),
        }
    }

    /// The flags `[ca, cert, key]`, naming the CA and `pair` (a
    /// certificate and its key).
    fn flags(&self, [ca, cert, key]: [&str; 3], pair: &(PathBuf, PathBuf)) -> Vec<String> {
        [ca, text(&self.ca), cert, text(&pair.0), key, text(&pair.1)]
            .map(str::to_owned)
            .to_vec()
    }

    /// redis-server's TLS arguments (client certificates required, as by
    /// default).
    fn server_args(&self) -> Vec<String> {
        let names = ["--tls-ca-cert-file", "--tls-cert-file", "--tls-key-file"];
        self.flags(names, &self.redis)
    }

    /// redis-cli's.
    fn cli_args(&self) -> Vec<String> {
        let mut args = vec!["--tls".to_owned()];
        args.extend(self.flags(["--cacert", "--cert", "--key"], &self.client));
        args
    }

    /// `fusebox serve`'s.
    fn fusebox_args(&self) -> Vec<String> {
        let names = ["--store-tls-ca", "--store-tls-cert", "--store-tls-key"];
        self.flags(names, &self.client)
    }
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// Locks the server on `port` down: an admin for the test, fusebox's user
/// made with the README's line (its password in `dir`'s
/// `fusebox-redis.password`), and no default user.
fn lock_down(tools: &Tools, dir: &Path, port: u16, cli: &[&str]) {
    let admin = [
        "ACL",
        "SETUSER",
        "admin",
        "on",
        ">admin-pw",
        "~*",
        "&*",
        "+@all",
    ];
    let said = redis_cli(tools, port, cli, &admin);
    assert_eq!(said.trim(), "OK", "{said}");
    make_the_readme_user(tools, dir, port, cli);
    let said = redis_cli(tools, port, cli, &["ACL", "SETUSER", "default", "off"]);
    assert_eq!(said.trim(), "OK", "{said}");
}

/// What the ACL refused on the server on `port` (`ACL LOG`'s objects: the
/// commands, keys or channels), bar `client|setinfo`, which the cluster
/// client sends and whose refusal it ignores.
fn refused(tools: &Tools, port: u16, cli: &[&str]) -> Vec<String> {
    let mut admin = cli.to_vec();
    admin.extend(["--user", "admin", "--pass", "admin-pw"]);
    let log = redis_cli(tools, port, &admin, &["ACL", "LOG"]);
    let lines: Vec<&str> = log.lines().collect();
    lines
        .windows(2)
        .filter(|w| w[0] == "object" && w[1] != "client|setinfo")
        .map(|w| w[1].to_owned())
        .collect()
}

/// A server on the TLS store `store`, logged in as the README's user with
/// the password in `password_file`.
async fn as_the_readme_user(pki: &Pki, store: &str, password_file: &Path) -> Server {
    let tls_args = pki.fusebox_args();
    let mut args = vec!["--store", store];
    args.extend(strs(&tls_args));
    args.extend([
        "--store-user",
        "fusebox",
        "--store-password-file",
        text(password_file),
    ]);
    Server::start(Options {
        config: Some(CONFIG),
        args,
        ..Options::default()
    })
    .await
}

/// A password for fusebox's user, written where the README's line reads
/// it.
fn password_in(dir: &Path) -> (String, PathBuf) {
    let password = format!("fb-{}", random_hex(12));
    let file = write(dir, "fusebox-redis.password", &format!("{password}\n"));
    (password, file)
}

/// Acquire, Complete, a trip, ListKeys and Watch, on keys under `prefix`.
async fn serves_every_call(server: &Server, prefix: &str) {
    let key = |name: &str| format!("{prefix}{name}");
    let mut watching = watch(server, prefix).await;
    let mut client = server.fusebox().await;
    let phase = pair(&mut client, &key("ok"), pb::Outcome::Success).await;
    assert_eq!(phase, pb::Phase::Closed as i32, "a pair over a TLS store");
    trip(&mut client, &key("broken")).await;
    let listed = crate::admin::list_all(&mut server.admin().await, prefix, &[], 10).await;
    assert_eq!(listed, [key("broken"), key("ok")]);
    let t = next_transition(&mut watching).await;
    assert_eq!(
        (t.key.as_str(), t.from, t.to),
        (
            key("broken").as_str(),
            pb::Phase::Closed as i32,
            pb::Phase::Open as i32
        ),
        "the transition came through the subscription, over TLS as fusebox: {t:?}"
    );

    // The rest of what a server sends: a renewal, a wait that ends and
    // one withdrawn, an isolation and a close (with their WAIT), a policy
    // change, the census behind /metrics.
    let queue = key("queue");
    let held = client
        .acquire(ask(&queue, None))
        .await
        .expect("Acquire")
        .into_inner();
    assert_eq!(held.decision, pb::Decision::Granted as i32, "{held:?}");
    client
        .renew(pb::RenewRequest {
            ticket: held.ticket.clone(),
            lease: Some(ms(60_000)),
        })
        .await
        .expect("Renew");
    let ended = client
        .acquire(ask(&queue, Some(100)))
        .await
        .expect("Acquire")
        .into_inner();
    crate::admin::assert_denied(&ended, pb::Reason::Timeout);
    let mut leaving = server.fusebox().await;
    let gone = tokio::spawn({
        let queue = queue.clone();
        async move { leaving.acquire(ask(&queue, Some(60_000))).await }
    });
    let waiters = |n: u32| {
        let queue = queue.clone();
        async move {
            eventually(&format!("{n} waiters"), PATIENCE, || async {
                (server.get(&queue).await.waiters == n).then_some(())
            })
            .await
        }
    };
    waiters(1).await;
    gone.abort();
    waiters(0).await;
    complete(&mut client, &held.ticket, pb::Outcome::Success).await;
    let mut admin = server.admin().await;
    for isolate in [true, false] {
        crate::harness::steer(&mut admin, isolate, None, &key("ok"), "over TLS")
            .await
            .expect("Isolate and Close answer");
    }
    crate::admin::set_policy(
        &mut admin,
        crate::admin::rule(&key("p/*"), None, Some(crate::admin::concurrency(2))),
    )
    .await
    .expect("SetPolicy");
    eventually("the census in /metrics", PATIENCE, || async {
        let text = metrics(server).await;
        sample(&text, "fusebox_keys")
            .is_some_and(|n| n >= 3.0)
            .then_some(())
    })
    .await;
}

/// TLS only (`--port 0`), client certificates required, and fusebox's own
/// ACL user made with the README's line, its password in a file: a fusebox
/// server with `rediss://` and those credentials acquires, completes,
/// trips a breaker, lists keys and watches the transition; the user may
/// not run FB.PATCH (nor anything else not granted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_store_and_a_least_privilege_user_serve_every_call() {
    const TEST: &str = "a_tls_store_and_a_least_privilege_user_serve_every_call";
    let Some(tools) = Tools::find(TEST) else {
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let d = dir.path();
    let pki = Pki::new(d);
    let cli_args = pki.cli_args();
    let cli = strs(&cli_args);
    let (password, password_file) = password_in(d);
    let redis = {
        let (tools, d) = (tools.clone(), d.to_owned());
        let (server, cli) = (pki.server_args(), cli_args.clone());
        tokio::task::spawn_blocking(move || {
            let mut extra = vec!["--save", "", "--appendonly", "no"];
            extra.extend(strs(&server));
            let redis = Redis::start_with(&tools, &d, &[], &extra, false, Some(&strs(&cli)));
            lock_down(&tools, &d, redis.port, &strs(&cli));
            redis
        })
        .await
        .expect("redis starts")
    };
    let port = redis.port;
    let store = format!("rediss://127.0.0.1:{port}");
    // TLS settings that cannot work stop the start, naming the flag.
    let stranger = write(d, "stranger.pem", &Ca::new("another CA").pem());
    let plain = format!("redis://127.0.0.1:{port}");
    let (client_pem, client_key) = (text(&pki.client.0), text(&pki.client.1));
    for (args, says) in [
        (
            vec!["--store", &store, "--store-tls-ca", text(&stranger)],
            "--store-tls-ca",
        ),
        (
            vec!["--store", &plain, "--store-tls-ca", text(&pki.ca)],
            "needs a store over TLS",
        ),
        (
            vec!["--store", &store, "--store-tls-cert", client_pem],
            "needs its private key",
        ),
        (
            vec!["--store", &store, "--store-tls-ca", client_key],
            "holds no certificate",
        ),
    ] {
        let err = refused_start(&args, None).await;
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let mut server = as_the_readme_user(&pki, &store, &password_file).await;
    serves_every_call(&server, "tls/").await;
    let denied = refused(&tools, port, &cli);
    assert!(
        denied.is_empty(),
        "the README's user may run all a server sends: {denied:?}"
    );

    // Every link is fusebox's user; the user may not run what it was not
    // granted, FB.PATCH first.
    let mut admin = cli.clone();
    admin.extend(["--user", "admin", "--pass", "admin-pw"]);
    let clients = redis_cli(&tools, port, &admin, &["CLIENT", "LIST"]);
    let links = clients
        .lines()
        .filter(|l| l.starts_with("id=") && l.contains(" user=fusebox "))
        .count();
    assert!(
        links >= 2,
        "the shared link and the subscription log in as fusebox: {clients}"
    );
    let mut as_fusebox = cli.clone();
    as_fusebox.extend(["--user", "fusebox", "--pass", &password]);
    for command in [
        &["FB.PATCH", "fusebox:k:tls/ok", "x"][..],
        &["FB.POLICY", "fusebox:k:tls/ok", "*", "{}"],
        &["KEYS", "*"],
        &["GET", "other:key"],
        &["FLUSHALL"],
    ] {
        let said = redis_cli(&tools, port, &as_fusebox, command);
        assert!(said.contains("NOPERM"), "{command:?}: {said}");
    }
    let denied = refused(&tools, port, &cli);
    assert!(denied.iter().any(|d| d == "fb.patch"), "{denied:?}");
    let said = redis_cli(&tools, port, &as_fusebox, &["FB.VERSION"]);
    assert!(said.contains("module"), "{said}");

    let logs = server.logs();
    assert!(
        logs.contains("notices are not signed"),
        "no secret on either side: the server warns: {logs}"
    );
    server.terminate();
    let logs = server.all_logs().await;
    assert!(!logs.contains(&password), "{logs}");
}

/// The same over a Redis Cluster of three primaries, TLS only (the
/// cluster bus too), each node with the README's user: the cluster client
/// finds every node over TLS as that user (`CLUSTER SLOTS`, `ASKING`
/// granted), and ListKeys walks every primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_and_a_least_privilege_user_serve_every_call() {
    const TEST: &str = "a_tls_cluster_and_a_least_privilege_user_serve_every_call";
    let Some(tools) = Tools::find(TEST) else {
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let d = dir.path();
    let pki = Pki::new(d);
    let (password, password_file) = password_in(d);
    let nodes = {
        let (tools, d) = (tools.clone(), d.to_owned());
        let (server, cli) = (pki.server_args(), pki.cli_args());
        tokio::task::spawn_blocking(move || {
            let cli = strs(&cli);
            let mut extra = vec![
                "--save",
                "",
                "--appendonly",
                "no",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--tls-cluster",
                "yes",
                "--tls-replication",
                "yes",
            ];
            extra.extend(strs(&server));
            let nodes: Vec<Redis> = (0..3)
                .map(|_| Redis::start_with(&tools, &d, &[], &extra, true, Some(&cli)))
                .collect();
            let mut create = vec!["--cluster".to_owned(), "create".to_owned()];
            create.extend(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)));
            create.extend(["--cluster-replicas", "0", "--cluster-yes"].map(str::to_owned));
            let said = redis_cli(&tools, nodes[0].port, &cli, &strs(&create));
            assert!(said.contains("[OK] All 16384 slots covered"), "{said}");
            crate::redis_harness::wait_for("cluster_state:ok on every node", PATIENCE, || {
                nodes
                    .iter()
                    .all(|n| {
                        redis_cli(&tools, n.port, &cli, &["CLUSTER", "INFO"])
                            .contains("cluster_state:ok")
                    })
                    .then_some(())
            });
            for node in &nodes {
                lock_down(&tools, &d, node.port, &cli);
            }
            nodes
        })
        .await
        .expect("the cluster starts")
    };
    let seeds: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let store = format!("rediss-cluster://{}", seeds.join(","));
    let mut server = as_the_readme_user(&pki, &store, &password_file).await;
    serves_every_call(&server, "tlsc/").await;
    // Keys on every primary: all listed.
    let mut client = server.fusebox().await;
    let mut expected: Vec<String> = (0..12).map(|i| format!("spread/{i:02}")).collect();
    for key in &expected {
        trip(&mut client, key).await;
    }
    let mut listed = crate::admin::list_all(&mut server.admin().await, "spread/", &[], 100).await;
    listed.sort();
    expected.sort();
    assert_eq!(listed, expected);
    let cli_args = pki.cli_args();
    for node in &nodes {
        let denied = refused(&tools, node.port, &strs(&cli_args));
        assert!(
            denied.is_empty(),
            "the README's user may run all a server sends: {denied:?}"
        );
    }
    server.terminate();
    let logs = server.all_logs().await;
    assert!(!logs.contains(&password), "{logs}");
    drop(nodes);
}

/// Reads the MONITOR stream of a Redis server (as someone who can reach
/// it could), to learn a waiter's id; killed when dropped.
struct Monitor {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
}

impl Monitor {
    fn start(tools: &Tools, port: u16) -> Monitor {
        let mut child = std::process::Command::new(&tools.cli)
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "MONITOR"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("redis-cli MONITOR");
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let monitor = Monitor { child, lines };
        let first = monitor
            .lines
            .recv_timeout(PATIENCE)
            .expect("MONITOR answers");
        assert_eq!(first.trim(), "OK", "{first}");
        monitor
    }

    /// The id a waiting FB.ACQUIRE of `key` (a Redis key) was sent with.
    fn waiter_of(&self, key: &str) -> String {
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .expect("the waiting FB.ACQUIRE shows in MONITOR");
            let quoted: Vec<&str> = line.split('"').skip(1).step_by(2).collect();
            if quoted.first() == Some(&"FB.ACQUIRE")
                && quoted.get(1) == Some(&key)
                && quoted.contains(&"MAXWAIT")
            {
                return quoted[3].to_owned();
            }
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The module signs with `secret-file`, the servers verify with the same
/// file: forged messages on each channel (unsigned, signed with another
/// secret, and answers that verify but name another key or ticket) are
/// dropped and counted; the waiter they aim at still gets its real
/// answer, the watcher sees no forged transition, forged policies are not
/// put in force, and real ones still are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_notices_are_dropped_counted_and_change_nothing() {
    const TEST: &str = "forged_notices_are_dropped_counted_and_change_nothing";
    let Some(tools) = Tools::find(TEST) else {
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (store, secret_file, redis) = signed_store(&tools, dir.path()).await;
    let secret = std::fs::read_to_string(&secret_file).expect("the secret file");
    let secret = secret.trim();
    let wrong = random_hex(32);
    let port = redis.port;
    let start = || {
        Server::start(Options {
            config: Some(CONFIG),
            args: vec!["--store", &store, "--store-secret-file", text(&secret_file)],
            ..Options::default()
        })
    };
    let a = start().await;
    let b = start().await;
    let publish = |channel: &str, message: &str| {
        let said = redis.conn().cmd(&["PUBLISH", channel, message]);
        assert!(
            matches!(said, crate::resp::Reply::Int(2)),
            "both servers hear it: {said:?}"
        );
    };
    let key = secret.as_bytes();
    let other = wrong.as_bytes();

    // Answers: a caller waits on server A behind a held permit.
    let monitor = Monitor::start(&tools, port);
    let mut holder = a.fusebox().await;
    let held = holder
        .acquire(ask("q/db", None))
        .await
        .expect("Acquire")
        .into_inner();
    assert_eq!(held.decision, pb::Decision::Granted as i32, "{held:?}");
    let mut waiting = a.fusebox().await;
    let waiter = tokio::spawn(async move { waiting.acquire(ask("q/db", Some(60_000))).await });
    let id = monitor.waiter_of("fusebox:k:q/db");
    drop(monitor);
    eventually("the caller to wait", PATIENCE, || async {
        (a.get("q/db").await.waiters == 1).then_some(())
    })
    .await;
    let answer = |key: &str, ticket: &str| {
        serde_json::json!({
            "key": key, "waiter": id, "decision": "granted", "reason": null,
            "ticket": ticket, "lease_ms": 30_000, "retry_after_ms": null,
            "phase": "closed", "now_ms": 1,
        })
        .to_string()
    };
    let forged = answer("fusebox:k:q/db", &id);
    publish("fusebox:answers", &forged);
    publish("fusebox:answers", &sign(other, "fusebox:answers", &forged));
    // Signed with the fleet's secret, but not for this waiter's key, or
    // not granting the waiter's own ticket.
    let elsewhere = answer("fusebox:k:other", &id);
    publish("fusebox:answers", &sign(key, "fusebox:answers", &elsewhere));
    let not_its_ticket = answer("fusebox:k:q/db", &"1".repeat(32));
    publish(
        "fusebox:answers",
        &sign(key, "fusebox:answers", &not_its_ticket),
    );
    counted(&a, &dropped("fusebox:answers"), 4.0).await;
    counted(&b, &dropped("fusebox:answers"), 2.0).await;
    assert!(!waiter.is_finished(), "no forged answer reached the caller");
    assert_eq!(a.get("q/db").await.waiters, 1);
    complete(&mut holder, &held.ticket, pb::Outcome::Success).await;
    // The real answer comes in time.
    let served = crate::admin::granted_within(waiter, PATIENCE).await;
    // The ticket the real answer carried is live.
    let done = complete(&mut b.fusebox().await, &served.ticket, pb::Outcome::Success).await;
    assert!(!done.stale, "{done:?}");

    // Events: forged transitions never reach a watcher; the real one does.
    let mut watching = watch(&a, "w/").await;
    let event = serde_json::json!({
        "key": "fusebox:k:w/forged", "from": "closed", "to": "isolated",
        "cause": "isolated", "at_ms": 1, "who": "attacker", "why": "forged",
        "view": {
            "phase": "isolated", "consecutive_failures": 0, "half_open_attempts": 0,
            "open_until": null, "free": 1, "limit": 1, "queued": 0, "live_tickets": 0,
            "waiters": 0, "epoch": 1, "changed_at": 1, "now_ms": 1, "stats": {},
        },
    })
    .to_string();
    publish("fusebox:events", &event);
    publish("fusebox:events", &sign(other, "fusebox:events", &event));
    counted(&a, &dropped("fusebox:events"), 2.0).await;
    trip(&mut b.fusebox().await, "w/real").await;
    let t = next_transition(&mut watching).await;
    assert_eq!(
        (t.key.as_str(), t.from, t.to),
        ("w/real", pb::Phase::Closed as i32, pb::Phase::Open as i32),
        "the first transition seen is the real one: {t:?}"
    );
    assert_eq!(a.get("w/forged").await.phase, pb::Phase::Closed as i32);

    // Policies: forged change messages, and forged content in the key.
    publish("fusebox:policies", "changed");
    publish(
        "fusebox:policies",
        &sign(other, "fusebox:policies", "changed"),
    );
    counted(&a, &dropped("fusebox:policies"), 2.0).await;
    counted(&b, &dropped("fusebox:policies"), 2.0).await;
    let mut conn = redis.conn();
    let held = conn.cmd(&["GET", "fusebox:policies"]).text();
    let (_, json) = held.split_once(' ').expect("the key's content is signed");
    let mut rules: serde_json::Value = serde_json::from_str(json).expect("rules as JSON");
    let policy = rules["default"].clone();
    rules["rules"]
        .as_array_mut()
        .expect("a list of rules")
        .push(serde_json::json!({ "match": "forged/*", "policy": policy }));
    let rules = rules.to_string();
    for content in [rules.clone(), sign(other, "fusebox:policies", &rules)] {
        assert!(conn.cmd(&["SET", "fusebox:policies", &content]).is_ok());
        // A change message that verifies: each server reads the key again.
        publish(
            "fusebox:policies",
            &sign(key, "fusebox:policies", "changed"),
        );
    }
    let unverified = "fusebox_store_policies_unverified_total";
    counted(&a, unverified, 2.0).await;
    counted(&b, unverified, 2.0).await;
    for server in [&a, &b] {
        let listed = crate::admin::policies(&mut server.admin().await).await;
        assert!(
            listed.rules.iter().all(|r| r.r#match != "forged/*"),
            "{listed:?}"
        );
    }
    // A real change, through A, reaches B (signed, and verified there).
    crate::admin::set_policy(
        &mut a.admin().await,
        crate::admin::rule("real/*", None, Some(crate::admin::concurrency(3))),
    )
    .await
    .expect("SetPolicy answers");
    let admin_b = b.admin().await;
    eventually("B to adopt the real rule", PATIENCE, || {
        let mut admin = admin_b.clone();
        async move {
            let listed = crate::admin::policies(&mut admin).await;
            listed
                .rules
                .iter()
                .any(|r| r.r#match == "real/*")
                .then_some(())
        }
    })
    .await;
    let text = metrics(&b).await;
    assert_eq!(sample(&text, unverified), Some(2.0), "{text}");
}

/// A module that signs with another secret, or does not sign at all,
/// stops a server with a secret at start-up, saying what to do; the
/// reverse too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_that_does_not_match_the_modules_stops_the_start() {
    const TEST: &str = "a_secret_that_does_not_match_the_modules_stops_the_start";
    let Some(tools) = Tools::find(TEST) else {
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let d = dir.path();
    let module_file = write(d, "module.key", &random_hex(32));
    let other_file = write(d, "other.key", &random_hex(32));
    let short_file = write(d, "short.key", "too short\n");
    let (signing, plain) = {
        let (tools, d2, file) = (tools.clone(), d.to_owned(), module_file.clone());
        tokio::task::spawn_blocking(move || {
            let args = ["--save", "", "--appendonly", "no"];
            (
                Redis::start_with(
                    &tools,
                    &d2,
                    &["secret-file", text(&file)],
                    &args,
                    false,
                    None,
                ),
                Redis::start_with(&tools, &d2, &[], &args, false, None),
            )
        })
        .await
        .expect("redis starts")
    };
    let cases = [
        (signing.port, Some(&other_file), "another secret"),
        (signing.port, None, "no secret to verify them"),
        (plain.port, Some(&module_file), "does not sign its notices"),
        (plain.port, Some(&short_file), "at least 16"),
    ];
    for (port, file, says) in cases {
        let store = format!("redis://127.0.0.1:{port}");
        let mut args = vec!["--store", &store];
        if let Some(file) = file {
            args.extend(["--store-secret-file", text(file)]);
        }
        let err = refused_start(&args, None).await;
        assert!(err.contains(says), "{says}: {err}");
    }
}

/// A Redis password given in a file (or the environment) never prints: not
/// in the start-up log, not in an UNAVAILABLE answer once Redis is gone,
/// not in /metrics; one written in the URL works, prints as `***`, and is
/// warned about; a wrong one stops the start without showing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_password_never_prints() {
    const TEST: &str = "a_store_password_never_prints";
    let Some(tools) = Tools::find(TEST) else {
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut redis = {
        let (tools, d) = (tools.clone(), dir.path().to_owned());
        tokio::task::spawn_blocking(move || {
            Redis::start_with(
                &tools,
                &d,
                &[],
                &["--save", "", "--appendonly", "no"],
                false,
                None,
            )
        })
        .await
        .expect("redis starts")
    };
    let password = format!("pw-{}", random_hex(12));
    let set = redis
        .conn()
        .cmd(&["CONFIG", "SET", "requirepass", &password]);
    assert!(set.is_ok(), "{set:?}");
    let port = redis.port;
    let file = write(dir.path(), "redis.password", &format!("{password}\n"));
    let store = format!("redis://127.0.0.1:{port}");

    // A wrong password (from the environment), and an address that does
    // not parse, stop the start without showing what was given.
    let wrong = format!("wrong-{}", random_hex(8));
    let bad_url = format!("redis://fusebox:{wrong}@127.0.0.1");
    let env = Some(("FUSEBOX_STORE_PASSWORD", wrong.as_str()));
    let err = refused_start(&["--store", &store], env).await;
    assert!(
        !err.contains(&wrong) && err.contains("FUSEBOX_STORE_PASSWORD"),
        "a wrong password says where it came from, not what it is: {err}"
    );
    let err = refused_start(&["--store", &bad_url], None).await;
    assert!(!err.contains(&wrong) && err.contains("HOST:PORT"), "{err}");

    let mut server = Server::start(Options {
        args: vec!["--store", &store, "--store-password-file", text(&file)],
        ..Options::default()
    })
    .await;
    let inline = format!("redis://:{password}@127.0.0.1:{port}");
    let mut inline_server = Server::start(Options {
        args: vec!["--store", &inline],
        ..Options::default()
    })
    .await;
    for s in [&server, &inline_server] {
        let a = s
            .fusebox()
            .await
            .acquire(ask("secret/k", None))
            .await
            .expect("Acquire with the password")
            .into_inner();
        assert_eq!(a.decision, pb::Decision::Granted as i32, "{a:?}");
        let text = metrics(s).await;
        assert!(text.contains("fusebox_store_commands_total"), "{text}");
        assert!(!text.contains(&password), "{text}");
    }
    let logs = inline_server.logs();
    assert!(
        logs.contains(&format!("redis://:***@127.0.0.1:{port}"))
            && logs.contains("process listings"),
        "{logs}"
    );

    let _stopped = tokio::task::spawn_blocking(move || {
        redis.kill();
        redis
    })
    .await
    .expect("redis stops");
    let status = server
        .fusebox()
        .await
        .acquire(ask("secret/k", None))
        .await
        .expect_err("no store, no answer");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.message().contains("Redis"), "{status:?}");
    assert!(!status.message().contains(&password), "{status:?}");
    let text = metrics(&server).await;
    assert!(!text.contains(&password), "{text}");
    for s in [&mut server, &mut inline_server] {
        s.terminate();
        let logs = s.all_logs().await;
        assert!(!logs.contains(&password), "{logs}");
    }
}

/// `--store-probe-wait` outside 10 ms to 60 s, or without a unit, stops
/// the start naming the flag and what it takes; no Redis is needed, since
/// the flag is checked before anything connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_wait_out_of_range_is_refused_naming_the_flag() {
    for (wait, says) in [
        ("5ms", "10ms to 60s"),
        ("61s", "10ms to 60s"),
        ("2", "unit"),
    ] {
        let mut cmd = tokio::process::Command::new(BIN);
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"])
            .args(["--store", "redis://127.0.0.1:1", "--store-probe-wait", wait])
            .kill_on_drop(true);
        let out = tokio::time::timeout(PATIENCE, cmd.output())
            .await
            .expect("the server stops in time")
            .expect("the server runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{wait}: {err}");
        assert!(err.contains("--store-probe-wait"), "{wait}: {err}");
        assert!(err.contains(says), "{wait}: {err}");
    }
}

/// A Redis whose fusebox module is of an older encoding than this server
/// needs: a stand-in that answers `FB.VERSION` as the module of encoding 7
/// did (and every other command `+OK`). The server refuses to start and
/// says which node runs which encoding and what to do (a rolling upgrade
/// that reaches the servers first stops there, instead of failing every
/// Acquire the old module cannot parse).
#[tokio::test]
async fn a_module_of_an_older_encoding_is_refused_at_start_naming_the_node() {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = listener.local_addr().expect("its address").port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut out = stream.try_clone().expect("a writer");
                let mut lines = BufReader::new(stream);
                let mut line = String::new();
                // RESP arrays of bulk strings: `*N`, then `$len` and the
                // text, N times; the first text names the command.
                while lines.read_line(&mut line).is_ok_and(|n| n > 0) {
                    let n: usize = line.trim()[1..].parse().unwrap_or(0);
                    let mut words = Vec::new();
                    for _ in 0..n * 2 {
                        line.clear();
                        lines.read_line(&mut line).expect("a line");
                        words.push(line.trim().to_owned());
                    }
                    let answer: &[u8] = if words
                        .get(1)
                        .is_some_and(|c| c.eq_ignore_ascii_case("FB.VERSION"))
                    {
                        b"*6\r\n+module\r\n+0.1.0\r\n+encoding\r\n:7\r\n+signing\r\n+off\r\n"
                    } else {
                        b"+OK\r\n"
                    };
                    if out.write_all(answer).is_err() {
                        return;
                    }
                    line.clear();
                }
            });
        }
    });
    let store = format!("redis://127.0.0.1:{port}");
    let message = crate::harness::refused_start(&["--store", &store], None).await;
    assert!(
        message.contains(&format!("127.0.0.1:{port}"))
            && message.contains("encoding 7")
            && message.contains("needs 8")
            && message.contains("libfusebox_redis.so"),
        "{message}"
    );
}

/// A Redis with the module signing with a fresh secret, and servers that
/// verify with it: the secret, the store's address, and the Redis.
async fn signed_store(tools: &Tools, dir: &Path) -> (String, PathBuf, Redis) {
    let secret = random_hex(32);
    let secret_file = write(dir, "notices.key", &format!("{secret}\n"));
    let redis = {
        let (tools, d, file) = (tools.clone(), dir.to_owned(), secret_file.clone());
        tokio::task::spawn_blocking(move || {
            Redis::start_with(
                &tools,
                &d,
                &["secret-file", text(&file)],
                &["--save", "", "--appendonly", "no"],
                false,
                None,
            )
        })
        .await
        .expect("redis starts")
    };
    let store = format!("redis://127.0.0.1:{}", redis.port);
    (store, secret_file, redis)
}

/// A server on `store` verifying with `secret_file`.
async fn verifying(store: &str, secret_file: &Path) -> Server {
    Server::start(Options {
        config: Some(CONFIG),
        args: vec!["--store", store, "--store-secret-file", text(secret_file)],
        ..Options::default()
    })
    .await
}

/// A connection subscribed to `channel`, as any client of Redis may make.
fn eavesdrop(redis: &Redis, channel: &str) -> crate::resp::Conn {
    let mut conn = redis.conn();
    let said = conn.cmd(&["SUBSCRIBE", channel]);
    assert_eq!(said.items()[0].text(), "subscribe", "{said:?}");
    conn
}

/// The next message a subscribed connection hears, as its exact bytes.
fn overheard(conn: &mut crate::resp::Conn) -> String {
    let m = conn.read().expect("a message within the read timeout");
    let items = m.items();
    assert_eq!(items[0].text(), "message", "{m:?}");
    items[2].text()
}

fn replayed(channel: &str) -> String {
    format!("fusebox_store_notices_replayed_total{{channel=\"{channel}\"}}")
}

/// A hostile client of Redis captures a real, signed isolate event, waits
/// for the key to be closed, and publishes the captured bytes again: the
/// watcher does not see a fresh isolate (the next transition it sees is a
/// real one, of another key), and the refusal is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_captured_event_published_again_is_refused_and_counted() {
    const TEST: &str = "a_captured_event_published_again_is_refused_and_counted";
    let Some(tools) = Tools::find(TEST) else {
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (store, secret_file, redis) = signed_store(&tools, dir.path()).await;
    let a = verifying(&store, &secret_file).await;
    let mut watching = watch(&a, "r/").await;
    let mut events = eavesdrop(&redis, "fusebox:events");
    let mut admin = a.admin().await;

    crate::harness::steer(&mut admin, true, Some("ops"), "r/db", "maintenance")
        .await
        .expect("Isolate answers");
    let captured = overheard(&mut events);
    assert!(
        captured.contains(r#""to":"isolated""#) && captured.contains("fusebox:k:r/db"),
        "{captured}"
    );
    let t = next_transition(&mut watching).await;
    assert_eq!(
        (t.key.as_str(), t.kind, t.to),
        (
            "r/db",
            pb::TransitionKind::Isolate as i32,
            pb::Phase::Isolated as i32
        ),
        "{t:?}"
    );
    crate::harness::steer(&mut admin, false, Some("ops"), "r/db", "done")
        .await
        .expect("Close answers");
    let t = next_transition(&mut watching).await;
    assert_eq!(t.kind, pb::TransitionKind::Close as i32, "{t:?}");
    assert!(overheard(&mut events).contains(r#""to":"closed""#));

    // The captured bytes again, exactly as the module signed them.
    let said = redis
        .conn()
        .cmd(&["PUBLISH", "fusebox:events", captured.as_str()]);
    assert!(
        matches!(said, crate::resp::Reply::Int(2)),
        "the server (and the eavesdropper) hear it: {said:?}"
    );
    trip(&mut a.fusebox().await, "r/after").await;
    let t = next_transition(&mut watching).await;
    assert_eq!(
        (t.key.as_str(), t.to),
        ("r/after", pb::Phase::Open as i32),
        "the replayed isolate reached the watcher as news: {t:?}"
    );
    counted(&a, &replayed("fusebox:events"), 1.0).await;
    assert_eq!(a.get("r/db").await.phase, pb::Phase::Closed as i32);
}

/// The rules each server has in force, by their patterns.
async fn patterns(server: &Server) -> Vec<String> {
    let listed = crate::admin::policies(&mut server.admin().await).await;
    listed.rules.into_iter().map(|r| r.r#match).collect()
}

/// A hostile client of Redis GETs the signed policies value and captures
/// the "changed" message of a change, lets a later change through
/// (SetPolicy), then SETs the old value back and publishes the old
/// "changed" (and the latest one, to make every server read the key): both
/// servers keep the new rules, each says so in /metrics, and a change made
/// on purpose afterwards still reaches them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_signed_policies_set_back_do_not_roll_the_fleet_back() {
    const TEST: &str = "old_signed_policies_set_back_do_not_roll_the_fleet_back";
    let Some(tools) = Tools::find(TEST) else {
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (store, secret_file, redis) = signed_store(&tools, dir.path()).await;
    let a = verifying(&store, &secret_file).await;
    let b = verifying(&store, &secret_file).await;
    let mut changes = eavesdrop(&redis, "fusebox:policies");
    let mut conn = redis.conn();
    let set = |pattern: &'static str| {
        let server = &a;
        async move {
            crate::admin::set_policy(
                &mut server.admin().await,
                crate::admin::rule(pattern, None, Some(crate::admin::concurrency(3))),
            )
            .await
            .expect("SetPolicy answers");
        }
    };
    set("one/*").await;
    let old_changed = overheard(&mut changes);
    let old_value = conn.cmd(&["GET", "fusebox:policies"]).text();
    assert!(old_value.contains("one/*"), "{old_value}");
    set("two/*").await;
    let new_changed = overheard(&mut changes);
    for server in [&a, &b] {
        eventually("every server to take two/*", PATIENCE, || async {
            patterns(server)
                .await
                .contains(&"two/*".to_owned())
                .then_some(())
        })
        .await;
    }

    // The old value set back, with its own change message, then the
    // latest change message, which makes every server read the key.
    assert!(conn.cmd(&["SET", "fusebox:policies", &old_value]).is_ok());
    for message in [&old_changed, &new_changed] {
        let said = conn.cmd(&["PUBLISH", "fusebox:policies", message.as_str()]);
        assert!(matches!(said, crate::resp::Reply::Int(3)), "{said:?}");
    }
    let rolled_back = "fusebox_store_policies_rolled_back_total";
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        for server in [&a, &b] {
            let rules = patterns(server).await;
            assert!(
                rules.contains(&"two/*".to_owned()),
                "a server was rolled back to the old policies: {rules:?}"
            );
        }
        let (text_a, text_b) = (metrics(&a).await, metrics(&b).await);
        if sample(&text_a, rolled_back) == Some(1.0) && sample(&text_b, rolled_back) == Some(1.0) {
            // B never wrote the old version: its change message is a
            // replay there. A wrote it, and knows it for its own past.
            assert_eq!(
                sample(&text_b, &replayed("fusebox:policies")),
                Some(1.0),
                "{text_b}"
            );
            assert_eq!(sample(&text_a, &replayed("fusebox:policies")), Some(0.0));
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no server counted the old policies as refused:\n{text_a}\n{text_b}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    a.until_logged("older than version").await;

    // Rolling back on purpose is a change like any other, through B this
    // time: a new version, which every server takes.
    crate::admin::set_policy(
        &mut b.admin().await,
        crate::admin::rule("three/*", None, Some(crate::admin::concurrency(2))),
    )
    .await
    .expect("SetPolicy answers");
    for server in [&a, &b] {
        eventually("every server to take three/*", PATIENCE, || async {
            patterns(server)
                .await
                .contains(&"three/*".to_owned())
                .then_some(())
        })
        .await;
    }
    let value = conn.cmd(&["GET", "fusebox:policies"]).text();
    assert!(value.contains(r#""version":4"#), "{value}");
}
