//! Replays every `clients/scenarios/*.json` (the steps that every client
//! library shares, see `clients/scenarios/README.md`) with the Rust guard,
//! `fusebox::guard`, against a real server on a manual clock.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fusebox::guard::{
    admitted, Admitted, CallOptions, FailPolicy, Guard, GuardError, GuardOptions, Transport,
};
use fusebox::proto::v1 as pb;
use serde_json::{Map, Value};
use tokio::sync::{oneshot, watch};

use crate::harness::{self, Server};

const LIMIT: Duration = Duration::from_secs(5);

/// What a guarded call gave, in the scenario's terms.
#[derive(Debug, Default, Clone)]
struct Seen {
    ran: bool,
    refusal: Option<String>,
    reason: Option<String>,
    retry_after_ms: Option<u64>,
    local: bool,
    error: bool,
    cancelled: bool,
    unavailable: bool,
}

struct Running {
    expect: Option<Value>,
    release: Option<oneshot::Sender<bool>>,
    task: tokio::task::JoinHandle<Seen>,
    ran: watch::Receiver<bool>,
    failed_open: Arc<AtomicBool>,
}

fn scenarios_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("clients/scenarios")
}

fn ms(v: &Value, field: &str) -> Option<Duration> {
    v.get(field)
        .and_then(Value::as_u64)
        .map(Duration::from_millis)
}

fn check_known(obj: &Map<String, Value>, known: &[&str], what: &str) {
    for k in obj.keys() {
        assert!(known.contains(&k.as_str()), "{what}: unknown field {k:?}");
    }
}

fn seen_of(result: Result<(), GuardError<String>>) -> Seen {
    let mut seen = Seen::default();
    match result {
        Ok(()) => {}
        Err(GuardError::Call(_)) => seen.error = true,
        Err(GuardError::Blocked {
            reason,
            retry_after,
            local,
        }) => {
            seen.refusal = Some("blocked".into());
            seen.reason = Some(reason.name());
            seen.retry_after_ms = retry_after.map(|d| d.as_millis() as u64);
            seen.local = local;
        }
        Err(GuardError::Refused) => seen.refusal = Some("refused".into()),
        Err(GuardError::Denied {
            reason,
            retry_after,
        }) => {
            seen.refusal = Some("denied".into());
            seen.reason = Some(reason.name());
            seen.retry_after_ms = retry_after.map(|d| d.as_millis() as u64);
        }
        Err(GuardError::Unavailable(_)) => {
            seen.refusal = Some("unavailable".into());
            seen.unavailable = true;
        }
        Err(GuardError::Rejected(status)) => panic!("fusebox rejected the request: {status}"),
    }
    seen
}

fn check_seen(what: &str, seen: &Seen, expect: Option<&Value>) {
    let Some(expect) = expect else { return };
    let e = expect.as_object().expect("expect is an object");
    check_known(
        e,
        &[
            "ran",
            "refusal",
            "reason",
            "retry_after_ms",
            "local",
            "error",
            "cancelled",
            "unavailable",
        ],
        what,
    );
    let flag = |name: &str, got: bool| {
        if let Some(want) = e.get(name) {
            assert_eq!(Some(got), want.as_bool(), "{what}: {name} (saw {seen:?})");
        }
    };
    flag("ran", seen.ran);
    flag("local", seen.local);
    flag("error", seen.error);
    flag("cancelled", seen.cancelled);
    flag("unavailable", seen.unavailable);
    if let Some(want) = e.get("refusal") {
        assert_eq!(
            seen.refusal.as_deref(),
            want.as_str(),
            "{what}: refusal (saw {seen:?})"
        );
    }
    if let Some(want) = e.get("reason") {
        assert_eq!(
            seen.reason.as_deref(),
            want.as_str(),
            "{what}: reason (saw {seen:?})"
        );
    }
    if let Some(want) = e.get("retry_after_ms") {
        assert_eq!(
            seen.retry_after_ms,
            want.as_u64(),
            "{what}: retry_after_ms (saw {seen:?})"
        );
    }
}

/// Starts the guarded call of a `guard` step in a task.
fn start(guard: &Guard, g: &Value, expect: Option<Value>, what: &str) -> Running {
    let obj = g.as_object().expect("guard is an object");
    check_known(
        obj,
        &[
            "key",
            "call",
            "id",
            "background",
            "permits",
            "max_wait_ms",
            "lease_ms",
            "on_unavailable",
            "cost",
        ],
        what,
    );
    let key = obj["key"].as_str().expect("guard.key").to_owned();
    let call = obj["call"].as_str().expect("guard.call").to_owned();
    // The cost the call's result tells; the guard's cost option reads it.
    let cost = obj.get("cost").map(|c| {
        assert_eq!(call, "succeed", "{what}: cost needs call succeed");
        u32::try_from(c.as_u64().expect("guard.cost is a whole number")).expect("cost fits a u32")
    });
    let options = CallOptions {
        permits: obj.get("permits").and_then(Value::as_u64).map(|p| p as u32),
        max_wait: ms(g, "max_wait_ms"),
        lease: ms(g, "lease_ms"),
        on_unavailable: obj.get("on_unavailable").map(|v| match v.as_str() {
            Some("open") => FailPolicy::Open,
            Some("closed") => FailPolicy::Closed,
            other => panic!("{what}: on_unavailable {other:?}"),
        }),
        ..CallOptions::default()
    };
    let (ran_tx, ran_rx) = watch::channel(false);
    let (release_tx, release_rx) = oneshot::channel::<bool>();
    let failed_open = Arc::new(AtomicBool::new(false));
    let flag = failed_open.clone();
    let g2 = guard.clone();
    let task = tokio::spawn(async move {
        let body = move || async move {
            flag.store(admitted() == Some(Admitted::FailedOpen), Ordering::SeqCst);
            let _ = ran_tx.send(true);
            match call.as_str() {
                "succeed" => Ok(cost),
                "fail" => Err("the call failed".to_owned()),
                "hang" | "cancel" => match release_rx.await {
                    Ok(true) => Ok(None),
                    Ok(false) => Err("the call failed".to_owned()),
                    Err(_) => std::future::pending().await,
                },
                other => panic!("unknown call {other:?}"),
            }
        };
        let cost_of = |result: &Result<Option<u32>, String>| result.clone().ok().flatten();
        let result = g2.run_with_cost(&key, &options, cost_of, body).await;
        seen_of(result.map(|_| ()))
    });
    Running {
        expect,
        release: Some(release_tx),
        task,
        ran: ran_rx,
        failed_open,
    }
}

/// Waits for a running guard to end and checks what it gave.
async fn finish(running: Running, expect: Option<&Value>, cancelled: bool, what: &str) {
    let Running {
        expect: started_with,
        task,
        ran,
        failed_open,
        ..
    } = running;
    let mut seen = if cancelled {
        task.abort();
        let _ = task.await;
        Seen {
            cancelled: true,
            ..Seen::default()
        }
    } else {
        tokio::time::timeout(LIMIT, task)
            .await
            .unwrap_or_else(|_| panic!("{what}: the guarded call ends within {LIMIT:?}"))
            .expect("the guard task ends without panicking")
    };
    seen.ran = *ran.borrow();
    seen.unavailable |= failed_open.load(Ordering::SeqCst);
    check_seen(what, &seen, expect.or(started_with.as_ref()));
}

async fn wait_running(running: &Running, what: &str) {
    let mut ran = running.ran.clone();
    let done = tokio::time::timeout(LIMIT, async {
        loop {
            if *ran.borrow_and_update() || running.task.is_finished() {
                return;
            }
            if ran.changed().await.is_err() {
                return;
            }
        }
    })
    .await;
    assert!(done.is_ok(), "{what}: the call starts within {LIMIT:?}");
}

fn phase_name(p: i32) -> &'static str {
    match pb::Phase::try_from(p) {
        Ok(pb::Phase::Closed) => "CLOSED",
        Ok(pb::Phase::Open) => "OPEN",
        Ok(pb::Phase::HalfOpen) => "HALF_OPEN",
        Ok(pb::Phase::Isolated) => "ISOLATED",
        _ => "UNSPECIFIED",
    }
}

/// The fields of `k` that differ in `state`, or none.
fn key_mismatch(k: &Map<String, Value>, state: &pb::KeyState) -> Option<String> {
    let stats = state.stats.clone().unwrap_or_default();
    let mut wrong = Vec::new();
    for (name, want) in k {
        let got: Value = match name.as_str() {
            "key" => continue,
            "phase" => phase_name(state.phase).into(),
            "consecutive_failures" => state.consecutive_failures.into(),
            "live_tickets" => state.live_tickets.into(),
            "waiters" => state.waiters.into(),
            "free" => state.free.into(),
            "stats" => {
                for (s, want) in want.as_object().expect("stats is an object") {
                    let got = match s.as_str() {
                        "granted" => stats.granted,
                        "probes" => stats.probes,
                        "blocked" => stats.blocked,
                        "refused" => stats.refused,
                        "denied" => stats.denied,
                        "queued" => stats.queued,
                        "evicted" => stats.evicted,
                        "timed_out" => stats.timed_out,
                        "withdrawn" => stats.withdrawn,
                        "successes" => stats.successes,
                        "failures" => stats.failures,
                        "ignored" => stats.ignored,
                        "stale" => stats.stale,
                        "expired" => stats.expired,
                        other => panic!("expect_key: unknown stats field {other:?}"),
                    };
                    if Some(got) != want.as_u64() {
                        wrong.push(format!("stats.{s}: want {want}, got {got}"));
                    }
                }
                continue;
            }
            other => panic!("expect_key: unknown field {other:?}"),
        };
        if &got != want {
            wrong.push(format!("{name}: want {want}, got {got}"));
        }
    }
    (!wrong.is_empty()).then(|| wrong.join("; "))
}

async fn replay(path: PathBuf, transport: Transport) {
    let text = std::fs::read_to_string(&path).expect("a scenario file");
    let scenario: Value = serde_json::from_str(&text).expect("a JSON scenario");
    let name = scenario["name"].as_str().expect("name").to_owned();
    check_known(
        scenario.as_object().expect("an object"),
        &["name", "description", "config", "steps"],
        &name,
    );
    let mut server = Server::manual(scenario.get("config").and_then(Value::as_str)).await;
    // The scenarios' deadline for fusebox calls (see the README): a slow
    // answer from a debug server on a busy machine is not an outage.
    let options = GuardOptions {
        deadline: Duration::from_millis(2000),
        transport,
        ..GuardOptions::default()
    };
    let guard = Guard::connect(&format!("http://{}", server.addr), None, options).expect("a guard");
    let mut running: HashMap<String, Running> = HashMap::new();
    let steps = scenario["steps"].as_array().expect("steps");
    for (i, step) in steps.iter().enumerate() {
        let what = format!("{name} step {i}");
        let obj = step.as_object().expect("a step is an object");
        check_known(
            obj,
            &[
                "guard",
                "expect",
                "release",
                "as",
                "cancel",
                "await",
                "wait_renewed",
                "advance_ms",
                "isolate",
                "close",
                "forget_local",
                "stop_server",
                "expect_key",
            ],
            &what,
        );
        let expect = obj.get("expect").cloned();
        if let Some(g) = obj.get("guard") {
            let id = g.get("id").and_then(Value::as_str).map(str::to_owned);
            let call = g["call"].as_str().expect("guard.call");
            let background = g
                .get("background")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let r = start(&guard, g, expect.clone(), &what);
            match (id, call) {
                (Some(id), _) => {
                    if !background {
                        wait_running(&r, &what).await;
                    }
                    running.insert(id, r);
                }
                (None, "cancel") => {
                    wait_running(&r, &what).await;
                    finish(r, None, true, &what).await;
                }
                (None, "hang") => panic!("{what}: hang needs an id"),
                (None, _) => finish(r, None, false, &what).await,
            }
        } else if let Some(id) = obj.get("release").and_then(Value::as_str) {
            let mut r = running
                .remove(id)
                .unwrap_or_else(|| panic!("{what}: no guard {id}"));
            let ok = match obj.get("as").and_then(Value::as_str).unwrap_or("succeed") {
                "succeed" => true,
                "fail" => false,
                other => panic!("{what}: release as {other:?}"),
            };
            let _ = r.release.take().expect("not released yet").send(ok);
            finish(r, expect.as_ref(), false, &what).await;
        } else if let Some(id) = obj.get("cancel").and_then(Value::as_str) {
            let r = running
                .remove(id)
                .unwrap_or_else(|| panic!("{what}: no guard {id}"));
            finish(r, expect.as_ref(), true, &what).await;
        } else if let Some(id) = obj.get("await").and_then(Value::as_str) {
            let r = running
                .remove(id)
                .unwrap_or_else(|| panic!("{what}: no guard {id}"));
            finish(r, expect.as_ref(), false, &what).await;
        } else if let Some(id) = obj.get("wait_renewed").and_then(Value::as_str) {
            assert!(running.contains_key(id), "{what}: no guard {id}");
            // Renewals are counted per guard; in a scenario one call at a
            // time holds a renewable ticket. Two: the first may have been
            // sent before the previous step (see the README).
            let at = guard.stats().renewals;
            harness::eventually(&what, LIMIT, || async {
                (guard.stats().renewals >= at + 2).then_some(())
            })
            .await;
        } else if let Some(n) = obj.get("advance_ms").and_then(Value::as_u64) {
            crate::admin::advance(&server, n).await;
        } else if let Some(key) = obj.get("isolate").and_then(Value::as_str) {
            let mut admin = server.admin().await;
            let isolated =
                harness::steer(&mut admin, true, Some("scenario"), key, "scenario").await;
            isolated.expect("Isolate answers");
        } else if let Some(key) = obj.get("close").and_then(Value::as_str) {
            let mut admin = server.admin().await;
            let closed = harness::steer(&mut admin, false, Some("scenario"), key, "scenario").await;
            closed.expect("Close answers");
        } else if let Some(key) = obj.get("forget_local").and_then(Value::as_str) {
            guard.forget(key);
        } else if obj.contains_key("stop_server") {
            server.child.kill().await.expect("the server stops");
        } else if let Some(k) = obj.get("expect_key") {
            let k = k.as_object().expect("expect_key is an object").clone();
            let key = k["key"].as_str().expect("expect_key.key").to_owned();
            let deadline = tokio::time::Instant::now() + LIMIT;
            loop {
                let state = server.get(&key).await;
                let Some(wrong) = key_mismatch(&k, &state) else {
                    break;
                };
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{what}: {key} did not match within {LIMIT:?}: {wrong}"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        } else {
            panic!("{what}: unknown step {step}");
        }
    }
    if let Some(id) = running.keys().next() {
        panic!("{name}: guard {id} still running at the end");
    }
}

fn scenario_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(scenarios_dir())
        .expect("clients/scenarios exists")
        .map(|e| e.expect("a dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 8, "the shared scenarios are there");
    files
}

#[tokio::test]
async fn every_shared_scenario_passes_with_the_rust_guard() {
    for file in scenario_files() {
        eprintln!("scenario {}", file.display());
        replay(file, Transport::Unary).await;
    }
}

/// The same with the guard's calls as frames of one Decide stream.
#[tokio::test]
async fn every_shared_scenario_passes_with_the_rust_guard_over_a_decide_stream() {
    for file in scenario_files() {
        eprintln!("scenario {} (Decide stream)", file.display());
        replay(file, Transport::Stream).await;
    }
}
