//! `[auth]` (issue 8): per role and per key pattern, who gets OK,
//! UNAUTHENTICATED and PERMISSION_DENIED at every RPC and every HTTP route;
//! a ticket cannot be settled with another namespace's token; a foreign
//! `Host` or `Origin` is refused; the token file reloads; the CLI sends
//! `--token` / `FUSEBOX_TOKEN`; and without `[auth]` the server will not
//! listen beyond loopback unless told `--insecure-no-auth`.

use std::time::Duration;

use fusebox::proto::v1 as pb;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::{Code, Request};

use crate::command::{client, fusebox};
use crate::harness::{eventually, ms, Options, Server};

/// The credentials of the table, in column order.
const CREDENTIALS: [(&str, Option<&str>); 8] = [
    ("none", None),
    ("unknown", Some("not-a-token-this-server-knows")),
    ("caller-a", Some("caller-a-token-0123456789")),
    ("caller-b", Some("caller-b-token-0123456789")),
    ("operator-a", Some("operator-a-token-0123456789")),
    ("admin-a", Some("admin-a-token-0123456789")),
    ("admin", Some("admin-token-0123456789abcdef")),
    ("metrics", Some("metrics-token-0123456789")),
];

fn config() -> String {
    let entry = |name: &str, role: &str, prefixes: &str| {
        let token = CREDENTIALS
            .iter()
            .find(|(n, _)| *n == name)
            .and_then(|(_, t)| *t)
            .expect("a token");
        format!(
            "[[auth.token]]\nname = \"{name}\"\nrole = \"{role}\"\n{prefixes}sha256 = \"{}\"\n",
            fusebox::auth::hash_hex(token)
        )
    };
    [
        "[auth]\nmetrics = \"token\"\n".to_owned(),
        entry("caller-a", "caller", "prefixes = [\"a/*\"]\n"),
        entry("caller-b", "caller", "prefixes = [\"b/*\"]\n"),
        entry("operator-a", "operator", "prefixes = [\"a/*\"]\n"),
        entry("admin-a", "admin", "prefixes = [\"a/*\"]\n"),
        entry("admin", "admin", ""),
        entry("metrics", "metrics", ""),
    ]
    .concat()
}

fn with<T>(token: Option<&str>, message: T) -> Request<T> {
    let mut r = Request::new(message);
    if let Some(t) = token {
        r.metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    r
}

/// `+` when the call got past the checks (whatever it answered then),
/// `U` for UNAUTHENTICATED, `D` for PERMISSION_DENIED.
fn mark<T>(result: Result<T, tonic::Status>) -> char {
    match result {
        Err(s) if s.code() == Code::Unauthenticated => 'U',
        Err(s) if s.code() == Code::PermissionDenied => 'D',
        _ => '+',
    }
}

const ADMIN: Option<&str> = Some("admin-token-0123456789abcdef");

/// A live ticket on `key`, taken with the admin token.
async fn ticket(server: &Server, key: &str) -> String {
    let r = server
        .fusebox()
        .await
        .acquire(with(
            ADMIN,
            pb::AcquireRequest {
                key: key.into(),
                permits: Some(1),
                max_wait: None,
                lease: Some(ms(60_000)),
                ..Default::default()
            },
        ))
        .await
        .expect("the admin may acquire")
        .into_inner();
    assert!(!r.ticket.is_empty(), "granted: {r:?}");
    r.ticket
}

fn policy() -> pb::Policy {
    pb::Policy {
        breaker: Some(crate::admin::consecutive(3, 1000)),
        limiter: None,
        lease: None,
        ..Default::default()
    }
}

/// One RPC with `token`, marked.
async fn rpc(server: &Server, call: &str, token: Option<&str>) -> char {
    let channel = server.channel().await;
    let mut f = pb::fusebox_client::FuseboxClient::new(channel.clone());
    let mut a = pb::admin_client::AdminClient::new(channel.clone());
    let mut c = pb::clock_client::ClockClient::new(channel.clone());
    let acquire = |key: &str| crate::admin::one_permit(key);
    let rule = |m: &str, default: bool| pb::SetPolicyRequest {
        rule: Some(pb::PolicyRule {
            r#match: m.into(),
            policy: Some(policy()),
            default,
        }),
    };
    let list = |prefix: &str| pb::ListKeysRequest {
        prefix: prefix.into(),
        ..Default::default()
    };
    match call {
        "Acquire a/k" => mark(f.acquire(with(token, acquire("a/k"))).await),
        "Acquire b/k" => mark(f.acquire(with(token, acquire("b/k"))).await),
        "Complete a/ ticket" | "Complete b/ ticket" => {
            let t = ticket(server, if call.contains("a/") { "a/t" } else { "b/t" }).await;
            mark(
                f.complete(with(
                    token,
                    pb::CompleteRequest {
                        ticket: t,
                        outcome: pb::Outcome::Success as i32,
                        cost: None,
                    },
                ))
                .await,
            )
        }
        "Renew a/ ticket" | "Renew b/ ticket" => {
            let t = ticket(server, if call.contains("a/") { "a/t" } else { "b/t" }).await;
            mark(
                f.renew(with(
                    token,
                    pb::RenewRequest {
                        ticket: t,
                        lease: Some(ms(5000)),
                    },
                ))
                .await,
            )
        }
        "GetKey a/k" => mark(
            a.get_key(with(token, pb::GetKeyRequest { key: "a/k".into() }))
                .await,
        ),
        "GetKey b/k" => mark(
            a.get_key(with(token, pb::GetKeyRequest { key: "b/k".into() }))
                .await,
        ),
        "Isolate a/k" => mark(
            a.isolate(with(
                token,
                pb::IsolateRequest {
                    key: "a/k".into(),
                    reason: "table".into(),
                },
            ))
            .await,
        ),
        "Close a/k" => mark(
            a.close(with(
                token,
                pb::CloseRequest {
                    key: "a/k".into(),
                    reason: "table".into(),
                },
            ))
            .await,
        ),
        "Isolate b/k" => mark(
            a.isolate(with(
                token,
                pb::IsolateRequest {
                    key: "b/k".into(),
                    reason: "table".into(),
                },
            ))
            .await,
        ),
        "ListKeys a/" => mark(a.list_keys(with(token, list("a/"))).await),
        "ListKeys (all)" => mark(a.list_keys(with(token, list(""))).await),
        "Watch a/" => mark(
            a.watch(with(
                token,
                pb::WatchRequest {
                    prefix: "a/".into(),
                },
            ))
            .await,
        ),
        "Watch (all)" => mark(
            a.watch(with(token, pb::WatchRequest { prefix: "".into() }))
                .await,
        ),
        "ListPolicies" => mark(
            a.list_policies(with(token, pb::ListPoliciesRequest {}))
                .await,
        ),
        "SetPolicy a/*" => mark(a.set_policy(with(token, rule("a/*", false))).await),
        "SetPolicy b/*" => mark(a.set_policy(with(token, rule("b/*", false))).await),
        "SetPolicy default" => mark(a.set_policy(with(token, rule("", true))).await),
        "DeletePolicy a/x" => mark(
            a.delete_policy(with(
                token,
                pb::DeletePolicyRequest {
                    r#match: "a/x".into(),
                },
            ))
            .await,
        ),
        "Advance" => mark(
            c.advance(with(token, pb::AdvanceRequest { by: Some(ms(1)) }))
                .await,
        ),
        "Health" => {
            let mut h = tonic_health::pb::health_client::HealthClient::new(channel);
            mark(
                h.check(with(
                    token,
                    tonic_health::pb::HealthCheckRequest {
                        service: String::new(),
                    },
                ))
                .await,
            )
        }
        other => panic!("no call {other:?} in the table"),
    }
}

/// The gRPC table. Columns: none, unknown, caller-a, caller-b, operator-a,
/// admin-a, admin, metrics (a scraper's token: `/metrics` only).
const RPC_TABLE: &[(&str, &str)] = &[
    ("Acquire a/k", "UU+D+++D"),
    ("Acquire b/k", "UUD+DD+D"),
    ("Complete a/ ticket", "UU+D+++D"),
    ("Complete b/ ticket", "UUD+DD+D"),
    ("Renew a/ ticket", "UU+D+++D"),
    ("Renew b/ ticket", "UUD+DD+D"),
    ("GetKey a/k", "UUDD+++D"),
    ("GetKey b/k", "UUDDDD+D"),
    ("Isolate a/k", "UUDD+++D"),
    ("Close a/k", "UUDD+++D"),
    ("Isolate b/k", "UUDDDD+D"),
    ("ListKeys a/", "UUDD+++D"),
    ("ListKeys (all)", "UUDDDD+D"),
    ("Watch a/", "UUDD+++D"),
    ("Watch (all)", "UUDDDD+D"),
    ("ListPolicies", "UUDD+++D"),
    ("SetPolicy a/*", "UUDDD++D"),
    ("SetPolicy b/*", "UUDDDD+D"),
    ("SetPolicy default", "UUDDDD+D"),
    ("DeletePolicy a/x", "UUDDD++D"),
    ("Advance", "UUDDDD+D"),
    ("Health", "++++++++"),
];

#[tokio::test]
async fn every_rpc_answers_each_role_and_namespace_as_the_table_says() {
    let config = config();
    let server = Server::manual(Some(&config)).await;
    let mut wrong = Vec::new();
    for (call, expected) in RPC_TABLE {
        let mut got = String::new();
        for (_, token) in CREDENTIALS {
            got.push(rpc(&server, call, token).await);
        }
        if got != *expected {
            wrong.push(format!("{call}: expected {expected}, got {got}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "columns: none, unknown, caller-a, caller-b, operator-a, admin-a, admin, metrics\n{}",
        wrong.join("\n")
    );
}

#[tokio::test]
async fn refusals_say_which_credential_lacks_what() {
    let config = config();
    let server = Server::manual(Some(&config)).await;
    let mut f = server.fusebox().await;
    let ask = crate::admin::one_permit("b/k");
    let none = f.acquire(with(None, ask.clone())).await.unwrap_err();
    assert!(none.message().contains("authorization: Bearer"), "{none:?}");
    let unknown = f
        .acquire(with(Some("nope-nope-nope"), ask.clone()))
        .await
        .unwrap_err();
    assert!(
        unknown.message().contains("not one this server knows"),
        "{unknown:?}"
    );
    let scoped = f
        .acquire(with(Some("caller-a-token-0123456789"), ask))
        .await
        .unwrap_err();
    assert!(
        scoped.message().contains("\"caller-a\"") && scoped.message().contains("a/*"),
        "{scoped:?}"
    );
    // The ticket of another namespace: refused, and still live for its owner.
    let t = ticket(&server, "b/t").await;
    let other = f
        .complete(with(
            Some("caller-a-token-0123456789"),
            pb::CompleteRequest {
                ticket: t.clone(),
                outcome: pb::Outcome::Failure as i32,
                cost: None,
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(other.code(), Code::PermissionDenied);
    f.complete(with(
        Some("caller-b-token-0123456789"),
        pb::CompleteRequest {
            ticket: t,
            outcome: pb::Outcome::Success as i32,
            cost: None,
        },
    ))
    .await
    .expect("the owner's namespace completes it");
    // An isolate records the credential's name.
    let s = pb::admin_client::AdminClient::new(server.channel().await)
        .isolate(with(
            Some("operator-a-token-0123456789"),
            pb::IsolateRequest {
                key: "a/who".into(),
                reason: "incident".into(),
            },
        ))
        .await
        .expect("isolated")
        .into_inner();
    assert_eq!(s.phase, pb::Phase::Isolated as i32);
}

/// Sends one HTTP request and reads only the status line and headers (an
/// event stream never ends).
async fn http(addr: &str, method: &str, path: &str, headers: &[(&str, String)]) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let mut head = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
        head.push_str(&format!("Host: {addr}\r\n"));
    }
    for (n, v) in headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    let body = if method == "POST" {
        r#"{"reason":"table"}"#
    } else {
        ""
    };
    if method == "POST" {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    head.push_str("\r\n");
    head.push_str(body);
    stream.write_all(head.as_bytes()).await.expect("sent");
    crate::http::read_head(&mut stream).await
}

/// The HTTP table: `+` 2xx, `U` 401, `D` 403. Columns as for gRPC.
const HTTP_TABLE: &[(&str, &str, &str)] = &[
    ("GET", "/", "++++++++"),
    ("GET", "/app.js", "++++++++"),
    ("GET", "/style.css", "++++++++"),
    ("GET", "/healthz", "++++++++"),
    ("GET", "/readyz", "++++++++"),
    ("GET", "/metrics", "UUDDDD++"),
    ("GET", "/api/overview", "UUDDDD+D"),
    ("GET", "/api/keys?prefix=a/", "UUDDDD+D"),
    ("GET", "/api/transitions", "UUDDDD+D"),
    ("GET", "/api/events", "UUDDDD+D"),
    ("POST", "/api/keys/a%2Fk/isolate", "UUDD+++D"),
    ("POST", "/api/keys/a%2Fk/close", "UUDD+++D"),
    ("POST", "/api/keys/b%2Fk/isolate", "UUDDDD+D"),
];

#[tokio::test]
async fn every_http_route_answers_each_role_as_the_table_says_and_foreign_names_are_refused() {
    let config = config();
    let server = Server::manual(Some(&config)).await;
    let addr = server.http_addr.clone().expect("HTTP is on");
    let mut wrong = Vec::new();
    for (method, path, expected) in HTTP_TABLE {
        let mut got = String::new();
        for (_, token) in CREDENTIALS {
            let headers: Vec<(&str, String)> = token
                .map(|t| vec![("Authorization", format!("Bearer {t}"))])
                .unwrap_or_default();
            let (status, head) = http(&addr, method, path, &headers).await;
            got.push(match status {
                200..=299 => '+',
                401 => {
                    assert!(
                        head.to_ascii_lowercase()
                            .contains("www-authenticate: bearer"),
                        "{head}"
                    );
                    'U'
                }
                403 => 'D',
                other => panic!("{method} {path}: status {other}: {head}"),
            });
        }
        if got != *expected {
            wrong.push(format!("{method} {path}: expected {expected}, got {got}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));

    // A page on a foreign name (DNS rebinding) is refused, even with a token.
    let admin = vec![("Authorization", format!("Bearer {}", ADMIN.unwrap()))];
    let mut foreign_host = admin.clone();
    foreign_host.push(("Host", "evil.example:9090".to_owned()));
    let (status, head) = http(&addr, "POST", "/api/keys/a%2Fk/isolate", &foreign_host).await;
    assert_eq!(status, 403, "{head}");
    let (status, _) = http(&addr, "GET", "/", &[("Host", "evil.example".to_owned())]).await;
    assert_eq!(status, 403);
    // Issue 18: an IP literal and another port of this machine are other
    // origins too; only the server's own address and port is its own.
    let other_port = format!(
        "http://127.0.0.1:{}",
        addr.rsplit_once(':')
            .map_or(0, |(_, p)| p.parse::<u16>().unwrap_or(0) ^ 1)
    );
    for origin in [
        "http://evil.example",
        "http://203.0.113.7",
        other_port.as_str(),
    ] {
        let mut foreign_origin = admin.clone();
        foreign_origin.push(("Origin", origin.to_owned()));
        let (status, _) = http(&addr, "POST", "/api/keys/a%2Fk/close", &foreign_origin).await;
        assert_eq!(status, 403, "{origin}");
    }
    let mut same_origin = admin;
    same_origin.push(("Origin", format!("http://{addr}")));
    let (status, head) = http(&addr, "POST", "/api/keys/a%2Fk/close", &same_origin).await;
    assert_eq!(status, 200, "{head}");
}

#[tokio::test]
async fn a_configured_host_name_is_answered() {
    let config = format!(
        "[server]\nhttp_hosts = [\"fusebox.internal\"]\n{}",
        config()
    );
    let server = Server::manual(Some(&config)).await;
    let addr = server.http_addr.clone().expect("HTTP is on");
    for (host, answer) in [("fusebox.internal:9090", 200), ("other.internal", 403)] {
        let (status, _) = http(&addr, "GET", "/healthz", &[("Host", host.into())]).await;
        assert_eq!(status, answer, "Host: {host}");
    }
}

#[tokio::test]
async fn tokens_added_to_the_token_file_are_taken_without_a_restart() {
    let dir = tempfile::tempdir().expect("a dir");
    let file = dir.path().join("tokens.toml");
    let entry = |name: &str, token: &str| {
        format!(
            "[[token]]\nname = \"{name}\"\nrole = \"caller\"\nsha256 = \"{}\"\n",
            fusebox::auth::hash_hex(token)
        )
    };
    std::fs::write(&file, entry("first", "first-token-0123456789")).unwrap();
    let config = format!("[auth]\ntoken_file = \"{}\"\n", file.display());
    let server = Server::start(Options {
        config: Some(&config),
        ..Options::default()
    })
    .await;
    let ask = |token: &'static str| crate::tenants::check_as(&server, token, "k");
    assert_eq!(ask("first-token-0123456789").await, Ok(()));
    assert_eq!(
        ask("second-token-0123456789").await,
        Err(Code::Unauthenticated)
    );
    std::fs::write(&file, entry("second", "second-token-0123456789")).unwrap();
    eventually(
        "the new token file is read",
        Duration::from_secs(10),
        || async { (ask("second-token-0123456789").await == Ok(())).then_some(()) },
    )
    .await;
    assert_eq!(
        ask("first-token-0123456789").await,
        Err(Code::Unauthenticated)
    );
    // A broken token file keeps the running tokens.
    std::fs::write(&file, "[[token]]\nname = \"x\"\n").unwrap();
    server.until_logged("config not reloaded").await;
    assert_eq!(ask("second-token-0123456789").await, Ok(()));
}

/// Issue 18, paths in config: `--config /etc/fusebox/fusebox.toml` with
/// README's `token_file = "tokens.toml"` and a relative `data_dir` starts
/// from any working directory, both taken from the file's directory.
#[tokio::test]
async fn a_config_files_relative_paths_are_taken_from_its_directory() {
    let conf = tempfile::tempdir().expect("a dir");
    let elsewhere = tempfile::tempdir().expect("a dir");
    std::fs::write(
        conf.path().join("tokens.toml"),
        format!(
            "[[token]]\nname = \"caller\"\nrole = \"caller\"\nsha256 = \"{}\"\n",
            fusebox::auth::hash_hex("relative-token-0123456789")
        ),
    )
    .unwrap();
    let config = conf.path().join("fusebox.toml");
    std::fs::write(
        &config,
        "[server]\ndata_dir = \"state\"\n\n[auth]\ntoken_file = \"tokens.toml\"\n",
    )
    .unwrap();
    let config = config.to_str().expect("a UTF-8 path");
    let server = Server::start(Options {
        args: vec!["--config", config],
        cwd: Some(elsewhere.path()),
        ..Options::default()
    })
    .await;
    let answer = server
        .fusebox()
        .await
        .acquire(with(
            Some("relative-token-0123456789"),
            crate::admin::status_check("k"),
        ))
        .await;
    assert!(answer.is_ok(), "the token file was read: {answer:?}");
    assert!(
        conf.path().join("state").is_dir(),
        "the data dir is beside the config file"
    );
    assert!(
        !elsewhere.path().join("state").exists(),
        "and not in the working directory"
    );
}

#[tokio::test]
async fn the_cli_sends_its_token_from_the_flag_or_the_environment() {
    let made = fusebox(&["token", "--name", "ops", "--role", "operator"]).await;
    let out = made.ok();
    let token = out
        .lines()
        .find_map(|l| l.strip_prefix("token: "))
        .expect("the token is printed")
        .to_owned();
    let entry: String = out
        .lines()
        .skip_while(|l| !l.starts_with("[[auth.token]]"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(
        entry.contains("role = \"operator\"") && !entry.contains(&token),
        "{out}"
    );
    let server = Server::start(Options {
        config: Some(&entry),
        ..Options::default()
    })
    .await;
    let refused = client(&server, &["get", "k"]).await;
    assert!(
        refused.failed(1).contains("UNAUTHENTICATED"),
        "{}",
        refused.stderr
    );
    let by_flag = client(&server, &["get", "k", "--token", &token]).await;
    assert!(by_flag.ok().contains("CLOSED"), "{}", by_flag.stdout);
    let by_env = tokio::process::Command::new(crate::harness::BIN)
        .args([
            "isolate",
            "k",
            "--reason",
            "drill",
            "--server",
            &server.addr,
        ])
        .env("FUSEBOX_TOKEN", &token)
        .output()
        .await
        .expect("runs");
    assert!(by_env.status.success(), "{by_env:?}");
    let s = server
        .admin()
        .await
        .get_key(with(Some(&token), pb::GetKeyRequest { key: "k".into() }))
        .await
        .expect("the operator reads the key")
        .into_inner();
    assert_eq!(s.phase, pb::Phase::Isolated as i32);
}

#[tokio::test]
async fn without_auth_the_server_refuses_to_listen_beyond_loopback_unless_told() {
    let run = fusebox(&["serve", "--listen", "0.0.0.0:0", "--http", "127.0.0.1:0"]).await;
    let message = run.failed(1);
    assert_eq!(message.lines().count(), 1, "one line: {message}");
    assert!(
        message.contains("without [auth]") && message.contains("--insecure-no-auth"),
        "{message}"
    );
    let run = fusebox(&["serve", "--listen", "127.0.0.1:0", "--http", "0.0.0.0:0"]).await;
    assert!(run.failed(1).contains("0.0.0.0"), "{}", run.stderr);
    // Told: it serves, and says what that means.
    let mut child = crate::process::spawn(
        tokio::process::Command::new(crate::harness::BIN)
            .args([
                "serve",
                "--listen",
                "0.0.0.0:0",
                "--http",
                "127.0.0.1:0",
                "--insecure-no-auth",
            ])
            .stderr(std::process::Stdio::piped()),
        "starts",
    );
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("prints its address")
        .unwrap()
        .unwrap_or_default();
    assert!(first.starts_with("listening on 0.0.0.0:"), "{first}");
    child.start_kill().unwrap();
    let mut logs = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut logs)
        .await
        .unwrap();
    assert!(
        logs.contains("without [auth] (--insecure-no-auth)"),
        "{logs}"
    );
}
