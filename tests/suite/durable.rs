//! State kept in a data dir (`--data-dir`) across restarts and crashes:
//! breakers, isolations and runtime policies come back; tickets do not.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fusebox::proto::v1 as pb;
use tonic::transport::Channel;

use crate::harness::{eventually, ms, refused_start, steer, Options, Server};

type Client = pb::fusebox_client::FuseboxClient<Channel>;
type Admin = pb::admin_client::AdminClient<Channel>;

const TRIPS_AT_TWO: &str = r#"
[default]
breaker = { mode = "consecutive", failures = 2, break = "60s" }

[[rule]]
match = "lim"
limiter = { kind = "concurrency", permits = 1 }
"#;

async fn start(dir: &Path, config: Option<&str>, manual_clock: bool) -> Server {
    Server::start(Options {
        config,
        manual_clock,
        args: vec!["--data-dir", dir.to_str().expect("a UTF-8 temp path")],
        ..Options::default()
    })
    .await
}

/// SIGKILL, and waits for the process to end.
async fn crash(mut server: Server) {
    server.child.start_kill().expect("SIGKILL sent");
    server.child.wait().await.expect("the server ends");
}

async fn metric(server: &Server, name: &str) -> Option<f64> {
    let addr = server.http_addr.clone().expect("an HTTP address");
    let reply = crate::http::get(&addr, "/metrics").await;
    reply
        .body
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .map(|v| v.trim().parse().expect("a number"))
}

/// Waits until the data dir holds `n` keys.
async fn stored(server: &Server, n: u64) {
    eventually(
        &format!("{n} keys stored"),
        Duration::from_secs(10),
        || async move {
            (metric(server, "fusebox_storage_keys").await == Some(n as f64)).then_some(())
        },
    )
    .await;
}

fn ask(key: &str) -> pb::AcquireRequest {
    crate::admin::request(key)
}

async fn acquire(c: &mut Client, key: &str) -> pb::AcquireResponse {
    c.acquire(ask(key))
        .await
        .expect("Acquire answers")
        .into_inner()
}

async fn fail(c: &mut Client, key: &str) -> pb::Phase {
    let r = acquire(c, key).await;
    assert!(!r.ticket.is_empty(), "{key}: {r:?}");
    crate::admin::complete(c, &r.ticket, pb::Outcome::Failure)
        .await
        .phase()
}

fn millis(d: Option<prost_types::Duration>) -> u64 {
    crate::harness::millis(d).expect("a duration")
}

#[tokio::test]
async fn open_half_open_isolated_and_failing_keys_come_back_after_a_crash_and_tickets_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), Some(TRIPS_AT_TWO), true).await;
    let mut c = server.fusebox().await;
    let mut admin = server.admin().await;
    let mut clock = server.clock().await;
    // half: tripped, then its break ends and one probe goes out.
    fail(&mut c, "half").await;
    assert_eq!(fail(&mut c, "half").await, pb::Phase::Open);
    clock
        .advance(pb::AdvanceRequest {
            by: Some(ms(60_000)),
        })
        .await
        .unwrap();
    let probe = acquire(&mut c, "half").await;
    assert_eq!(probe.decision(), pb::Decision::Probe);
    fail(&mut c, "open").await;
    assert_eq!(fail(&mut c, "open").await, pb::Phase::Open);
    assert_eq!(fail(&mut c, "fails").await, pb::Phase::Closed);
    steer(&mut admin, true, Some("alice"), "iso", "db migration")
        .await
        .unwrap();
    let held = acquire(&mut c, "lim").await;
    assert_eq!(held.decision(), pb::Decision::Granted);
    assert_eq!(
        acquire(&mut c, "lim").await.decision(),
        pb::Decision::Denied
    );
    // half, open, fails and iso; lim is at rest but for its ticket.
    stored(&server, 4).await;
    crash(server).await;

    let started = Instant::now();
    let server = start(dir.path(), Some(TRIPS_AT_TWO), true).await;
    server
        .until_logged("restored 4 keys (1 open, 1 half-open, 1 isolated, 1 closed with failures)")
        .await;
    let logs = server.logs();
    assert!(
        logs.contains("key stays isolated, as alice asked at"),
        "{logs}"
    );
    assert!(logs.contains("db migration"), "{logs}");
    let mut c = server.fusebox().await;
    let open = server.get("open").await;
    assert_eq!(open.phase(), pb::Phase::Open);
    let left = millis(open.open_remaining);
    let since_kill = started.elapsed().as_millis() as u64;
    // The break goes on in wall time: what the restart took is gone from it.
    assert!(
        left <= 60_000 && left + since_kill + 5_000 >= 60_000,
        "{left} ms left"
    );
    assert_eq!(
        acquire(&mut c, "open").await.reason(),
        pb::Reason::Open,
        "still blocked"
    );
    assert_eq!(server.get("iso").await.phase(), pb::Phase::Isolated);
    assert_eq!(
        acquire(&mut c, "iso").await.decision(),
        pb::Decision::Refused
    );
    let fails = server.get("fails").await;
    assert_eq!(
        (fails.phase(), fails.consecutive_failures),
        (pb::Phase::Closed, 1)
    );
    // The kept run counts: one more failure makes two.
    assert_eq!(fail(&mut c, "fails").await, pb::Phase::Open);
    // HALF_OPEN with its probe slot free: the first request is the one probe.
    let half = server.get("half").await;
    assert_eq!(
        (half.phase(), half.half_open_attempts),
        (pb::Phase::HalfOpen, 1)
    );
    assert_eq!(
        acquire(&mut c, "half").await.decision(),
        pb::Decision::Probe
    );
    let second = acquire(&mut c, "half").await;
    assert_eq!(
        (second.decision(), second.reason()),
        (pb::Decision::Blocked, pb::Reason::ProbeInFlight)
    );
    // Tickets from before the crash are gone, and so are their permits.
    for ticket in [probe.ticket, held.ticket] {
        crate::admin::complete_not_found(&mut c, &ticket).await;
    }
    assert_eq!(
        acquire(&mut c, "lim").await.decision(),
        pb::Decision::Granted
    );
}

fn consecutive(failures: u32) -> pb::Policy {
    pb::Policy {
        breaker: Some(pb::Breaker {
            mode: Some(pb::breaker::Mode::Consecutive(pb::Consecutive { failures })),
            break_duration: Some(ms(10 * 60_000)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn set_policy(admin: &mut Admin, pattern: &str, failures: u32) -> Result<(), tonic::Status> {
    admin
        .set_policy(pb::SetPolicyRequest {
            rule: Some(pb::PolicyRule {
                r#match: pattern.into(),
                policy: Some(consecutive(failures)),
                default: pattern.is_empty(),
            }),
        })
        .await
        .map(|_| ())
}

async fn policies(admin: &mut Admin) -> pb::ListPoliciesResponse {
    admin
        .list_policies(pb::ListPoliciesRequest {})
        .await
        .expect("ListPolicies answers")
        .into_inner()
}

#[tokio::test]
async fn policies_set_and_deleted_at_run_time_come_back_on_top_of_the_file() {
    let config = r#"
[[rule]]
match = "a"
breaker = { mode = "consecutive", failures = 1, break = "1s" }

[[rule]]
match = "b*"
breaker = { mode = "consecutive", failures = 2, break = "1s" }
"#;
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), Some(config), true).await;
    let mut admin = server.admin().await;
    set_policy(&mut admin, "c*", 3).await.unwrap();
    set_policy(&mut admin, "a", 4).await.unwrap();
    admin
        .delete_policy(pb::DeletePolicyRequest {
            r#match: "b*".into(),
        })
        .await
        .unwrap();
    set_policy(&mut admin, "", 5).await.unwrap();
    set_policy(&mut admin, "d", 6).await.unwrap();
    set_policy(&mut admin, "c*", 7).await.unwrap();
    let before = policies(&mut admin).await;
    let matches: Vec<_> = before.rules.iter().map(|r| r.r#match.as_str()).collect();
    assert_eq!(matches, ["a", "c*", "d"]);
    crash(server).await;
    let server = start(dir.path(), Some(config), true).await;
    server.until_logged("and 5 runtime policy changes").await;
    let mut admin = server.admin().await;
    assert_eq!(policies(&mut admin).await, before);
}

#[tokio::test]
async fn keys_back_at_rest_and_forgotten_leave_the_store() {
    let config = r#"
[server]
idle_after = "1s"

[default]
breaker = { mode = "consecutive", failures = 3, break = "1s" }
"#;
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), Some(config), true).await;
    let mut c = server.fusebox().await;
    fail(&mut c, "k").await;
    fail(&mut c, "k").await;
    stored(&server, 1).await;
    let ok = acquire(&mut c, "k").await;
    crate::admin::complete(&mut c, &ok.ticket, pb::Outcome::Success).await;
    // A success ends the run: the key is at rest, and deleted.
    stored(&server, 0).await;
    server
        .clock()
        .await
        .advance(pb::AdvanceRequest {
            by: Some(ms(2_000)),
        })
        .await
        .unwrap();
    eventually(
        "the idle key is forgotten",
        Duration::from_secs(10),
        || async { (metric(&server, "fusebox_keys").await == Some(0.0)).then_some(()) },
    )
    .await;
    crash(server).await;
    let server = start(dir.path(), Some(config), true).await;
    server.until_logged("restored 0 keys").await;
    let listed = server
        .admin()
        .await
        .list_keys(pb::ListKeysRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(listed.keys.is_empty(), "{listed:?}");
}

#[tokio::test]
async fn without_a_data_dir_the_server_says_state_is_in_memory_only() {
    let server = Server::manual(None).await;
    server.until_logged("fusebox is serving").await;
    assert!(
        server.logs().contains("state is kept in memory only: pass --data-dir DIR to keep breakers, isolations and policies across restarts"),
        "{}",
        server.logs()
    );
    let serving = server
        .logs()
        .lines()
        .find(|l| l.contains("fusebox is serving"))
        .map(str::to_owned)
        .unwrap_or_default();
    assert!(
        serving.contains("state=in memory only"),
        "the start-up line says it: {serving}"
    );
    assert_eq!(metric(&server, "fusebox_storage_keys").await, None);
}

#[tokio::test]
async fn a_data_dir_that_cannot_be_used_stops_the_start_and_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, "x").unwrap();
    let damaged = dir.path().join("damaged");
    std::fs::create_dir(&damaged).unwrap();
    std::fs::write(
        damaged.join(fusebox::engine::DATA_FILE),
        vec![0x5a; 64 * 1024],
    )
    .unwrap();
    for (data_dir, says) in [
        (&file, "pick another --data-dir"),
        (&damaged, "move it aside"),
    ] {
        let data_dir = data_dir.to_str().expect("a UTF-8 path");
        let err = refused_start(&["--data-dir", data_dir], None).await;
        assert!(err.contains("the server did not start"), "{err}");
        assert!(err.contains(data_dir), "{err}");
        assert!(err.contains(says), "{err}");
    }
}

/// What one client of the crash test saw acknowledged.
#[derive(Default)]
struct Seen {
    /// Operator keys: the last acknowledged phase, and the one in flight.
    actions: HashMap<String, (Option<pb::Phase>, Option<pb::Phase>)>,
    /// Keys seen tripped, with when.
    trips: Vec<(String, Instant)>,
    /// Patterns: the last acknowledged failures, and the one in flight.
    policies: HashMap<String, (Option<u32>, Option<u32>)>,
}

/// One client's scripted workload, until the server dies under it.
async fn workload(server_addr: String, client: usize, round: usize, seen: Arc<Mutex<Seen>>) {
    let channel = match tonic::transport::Endpoint::from_shared(format!("http://{server_addr}"))
        .unwrap()
        .connect()
        .await
    {
        Ok(ch) => ch,
        Err(_) => return,
    };
    let mut c = Client::new(channel.clone());
    let mut admin = Admin::new(channel);
    for step in 0usize.. {
        let pick = (step * 7 + client * 3 + round) % 10;
        match pick {
            0..=3 => {
                let key = format!("c{client}-op{}", (step + round) % 4);
                let isolate = (step + round + client).is_multiple_of(2);
                let to = if isolate {
                    pb::Phase::Isolated
                } else {
                    pb::Phase::Closed
                };
                seen.lock()
                    .unwrap()
                    .actions
                    .entry(key.clone())
                    .or_default()
                    .1 = Some(to);
                let reason = format!("round {round} step {step}");
                let done = steer(&mut admin, isolate, Some("crash-test"), &key, &reason).await;
                if done.is_err() {
                    return;
                }
                let mut s = seen.lock().unwrap();
                *s.actions.get_mut(&key).unwrap() = (Some(to), None);
            }
            4..=7 => {
                let key = format!("c{client}-r{round}-t{step}");
                for _ in 0..2 {
                    let Ok(r) = c.acquire(ask(&key)).await else {
                        return;
                    };
                    let r = r.into_inner();
                    let Ok(done) = c
                        .complete(pb::CompleteRequest {
                            ticket: r.ticket,
                            outcome: pb::Outcome::Failure as i32,
                            cost: None,
                        })
                        .await
                    else {
                        return;
                    };
                    if done.into_inner().phase() == pb::Phase::Open {
                        seen.lock()
                            .unwrap()
                            .trips
                            .push((key.clone(), Instant::now()));
                    }
                }
            }
            _ => {
                let pattern = format!("c{client}-p{}*", step % 3);
                let failures = (round * 100 + step) as u32 % 1000 + 1;
                seen.lock()
                    .unwrap()
                    .policies
                    .entry(pattern.clone())
                    .or_default()
                    .1 = Some(failures);
                if set_policy(&mut admin, &pattern, failures).await.is_err() {
                    return;
                }
                *seen.lock().unwrap().policies.get_mut(&pattern).unwrap() = (Some(failures), None);
            }
        }
    }
}

/// Every key in `phase`, page by page.
async fn keys_in(admin: &mut Admin, phase: pb::Phase) -> HashMap<String, pb::KeyState> {
    let mut all = HashMap::new();
    let mut token = String::new();
    loop {
        let page = admin
            .list_keys(pb::ListKeysRequest {
                phases: vec![phase as i32],
                page_size: 1000,
                page_token: token,
                ..Default::default()
            })
            .await
            .expect("ListKeys answers")
            .into_inner();
        all.extend(page.keys.into_iter().map(|k| (k.key.clone(), k)));
        if page.next_page_token.is_empty() {
            return all;
        }
        token = page.next_page_token;
    }
}

const CRASH_CONFIG: &str = r#"
[server]
commit_window = "50ms"

[default]
breaker = { mode = "consecutive", failures = 2, break = "10m" }
"#;

/// 50 SIGKILLs at points spread over a workload of trips, isolates, closes
/// and SetPolicy from four clients at once; after each, a restart on the
/// same data dir must show every acknowledged action and policy, and every
/// trip seen more than a commit window (plus a margin) before the kill.
#[tokio::test]
async fn fifty_crashes_lose_no_acknowledged_action_and_no_transition_older_than_the_window() {
    const CRASHES: usize = 50;
    const CLIENTS: usize = 4;
    // The commit window plus time for the commit itself on a busy machine.
    let margin = Duration::from_millis(50 + 450);
    let dir = tempfile::tempdir().unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut all_trips: Vec<String> = Vec::new();
    let (mut actions_checked, mut policies_checked, mut transitions_checked) = (0, 0, 0);
    let mut server = start(dir.path(), Some(CRASH_CONFIG), false).await;
    for round in 0..CRASHES {
        let clients: Vec<_> = (0..CLIENTS)
            .map(|i| tokio::spawn(workload(server.addr.clone(), i, round, seen.clone())))
            .collect();
        // A kill point spread over 30..330 ms into the workload.
        let at = 30 + (round as u64 * 97) % 300;
        tokio::time::sleep(Duration::from_millis(at)).await;
        let killed_at = Instant::now();
        crash(server).await;
        for client in clients {
            client.await.unwrap();
        }
        server = start(dir.path(), Some(CRASH_CONFIG), false).await;
        let mut admin = server.admin().await;
        let open = keys_in(&mut admin, pb::Phase::Open).await;
        let isolated = keys_in(&mut admin, pb::Phase::Isolated).await;
        let listed = policies(&mut admin).await;
        let mut s = seen.lock().unwrap();
        for (key, (acked, in_flight)) in s.actions.iter_mut() {
            let now = if isolated.contains_key(key) {
                pb::Phase::Isolated
            } else {
                pb::Phase::Closed
            };
            let acked_phase = acked.unwrap_or(pb::Phase::Closed);
            assert!(
                now == acked_phase || Some(now) == *in_flight,
                "round {round}: {key} is {now:?}, acknowledged {acked:?}, in flight {in_flight:?}"
            );
            // What is there now is what the next round starts from.
            *acked = Some(now);
            *in_flight = None;
            actions_checked += 1;
        }
        for (pattern, (acked, in_flight)) in s.policies.iter_mut() {
            let now = listed
                .rules
                .iter()
                .find(|r| &r.r#match == pattern)
                .and_then(|r| match r.policy.as_ref()?.breaker.as_ref()?.mode {
                    Some(pb::breaker::Mode::Consecutive(c)) => Some(c.failures),
                    _ => None,
                });
            assert!(
                now == *acked || (now.is_some() && now == *in_flight),
                "round {round}: policy {pattern} has failures {now:?}, acknowledged {acked:?}, in flight {in_flight:?}"
            );
            *acked = now;
            *in_flight = None;
            policies_checked += 1;
        }
        for (key, when) in s.trips.drain(..) {
            // Older than the window and margin: must be there. Newer: from
            // now on only if it made it.
            if when + margin <= killed_at || open.contains_key(&key) {
                all_trips.push(key);
            }
        }
        drop(s);
        for key in &all_trips {
            assert!(
                open.contains_key(key),
                "round {round}: {key} was seen OPEN long enough before the kill, and is not OPEN now"
            );
            transitions_checked += 1;
        }
    }
    println!(
        "{CRASHES} crashes, {actions_checked} acknowledged actions and {policies_checked} policies checked, {} distinct transitions checked {transitions_checked} times in all, 0 lost",
        all_trips.len()
    );
    assert!(actions_checked > 0 && policies_checked > 0 && transitions_checked > 0);
}

#[tokio::test]
async fn the_config_files_data_dir_is_used_when_no_flag_names_one_and_its_fields_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[server]\ndata_dir = {:?}\ncommit_window = \"20ms\"\n",
        dir.path().join("state").to_str().unwrap()
    );
    let server = Server::manual(Some(&config)).await;
    server.until_logged("state is kept in").await;
    steer(
        &mut server.admin().await,
        true,
        Some("bob"),
        "k",
        "maintenance",
    )
    .await
    .unwrap();
    // Written before the reply: one commit at least, and the key stored.
    assert!(metric(&server, "fusebox_storage_commits_total").await >= Some(1.0));
    assert_eq!(metric(&server, "fusebox_storage_keys").await, Some(1.0));
    crash(server).await;
    let server = Server::manual(Some(&config)).await;
    server.until_logged("1 isolated").await;
    assert_eq!(server.get("k").await.phase(), pb::Phase::Isolated);
    drop(server);
    for (bad, says) in [
        (
            "commit_window = \"5s\"",
            "commit_window: must be from 1ms to 1000ms",
        ),
        (
            "commit_window = 0",
            "commit_window: must be from 1ms to 1000ms",
        ),
        ("data_dir = \"\"", "data_dir: must not be empty"),
    ] {
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, format!("[server]\n{bad}\n")).unwrap();
        let err = refused_start(&["--config", path.to_str().expect("a UTF-8 path")], None).await;
        assert!(err.contains(says), "{bad}: {err}");
    }
}
