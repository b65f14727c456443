//! The domain commands (`FB.ACQUIRE`, `FB.COMPLETE`, `FB.RENEW`,
//! `FB.ISOLATE`, `FB.CLOSE`, `FB.GET`, `FB.POLICY`, `FB.LIST`) against a real
//! `redis-server`.

use std::time::Duration;

use crate::harness::{wait_for, Replicated, Standalone};
use crate::resp::{Conn, Reply};
use crate::{array, bulk, error, hex, int, nil, view};

/// Consecutive mode, 2 failures, a 1 s break: the worked example of SPEC
/// section 6.
const TRIP_2: &str = r#"{"breaker":{"mode":"consecutive","failures":2,"break":1000}}"#;

fn granted(id: u128, lease: i64) -> Reply {
    array(vec![
        bulk("granted"),
        nil(),
        bulk(&hex(id)),
        int(lease),
        nil(),
    ])
}

fn completed(stale: bool, phase: &str) -> Reply {
    array(vec![
        bulk("stale"),
        int(i64::from(stale)),
        bulk("phase"),
        bulk(phase),
    ])
}

/// `FB.ACQUIRE`'s reply without its last two elements (phase, now_ms), as
/// the tests of the decision alone compare it.
pub trait Acquire5 {
    /// Sends `FB.ACQUIRE ...` and returns the reply's first five elements.
    fn acq5<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Reply;
}

impl Acquire5 for Conn {
    fn acq5<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Reply {
        match self.cmd(args) {
            Reply::Array(Some(mut items)) => {
                assert_eq!(items.len(), 7, "FB.ACQUIRE replies 7 elements: {items:?}");
                items.truncate(5);
                Reply::Array(Some(items))
            }
            other => other,
        }
    }
}

fn raw(conn: &mut Conn, key: &str) -> Reply {
    conn.cmd(&["GET", key])
}

#[test]
fn a_breaker_trips_after_its_failures_blocks_with_retry_after_then_probes_and_closes() {
    let Some((_redis, mut c)) = Standalone::connected("a_breaker_trips_after_its_failures") else {
        return;
    };
    assert_eq!(view(&mut c, "dep", 0), None);
    assert_eq!(
        c.acq5(&["FB.ACQUIRE", "dep", "0", "1", TRIP_2]),
        granted(1, 30_000)
    );
    assert_eq!(
        c.cmd(&["FB.COMPLETE", "dep", "0", "1", "failure"]),
        completed(false, "closed")
    );
    let v = view(&mut c, "dep", 0).expect("the key holds state");
    assert_eq!(
        (v["phase"].as_str(), v["consecutive_failures"].as_u64()),
        (Some("closed"), Some(1))
    );
    assert_eq!(
        c.acq5(&["FB.ACQUIRE", "dep", "10", "2", TRIP_2]),
        granted(2, 30_000)
    );
    assert_eq!(
        c.cmd(&["FB.COMPLETE", "dep", "10", "2", "FAILURE"]),
        completed(false, "open")
    );
    let v = view(&mut c, "dep", 10).unwrap();
    assert_eq!(v["phase"], "open");
    assert_eq!(v["open_until"], 1010);
    assert_eq!(v["consecutive_failures"], 2);

    // Blocked, with the time left of the break; a blocked request changes
    // nothing (B1), so the next one is blocked alike.
    let blocked = |retry| {
        array(vec![
            bulk("blocked"),
            bulk("open"),
            nil(),
            nil(),
            int(retry),
        ])
    };
    assert_eq!(
        c.acq5(&["FB.ACQUIRE", "dep", "500", "3", TRIP_2]),
        blocked(510)
    );
    assert_eq!(
        c.acq5(&["FB.ACQUIRE", "dep", "1009", "3", TRIP_2]),
        blocked(1)
    );
    assert_eq!(view(&mut c, "dep", 1009).unwrap()["stats"]["blocked"], 2);

    // At the deadline, one probe; others wait for its slot (the break).
    assert_eq!(
        c.acq5(&["FB.ACQUIRE", "dep", "1010", "4", TRIP_2]),
        array(vec![
            bulk("probe"),
            nil(),
            bulk(&hex(4)),
            int(30_000),
            nil()
        ])
    );
    assert_eq!(
        c.acq5(&["FB.ACQUIRE", "dep", "1020", "5", TRIP_2]),
        array(vec![
            bulk("blocked"),
            bulk("probe_in_flight"),
            nil(),
            nil(),
            int(990)
        ])
    );
    assert_eq!(view(&mut c, "dep", 1020).unwrap()["phase"], "half_open");
    assert_eq!(
        c.cmd(&["FB.COMPLETE", "dep", "1030", "4", "success"]),
        completed(false, "closed")
    );
    assert_eq!(
        c.acq5(&["FB.ACQUIRE", "dep", "1040", "5", TRIP_2]),
        granted(5, 30_000)
    );
    let v = view(&mut c, "dep", 1040).unwrap();
    assert_eq!(v["stats"]["probes"], 1);
    assert_eq!(v["stats"]["granted"], 3);
    assert_eq!(v["live_tickets"], 1);
}

#[test]
fn a_failed_probe_opens_a_new_break() {
    let Some((_redis, mut c)) = Standalone::connected("a_failed_probe_opens_a_new_break") else {
        return;
    };
    let policy = r#"{"breaker":{"mode":"consecutive","failures":1,"break":"1s"}}"#;
    c.acq5(&["FB.ACQUIRE", "k", "0", "a", policy]);
    assert_eq!(
        c.cmd(&["FB.COMPLETE", "k", "0", "a", "failure"]),
        completed(false, "open")
    );
    assert_eq!(
        c.acq5(&["FB.ACQUIRE", "k", "1000", "b", policy]).items()[0],
        bulk("probe")
    );
    assert_eq!(
        c.cmd(&["FB.COMPLETE", "k", "1100", "b", "failure"]),
        completed(false, "open")
    );
    assert_eq!(view(&mut c, "k", 1100).unwrap()["open_until"], 2100);
}

#[test]
fn stale_unknown_and_expired_tickets_are_told_apart() {
    let Some((_redis, mut c)) =
        Standalone::connected("stale_unknown_and_expired_tickets_are_told_apart")
    else {
        return;
    };
    let not_found =
        error("ERR ticket: not found; it is unknown, already completed, or its lease ended");
    // No key at all: the ticket is unknown.
    assert_eq!(c.cmd(&["FB.COMPLETE", "k", "0", "1", "success"]), not_found);
    assert_eq!(c.cmd(&["FB.RENEW", "k", "0", "1"]), not_found);
    assert_eq!(view(&mut c, "k", 0), None, "a refused command makes no key");

    let policy = r#"{"breaker":{"mode":"consecutive","failures":1,"break":1000}}"#;
    assert_eq!(
        c.acq5(&["FB.ACQUIRE", "k", "0", "1", policy]),
        granted(1, 30_000)
    );
    assert_eq!(
        c.acq5(&["FB.ACQUIRE", "k", "0", "2", policy]),
        granted(2, 30_000)
    );
    assert_eq!(c.cmd(&["FB.COMPLETE", "k", "0", "9", "success"]), not_found);
    assert_eq!(
        c.acq5(&["FB.ACQUIRE", "k", "0", "1", policy]),
        error("ERR ticket: the id is already in use at this key; send a new random id")
    );
    // Ticket 2 was issued before the trip: its outcome is stale (B3).
    assert_eq!(
        c.cmd(&["FB.COMPLETE", "k", "5", "1", "failure"]),
        completed(false, "open")
    );
    assert_eq!(
        c.cmd(&["FB.COMPLETE", "k", "6", "2", "success"]),
        completed(true, "open")
    );
    // Completed once: unknown the second time.
    assert_eq!(c.cmd(&["FB.COMPLETE", "k", "7", "2", "success"]), not_found);
    assert_eq!(view(&mut c, "k", 7).unwrap()["stats"]["stale"], 1);

    // A lease renewed, then ended: the ticket is gone.
    assert_eq!(
        c.acq5(&["FB.ACQUIRE", "l", "0", "a", TRIP_2, "LEASE", "100"]),
        granted(0xa, 100)
    );
    assert_eq!(
        c.cmd(&["FB.RENEW", "l", "50", "a", "LEASE", "200"]),
        int(200)
    );
    assert_eq!(c.cmd(&["FB.RENEW", "l", "60", "A"]), int(30_000));
    assert_eq!(
        c.cmd(&["FB.COMPLETE", "l", "30060", "a", "ignored"]),
        not_found
    );
    let v = view(&mut c, "l", 30_060).unwrap();
    assert_eq!(
        (v["live_tickets"].as_u64(), v["stats"]["expired"].as_u64()),
        (Some(0), Some(1))
    );
}

#[test]
fn isolate_refuses_everything_until_close() {
    let Some((_redis, mut c)) = Standalone::connected("isolate_refuses_everything_until_close")
    else {
        return;
    };
    assert_eq!(
        c.cmd(&["FB.ISOLATE", "k", "0"]),
        error(
            "ERR key: holds no fusebox state, so no policy to isolate under; \
             send POLICY with the key's policy, or FB.ACQUIRE on it first"
        )
    );
    assert_eq!(
        c.cmd(&["FB.CLOSE", "k", "0"]),
        nil(),
        "an empty key is closed"
    );
    assert_eq!(c.cmd(&["EXISTS", "k"]), int(0));

    // A status check on an empty key answers from a fresh fuse, stores nothing.
    let status = c.cmd(&["FB.ACQUIRE", "k", "0", "1", TRIP_2, "PERMITS", "0"]);
    assert_eq!(
        status,
        array(vec![
            bulk("granted"),
            nil(),
            nil(),
            nil(),
            nil(),
            bulk("closed"),
            int(0)
        ])
    );
    assert_eq!(c.cmd(&["EXISTS", "k"]), int(0));

    // ISOLATE with POLICY makes the empty key under it, then isolates it.
    let isolated = c.cmd(&["FB.ISOLATE", "k", "10", "POLICY", TRIP_2]).text();
    let isolated: serde_json::Value = serde_json::from_str(&isolated).unwrap();
    assert_eq!(
        (isolated["phase"].as_str(), isolated["now_ms"].as_u64()),
        (Some("isolated"), Some(10))
    );
    assert_eq!(isolated["stats"]["granted"], 0);
    let refused = array(vec![bulk("refused"), nil(), nil(), nil(), nil()]);
    assert_eq!(c.acq5(&["FB.ACQUIRE", "k", "20", "2", TRIP_2]), refused);
    let v = view(&mut c, "k", 20).unwrap();
    assert_eq!(
        (v["phase"].as_str(), v["stats"]["refused"].as_u64()),
        (Some("isolated"), Some(1))
    );

    let closed = c.cmd(&["FB.CLOSE", "k", "30"]).text();
    let closed: serde_json::Value = serde_json::from_str(&closed).unwrap();
    assert_eq!(closed, view(&mut c, "k", 30).unwrap());
    assert_eq!(closed["phase"], "closed");
    assert_eq!(
        c.acq5(&["FB.ACQUIRE", "k", "40", "2", TRIP_2]),
        granted(2, 30_000)
    );
}

#[test]
fn permits_are_denied_or_queued_by_the_limiter() {
    let Some((_redis, mut c)) =
        Standalone::connected("permits_are_denied_or_queued_by_the_limiter")
    else {
        return;
    };
    let policy = r#"{"limiter":{"kind":"concurrency","permits":1,"queue_limit":1}}"#;
    assert_eq!(
        c.acq5(&["FB.ACQUIRE", "k", "0", "1", policy]),
        granted(1, 30_000)
    );
    assert_eq!(
        c.acq5(&["FB.ACQUIRE", "k", "1", "2", policy]),
        array(vec![
            bulk("denied"),
            bulk("no_permits"),
            nil(),
            nil(),
            nil()
        ])
    );
    assert_eq!(
        c.acq5(&["FB.ACQUIRE", "k", "2", "3", policy, "maxwait", "100"]),
        array(vec![bulk("queued"), nil(), nil(), nil(), nil()])
    );
    assert_eq!(
        c.acq5(&["FB.ACQUIRE", "k", "3", "4", policy, "MAXWAIT", "100"]),
        array(vec![
            bulk("denied"),
            bulk("queue_full"),
            nil(),
            nil(),
            nil()
        ])
    );
    assert_eq!(
        c.acq5(&["FB.ACQUIRE", "k", "4", "5", policy, "PERMITS", "2"]),
        array(vec![
            bulk("denied"),
            bulk("exceeds_limit"),
            nil(),
            nil(),
            nil()
        ])
    );
    let v = view(&mut c, "k", 4).unwrap();
    assert_eq!(
        (
            v["waiters"].as_u64(),
            v["free"].as_u64(),
            v["limit"].as_u64()
        ),
        (Some(1), Some(0), Some(1))
    );
    // The waiter's wait ends at 102; it is answered (timeout) and gone.
    let v = view(&mut c, "k", 102).unwrap();
    assert_eq!(
        (v["waiters"].as_u64(), v["stats"]["timed_out"].as_u64()),
        (Some(0), Some(1))
    );

    // A changed policy is applied to the key before the request (Y4).
    let wider = r#"{"limiter":{"kind":"concurrency","permits":2}}"#;
    assert_eq!(
        c.acq5(&["FB.ACQUIRE", "k", "200", "6", wider]),
        granted(6, 30_000)
    );
    let v = view(&mut c, "k", 200).unwrap();
    assert_eq!(v["limit"], 2);
    assert_eq!(v["policy"]["limiter"]["permits"], 2);
}

#[test]
fn a_bad_argument_is_refused_naming_it_and_changes_nothing() {
    let Some((_redis, mut c)) = Standalone::connected("a_bad_argument_is_refused_naming_it") else {
        return;
    };
    assert_eq!(
        c.acq5(&["FB.ACQUIRE", "k", "100", "1", TRIP_2]),
        granted(1, 30_000)
    );
    let before = raw(&mut c, "k");
    let Reply::Bulk(Some(bytes)) = &before else {
        panic!("{before:?}");
    };
    assert!(bytes.starts_with(b"FBX\x08"), "{before:?}");

    let long_ticket = "f".repeat(33);
    let long_caller = "c".repeat(129);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["FB.ACQUIRE", "k", "-1", "2", TRIP_2], "ERR now_ms: "),
        (vec!["FB.ACQUIRE", "k", "1e3", "2", TRIP_2], "ERR now_ms: "),
        (
            vec!["FB.ACQUIRE", "k", "9007199254740992", "2", TRIP_2],
            "ERR now_ms: ",
        ),
        (
            vec!["FB.ACQUIRE", "k", "9007167718740993", "2", TRIP_2],
            "ERR now_ms: ",
        ),
        (vec!["FB.ACQUIRE", "k", "99", "2", TRIP_2], "ERR now ("),
        (
            vec!["FB.ACQUIRE", "k", "200", "xyz", TRIP_2],
            "ERR ticket: ",
        ),
        (
            vec!["FB.ACQUIRE", "k", "200", &long_ticket, TRIP_2],
            "ERR ticket: ",
        ),
        (vec!["FB.ACQUIRE", "k", "200", "2", "{"], "ERR policy: "),
        (
            vec!["FB.ACQUIRE", "k", "200", "2", r#"{"brakes":{}}"#],
            "ERR policy: ",
        ),
        (
            vec![
                "FB.ACQUIRE",
                "k",
                "200",
                "2",
                r#"{"breaker":{"mode":"consecutive","failures":0,"break":1000}}"#,
            ],
            "ERR policy.breaker.failures: ",
        ),
        (
            vec!["FB.ACQUIRE", "k", "200", "2", TRIP_2, "PERMITS"],
            "ERR permits: ",
        ),
        (
            vec![
                "FB.ACQUIRE",
                "k",
                "200",
                "2",
                TRIP_2,
                "CALLER",
                &long_caller,
            ],
            "ERR caller: ",
        ),
        (
            vec!["FB.ACQUIRE", "k", "200", "2", TRIP_2, "CALLER", "pod\n7"],
            "ERR caller: ",
        ),
        (
            vec!["FB.ACQUIRE", "k", "200", "2", TRIP_2, "PERMITS", "-1"],
            "ERR permits: ",
        ),
        (
            vec![
                "FB.ACQUIRE",
                "k",
                "200",
                "2",
                TRIP_2,
                "PERMITS",
                "1",
                "PERMITS",
                "1",
            ],
            "ERR permits: ",
        ),
        (
            vec!["FB.ACQUIRE", "k", "200", "2", TRIP_2, "LEASE", "0"],
            "ERR lease: ",
        ),
        (
            vec![
                "FB.ACQUIRE",
                "k",
                "200",
                "2",
                TRIP_2,
                "LEASE",
                "31536000001",
            ],
            "ERR lease: ",
        ),
        (
            vec!["FB.ACQUIRE", "k", "200", "2", TRIP_2, "MAXWAIT", "soon"],
            "ERR maxwait: ",
        ),
        (
            vec!["FB.ACQUIRE", "k", "200", "2", TRIP_2, "WAIT", "1"],
            "ERR option: ",
        ),
        (vec!["FB.ACQUIRE", "", "200", "2", TRIP_2], "ERR key: "),
        (
            vec!["FB.COMPLETE", "k", "200", "1", "maybe"],
            "ERR outcome: ",
        ),
        (vec!["FB.COMPLETE", "k", "200", "1", ""], "ERR outcome: "),
        (
            vec!["FB.RENEW", "k", "200", "1", "LEASE", "0"],
            "ERR lease: ",
        ),
        (
            vec!["FB.RENEW", "k", "200", "1", "TTL", "5"],
            "ERR option: ",
        ),
        (vec!["FB.ISOLATE", "k", "now"], "ERR now_ms: "),
        (vec!["FB.CLOSE", "k", "99"], "ERR now ("),
        (vec!["FB.GET", "k", "x"], "ERR now_ms: "),
        (
            vec!["FB.ACQUIRE", "k", "200", "2"],
            "ERR wrong number of arguments",
        ),
        (
            vec!["FB.COMPLETE", "k", "200", "1"],
            "ERR wrong number of arguments",
        ),
        (vec!["FB.ISOLATE", "k"], "ERR wrong number of arguments"),
    ];
    for (args, prefix) in &cases {
        let reply = c.cmd(args);
        let Reply::Error(e) = &reply else {
            panic!("{args:?} must be refused, got {reply:?}");
        };
        assert!(
            e.starts_with(prefix),
            "{args:?}: {e:?} should start with {prefix:?}"
        );
        assert!(
            e.len() > prefix.len() + 10,
            "{args:?}: {e:?} should say what to do"
        );
        assert_eq!(raw(&mut c, "k"), before, "{args:?} changed the key");
    }

    // A string that is not fusebox state is refused, not overwritten.
    assert!(c.cmd(&["SET", "other", "hello"]).is_ok());
    let Reply::Error(e) = c.acq5(&["FB.ACQUIRE", "other", "0", "1", TRIP_2]) else {
        panic!("a foreign string must be refused");
    };
    assert!(e.starts_with("ERR state: "), "{e}");
    assert_eq!(raw(&mut c, "other"), bulk("hello"));
    // Damaged state is refused, naming the state, and left for the operator.
    assert!(c.cmd(&["SET", "bad", "FBX\u{1}{\"version\":1}"]).is_ok());
    let Reply::Error(e) = c.cmd(&["FB.GET", "bad", "0"]) else {
        panic!("damaged state must be refused");
    };
    assert!(
        e.starts_with("ERR state: ") && e.contains("delete the key"),
        "{e}"
    );
    assert_eq!(c.cmd(&["HSET", "h", "a", "b"]), int(1));
    assert_eq!(
        c.acq5(&["FB.ACQUIRE", "h", "0", "1", TRIP_2]),
        error("WRONGTYPE Operation against a key holding the wrong kind of value")
    );
}

#[test]
fn the_same_commands_write_the_same_bytes() {
    let Some((_redis, mut c)) = Standalone::connected("the_same_commands_write_the_same_bytes")
    else {
        return;
    };
    let policy = r#"{"breaker":{"mode":"ratio","failure_ratio":0.5,"minimum_throughput":2,
        "sampling_window":"10s","break":"1s","multiplier":1.5},
        "limiter":{"kind":"token_bucket","capacity":3,"refill":1,"period":"100ms","queue_limit":2}}"#;
    for key in ["a", "b"] {
        for (i, now) in [0u64, 5, 10, 20].into_iter().enumerate() {
            c.acq5(&[
                "FB.ACQUIRE",
                key,
                &now.to_string(),
                &format!("{}", i + 1),
                policy,
            ]);
        }
        c.cmd(&["FB.COMPLETE", key, "30", "1", "failure"]);
        c.cmd(&["FB.COMPLETE", key, "31", "2", "success"]);
        c.acq5(&["FB.ACQUIRE", key, "40", "9", policy, "MAXWAIT", "500"]);
    }
    let (a, b) = (raw(&mut c, "a"), raw(&mut c, "b"));
    assert_eq!(a, b);
    assert_eq!(view(&mut c, "a", 40), view(&mut c, "b", 40));
}

#[test]
fn state_survives_an_rdb_round_trip() {
    let Some(redis) = Standalone::start_with(
        "state_survives_an_rdb_round_trip",
        &["--enable-debug-command", "yes"],
    ) else {
        return;
    };
    let mut c = redis.server.conn();
    let policy = r#"{"breaker":{"mode":"consecutive","failures":1,"break":1000},
        "limiter":{"kind":"concurrency","permits":2}}"#;
    assert_eq!(
        c.acq5(&["FB.ACQUIRE", "k", "0", "1", policy]),
        granted(1, 30_000)
    );
    assert_eq!(
        c.acq5(&["FB.ACQUIRE", "k", "0", "2", policy]),
        granted(2, 30_000)
    );
    c.cmd(&["FB.COMPLETE", "k", "5", "1", "failure"]);
    let before = (raw(&mut c, "k"), view(&mut c, "k", 10));
    assert!(c.cmd(&["DEBUG", "RELOAD"]).is_ok());
    assert_eq!((raw(&mut c, "k"), view(&mut c, "k", 10)), before);
    // The key goes on from where it was: open, ticket 2 live and stale.
    assert_eq!(
        c.cmd(&["FB.COMPLETE", "k", "20", "2", "success"]),
        completed(true, "open")
    );
    assert_eq!(
        c.acq5(&["FB.ACQUIRE", "k", "1005", "3", policy]).items()[0],
        bulk("probe")
    );
}

/// A few steps at `key` on `c`: grants, a trip, a blocked request, a renewal.
fn some_steps(c: &mut Conn, key: &str) {
    let policy = r#"{"breaker":{"mode":"consecutive","failures":1,"break":"2s"},
        "limiter":{"kind":"sliding_window","permits":5,"window":"1s","segments":4}}"#;
    assert_eq!(
        c.acq5(&["FB.ACQUIRE", key, "0", "1", policy]),
        granted(1, 30_000)
    );
    assert_eq!(
        c.acq5(&["FB.ACQUIRE", key, "3", "2", policy, "PERMITS", "2"]),
        granted(2, 30_000)
    );
    assert_eq!(
        c.cmd(&["FB.RENEW", key, "4", "2", "LEASE", "5000"]),
        int(5000)
    );
    assert_eq!(
        c.cmd(&["FB.COMPLETE", key, "10", "1", "failure"]),
        completed(false, "open")
    );
    assert_eq!(
        c.acq5(&["FB.ACQUIRE", key, "11", "3", policy]).items()[0],
        bulk("blocked")
    );
}

#[test]
fn a_replica_holds_the_same_bytes_as_its_primary() {
    let test = "a_replica_holds_the_same_bytes_as_its_primary";
    let Some((redis, mut p)) = Replicated::connected(test, false) else {
        return;
    };
    some_steps(&mut p, "k");
    assert_eq!(p.cmd(&["WAIT", "1", "5000"]), int(1));
    let mut r = redis.replica.conn();
    assert_eq!(raw(&mut r, "k"), raw(&mut p, "k"));
    assert_eq!(view(&mut r, "k", 20), view(&mut p, "k", 20));
    let Reply::Error(e) = r.cmd(&["FB.CLOSE", "k", "30"]) else {
        panic!("a replica must refuse a write");
    };
    assert!(e.starts_with("READONLY"), "{e}");
}

#[test]
fn an_aof_replay_writes_the_same_bytes() {
    let Some(redis) = Standalone::start_with(
        "an_aof_replay_writes_the_same_bytes",
        &["--appendonly", "yes", "--enable-debug-command", "yes"],
    ) else {
        return;
    };
    let mut c = redis.server.conn();
    some_steps(&mut c, "k");
    let before = raw(&mut c, "k");
    assert!(c.cmd(&["DEBUG", "LOADAOF"]).is_ok());
    assert_eq!(raw(&mut c, "k"), before);
    assert_eq!(
        c.acq5(&["FB.ACQUIRE", "k", "2010", "4", TRIP_2]).items()[0],
        bulk("probe")
    );
}

#[test]
fn the_latest_time_taken_still_reads_back() {
    let Some((_redis, mut c)) = Standalone::connected("the_latest_time_taken_still_reads_back")
    else {
        return;
    };
    let last = fusebox_redis::clock::MAX_NOW;
    assert_eq!(last, 9_007_167_718_740_992);
    let now = last.to_string();
    let longest = r#"{"breaker":{"mode":"consecutive","failures":1,"break":"365d"},
        "limiter":{"kind":"concurrency","permits":2,"queue_limit":2},
        "lease":{"default":"365d","max":"365d"}}"#;
    let year = 31_536_000_000;
    assert_eq!(
        c.acq5(&["FB.ACQUIRE", "k", &now, "1", longest]),
        granted(1, year)
    );
    assert_eq!(
        c.acq5(&[
            "FB.ACQUIRE",
            "k",
            &now,
            "2",
            longest,
            "PERMITS",
            "2",
            "MAXWAIT",
            "31536000000"
        ]),
        array(vec![bulk("queued"), nil(), nil(), nil(), nil()])
    );
    assert_eq!(c.cmd(&["FB.RENEW", "k", &now, "1"]), int(year));
    assert_eq!(
        c.cmd(&["FB.COMPLETE", "k", &now, "1", "failure"]),
        completed(false, "open")
    );
    let v = view(&mut c, "k", last).expect("the state reads back");
    assert_eq!(v["open_until"].as_u64(), Some(last + year as u64));
}

/// K2: a key at rest expires after the idle time (Redis forgets it); a key
/// with something to remember (a live ticket, a failure counted) does not.
#[test]
fn a_key_at_rest_expires_and_a_key_with_state_does_not() {
    let Some((_redis, mut c)) = Standalone::connected("a_key_at_rest_expires") else {
        return;
    };
    let ttl = |c: &mut Conn| match c.cmd(&["PTTL", "idle"]) {
        Reply::Int(n) => n,
        other => panic!("PTTL answers a number, not {other:?}"),
    };
    c.acq5(&["FB.ACQUIRE", "idle", "0", "1", TRIP_2]);
    assert_eq!(ttl(&mut c), -1, "a live ticket keeps the key");
    c.cmd(&["FB.COMPLETE", "idle", "1", "1", "failure"]);
    assert_eq!(ttl(&mut c), -1, "a failure counted keeps the key");
    c.acq5(&["FB.ACQUIRE", "idle", "2", "2", TRIP_2]);
    c.cmd(&["FB.COMPLETE", "idle", "3", "2", "success"]);
    let left = ttl(&mut c);
    assert!(
        left > 0 && left <= fusebox_redis::keyed::IDLE_AFTER as i64,
        "at rest, the key expires within the idle time: PTTL {left}"
    );
    c.acq5(&["FB.ACQUIRE", "idle", "4", "3", TRIP_2]);
    // Touched again and holding a ticket: the settler clears the expiry
    // (minutes away) within a tick, off the request's path.
    wait_for("the expiry to be cleared", Duration::from_secs(5), || {
        (ttl(&mut c) == -1).then_some(())
    });
}

/// A listed key and its view.
type Listed = Vec<(String, serde_json::Value)>;

/// One `FB.LIST` step: the next cursor, the keys with their views, and
/// the `AFTER` key when one `SCAN` bucket held more keys than the call
/// may answer (`[cursor, entries, last]`, which depends on Redis's hash
/// seed).
fn list_step_after(conn: &mut Conn, args: &[&str]) -> (String, Listed, Option<String>) {
    let reply = conn.cmd(args);
    let items = reply.items();
    assert!(
        items.len() == 2 || items.len() == 3,
        "FB.LIST replies [cursor, entries] or [cursor, entries, last]: {reply:?}"
    );
    let entries = items[1].items();
    assert_eq!(entries.len() % 2, 0, "key, view pairs: {reply:?}");
    let pairs: Listed = entries
        .chunks(2)
        .map(|kv| {
            let json = serde_json::from_str(&kv[1].text()).expect("a view as JSON");
            (kv[0].text(), json)
        })
        .collect();
    let after = items.get(2).map(Reply::text);
    if let Some(last) = &after {
        assert_eq!(
            pairs.last().map(|(k, _)| k),
            Some(last),
            "the last key answered: {reply:?}"
        );
    }
    (items[0].text(), pairs, after)
}

/// [`list_step_after`] for a call that cannot stop inside a bucket.
fn list_step(conn: &mut Conn, args: &[&str]) -> (String, Listed) {
    let (next, pairs, after) = list_step_after(conn, args);
    assert_eq!(after, None, "no bucket holds more than the call answers");
    (next, pairs)
}

#[test]
fn fb_list_pages_through_the_fusebox_keys_matching_a_pattern() {
    let Some((_redis, mut c)) =
        Standalone::connected("fb_list_pages_through_the_fusebox_keys_matching_a_pattern")
    else {
        return;
    };
    let keys: Vec<String> = (0..7).map(|i| format!("svc:{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        let ticket = format!("{:x}", i + 1);
        assert_eq!(
            c.acq5(&["FB.ACQUIRE", key, "1000", &ticket, TRIP_2])
                .items()[0],
            bulk("granted")
        );
    }
    // Not listed: another prefix, a plain string, a hash, a string that
    // looks like fusebox state from a newer module.
    assert_eq!(
        c.acq5(&["FB.ACQUIRE", "other:0", "1000", "1", TRIP_2])
            .items()[0],
        bulk("granted")
    );
    assert!(c.cmd(&["SET", "svc:plain", "hello"]).is_ok());
    assert_eq!(c.cmd(&["HSET", "svc:hash", "f", "v"]), int(1));
    assert!(c.cmd(&["SET", "svc:newer", "FBX\x08{}"]).is_ok());
    let before: Vec<Reply> = keys.iter().map(|k| raw(&mut c, k)).collect();

    let mut cursor = "0".to_owned();
    let mut steps = 0;
    let mut listed = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut args = vec!["FB.LIST", &cursor, "1500", "MATCH", "svc:*", "COUNT", "2"];
        if let Some(key) = &after {
            args.extend(["AFTER", key.as_str()]);
        }
        let (next, pairs, last) = list_step_after(&mut c, &args);
        assert!(pairs.len() <= 2, "never more than COUNT: {pairs:?}");
        steps += 1;
        listed.extend(pairs);
        after = last;
        cursor = next;
        // A step that stopped inside a bucket answers that bucket's
        // cursor, which is 0 for the first.
        if cursor == "0" && after.is_none() {
            break;
        }
        assert!(steps < 100, "the pass must end");
    }
    assert!(steps > 1, "COUNT 2 over 10 keys takes several steps");
    listed.sort_by(|a, b| a.0.cmp(&b.0));
    let names: Vec<&str> = listed.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, keys.iter().map(String::as_str).collect::<Vec<_>>());
    for (key, json) in &listed {
        assert_eq!(Some(json), view(&mut c, key, 1500).as_ref(), "{key}");
        assert_eq!(
            (json["now_ms"].as_u64(), json["live_tickets"].as_u64()),
            (Some(1500), Some(1))
        );
    }
    // Read on a copy: nothing written.
    let after: Vec<Reply> = keys.iter().map(|k| raw(&mut c, k)).collect();
    assert_eq!(after, before);

    // No MATCH: every fusebox key; a time before a key's last is raised to it.
    let (next, all) = list_step(&mut c, &["FB.LIST", "0", "10", "COUNT", "10000"]);
    assert_eq!(next, "0");
    assert_eq!(all.len(), 8, "{all:?}");
    assert!(all.iter().all(|(_, v)| v["now_ms"] == 1000));
    let (_, star) = list_step(&mut c, &["FB.LIST", "0", "*", "MATCH", "svc:1"]);
    assert_eq!(star.len(), 1);
    assert!(star[0].1["now_ms"].as_u64().unwrap() > 1_000_000_000_000);

    assert_eq!(
        c.cmd(&["FB.LIST", "0"]),
        error("ERR wrong number of arguments for 'fb.list' command")
    );
    for (args, field) in [
        (&["FB.LIST", "x", "10"][..], "ERR cursor: "),
        (&["FB.LIST", "0", "-1"], "ERR now_ms: "),
        (&["FB.LIST", "0", "10", "COUNT", "0"], "ERR count: "),
        (&["FB.LIST", "0", "10", "COUNT", "10001"], "ERR count: "),
        (&["FB.LIST", "0", "10", "COUNT"], "ERR count: "),
        (&["FB.LIST", "0", "10", "TYPE", "hash"], "ERR option: "),
    ] {
        let Reply::Error(e) = c.cmd(args) else {
            panic!("{args:?} must be refused");
        };
        assert!(e.starts_with(field), "{args:?}: {e}");
    }
}

#[test]
fn fb_policy_gives_a_key_a_new_policy_and_leaves_an_empty_key_empty() {
    let test = "fb_policy_gives_a_key_a_new_policy_and_leaves_an_empty_key_empty";
    let Some((redis, mut p)) = Replicated::connected(test, false) else {
        return;
    };
    const TRIP_5: &str = r#"{"breaker":{"mode":"consecutive","failures":5,"break":2000}}"#;
    assert_eq!(p.cmd(&["FB.POLICY", "empty", "10", TRIP_5]), nil());
    assert_eq!(p.cmd(&["EXISTS", "empty"]), int(0));
    let Reply::Error(e) = p.cmd(&["FB.POLICY", "empty", "10", r#"{"breaker":{"mode":"x"}}"#])
    else {
        panic!("a bad policy must be refused");
    };
    assert!(e.starts_with("ERR policy"), "{e}");
    assert_eq!(
        p.cmd(&["FB.POLICY", "empty", "10"]),
        error("ERR wrong number of arguments for 'fb.policy' command")
    );

    // One failure under TRIP_2; the new policy needs 5, so a second
    // failure leaves the breaker closed.
    assert_eq!(
        p.acq5(&["FB.ACQUIRE", "k", "1000", "1", TRIP_2]),
        granted(1, 30000)
    );
    assert_eq!(
        p.cmd(&["FB.COMPLETE", "k", "1001", "1", "failure"]),
        completed(false, "closed")
    );
    let before = view(&mut p, "k", 1002).unwrap();
    let reply = p.cmd(&["FB.POLICY", "k", "1100", TRIP_5]).text();
    let changed: serde_json::Value = serde_json::from_str(&reply).unwrap();
    assert_eq!(changed["now_ms"], 1100);
    assert_eq!(changed["policy"]["breaker"]["failures"], 5);
    assert_ne!(changed["policy"], before["policy"]);
    assert_eq!(changed["consecutive_failures"], 1);
    assert_eq!(view(&mut p, "k", 1100).as_ref(), Some(&changed));
    assert_eq!(
        p.acq5(&["FB.ACQUIRE", "k", "1200", "2", TRIP_5]),
        granted(2, 30000)
    );
    assert_eq!(
        p.cmd(&["FB.COMPLETE", "k", "1201", "2", "failure"]),
        completed(false, "closed")
    );
    // The same policy again: settled and stored, nothing else changes.
    let again: serde_json::Value =
        serde_json::from_str(&p.cmd(&["FB.POLICY", "k", "1300", TRIP_5]).text()).unwrap();
    assert_eq!(
        (
            again["policy"].clone(),
            again["consecutive_failures"].clone()
        ),
        (changed["policy"].clone(), 2.into())
    );
    assert_eq!(
        p.cmd(&["FB.POLICY", "k", "1299", TRIP_2]),
        error("ERR now (1299 ms) is earlier than the last time seen (1300 ms)")
    );

    // `*` is replicated as the number used: the replica holds the same bytes.
    assert_eq!(
        p.acq5(&["FB.ACQUIRE", "w", "*", "1", TRIP_2]).items()[0],
        bulk("granted")
    );
    assert!(p
        .cmd(&["FB.POLICY", "w", "*", TRIP_5])
        .text()
        .contains("\"failures\":5"));
    assert_eq!(p.cmd(&["WAIT", "1", "5000"]), int(1));
    let mut r = redis.replica.conn();
    for key in ["k", "w", "empty"] {
        assert_eq!(raw(&mut r, key), raw(&mut p, key), "{key}");
    }
}

/// An array reply written as `REPLY packed` writes it: the fields in
/// order (a completion's values, without their names), one space between
/// them, `-` for nil.
fn packed_of(command: &str, reply: &Reply) -> String {
    let items = reply.items();
    let fields: Vec<&Reply> = if command == "FB.COMPLETE" {
        items.iter().skip(1).step_by(2).collect()
    } else {
        items.iter().collect()
    };
    fields
        .into_iter()
        .map(|item| match item {
            Reply::Bulk(Some(b)) => String::from_utf8(b.clone()).expect("UTF-8"),
            Reply::Int(n) => n.to_string(),
            Reply::Bulk(None) => "-".to_owned(),
            other => panic!("no packed form for {other:?}"),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `REPLY packed` answers the array's fields in one string, for every kind
/// of decision (granted, blocked, denied, queued, a probe) and completion
/// (stale or not), and `REPLY` with another value is refused naming it.
#[test]
fn a_packed_reply_carries_the_arrays_fields() {
    let Some((_redis, mut c)) = Standalone::connected("a_packed_reply_carries_the_arrays_fields")
    else {
        return;
    };
    let policy = r#"{"breaker":{"mode":"consecutive","failures":1,"break":1000},
        "limiter":{"kind":"concurrency","permits":1,"queue_limit":2}}"#;
    // The same steps on two keys, one answered in arrays, one packed.
    let steps: Vec<Vec<String>> = vec![
        vec!["FB.ACQUIRE", "{}", "10", &hex(1), policy],
        vec!["FB.ACQUIRE", "{}", "11", &hex(2), policy],
        vec!["FB.ACQUIRE", "{}", "12", &hex(3), policy, "MAXWAIT", "500"],
        vec!["FB.COMPLETE", "{}", "13", &hex(1), "success"],
        vec!["FB.COMPLETE", "{}", "14", &hex(3), "failure"],
        vec!["FB.ACQUIRE", "{}", "15", &hex(4), policy],
        vec!["FB.ACQUIRE", "{}", "1100", &hex(5), policy],
        vec!["FB.COMPLETE", "{}", "1101", &hex(5), "success"],
    ]
    .into_iter()
    .map(|s| s.into_iter().map(str::to_owned).collect())
    .collect();
    let mut seen = Vec::new();
    for step in &steps {
        let on = |key: &str, packed: bool| {
            let mut args: Vec<String> = step.iter().map(|a| a.replace("{}", key)).collect();
            if packed {
                args.extend(["REPLY".to_owned(), "packed".to_owned()]);
            }
            args
        };
        let array = c.cmd(&on("k/array", false));
        let packed = c.cmd(&on("k/packed", true));
        let Reply::Bulk(Some(packed)) = packed else {
            panic!("{step:?}: a packed reply is one string, not {packed:?}");
        };
        let packed = String::from_utf8(packed).expect("UTF-8");
        assert_eq!(packed, packed_of(&step[0], &array), "{step:?}");
        seen.push(packed.split(' ').next().unwrap_or_default().to_owned());
    }
    assert_eq!(
        seen,
        ["granted", "denied", "queued", "0", "0", "blocked", "probe", "0"],
        "every kind of answer was compared"
    );
    let Reply::Error(e) = c.cmd(&[
        "FB.COMPLETE",
        "k/packed",
        "1102",
        &hex(5),
        "success",
        "REPLY",
        "json",
    ]) else {
        panic!("REPLY json must be refused");
    };
    assert!(e.starts_with("ERR reply: must be array or packed"), "{e}");
}
