//! `FB.COMPLETE ... COST n` (U1): the permits a call really used, settled
//! in a token-bucket or window limiter, against a real `redis-server`.

use crate::harness::Standalone;
use crate::{error, hex, int, view};

/// A bucket of 4 tokens, 1 more every second, and a queue of 4.
const BUCKET: &str =
    r#"{"limiter":{"kind":"token_bucket","capacity":4,"refill":1,"period":1000,"queue_limit":4}}"#;

fn free(c: &mut crate::resp::Conn, key: &str, now: u64) -> u64 {
    view(c, key, now).expect("the key holds state")["free"]
        .as_u64()
        .expect("free is a number")
}

#[test]
fn a_cost_is_settled_up_or_down_and_a_refund_serves_a_waiter() {
    let Some((_redis, mut c)) = Standalone::connected("a_cost_is_settled_up_or_down") else {
        return;
    };
    let granted = c.cmd(&["FB.ACQUIRE", "b", "0", &hex(1), BUCKET, "PERMITS", "4"]);
    assert_eq!(granted.items()[0].text(), "granted", "{granted:?}");
    let queued = c.cmd(&[
        "FB.ACQUIRE",
        "b",
        "10",
        &hex(2),
        BUCKET,
        "PERMITS",
        "2",
        "MAXWAIT",
        "500",
    ]);
    assert_eq!(queued.items()[0].text(), "queued", "{queued:?}");
    // Used 1 of the 4 taken: 3 come back, the waiter takes 2.
    let done = c.cmd(&["FB.COMPLETE", "b", "20", &hex(1), "success", "COST", "1"]);
    assert_eq!(done.items()[1], int(0), "{done:?}");
    let v = view(&mut c, "b", 20).expect("state");
    assert_eq!(
        (v["waiters"].as_u64(), v["free"].as_u64()),
        (Some(0), Some(1))
    );
    // Used 100 of the 2 taken: the bucket goes down to -4, no further.
    let done = c.cmd(&["FB.COMPLETE", "b", "30", &hex(2), "success", "cost", "100"]);
    assert_eq!(done.items()[1], int(0), "{done:?}");
    assert_eq!(free(&mut c, "b", 30), 0);
    assert_eq!(free(&mut c, "b", 4_999), 0, "four refills pay back the -4");
    assert_eq!(free(&mut c, "b", 5_000), 1);
}

#[test]
fn a_cost_without_a_rate_limiter_or_as_taken_changes_nothing() {
    let Some((_redis, mut c)) = Standalone::connected("a_cost_without_a_rate_limiter") else {
        return;
    };
    let two = r#"{"limiter":{"kind":"concurrency","permits":2}}"#;
    c.cmd(&["FB.ACQUIRE", "c", "0", &hex(1), two]);
    c.cmd(&["FB.COMPLETE", "c", "1", &hex(1), "success", "COST", "9"]);
    assert_eq!(
        free(&mut c, "c", 1),
        2,
        "concurrency permits come back whole"
    );
    c.cmd(&["FB.ACQUIRE", "b", "0", &hex(2), BUCKET, "PERMITS", "3"]);
    c.cmd(&[
        "FB.COMPLETE",
        "b",
        "1",
        &hex(2),
        "failure",
        "COST",
        "3",
        "REPLY",
        "array",
    ]);
    assert_eq!(
        free(&mut c, "b", 1),
        1,
        "a cost as taken is a plain completion"
    );
}

#[test]
fn a_bad_cost_is_refused_naming_it_and_changes_nothing() {
    let Some((_redis, mut c)) = Standalone::connected("a_bad_cost_is_refused") else {
        return;
    };
    c.cmd(&["FB.ACQUIRE", "b", "0", &hex(1), BUCKET]);
    let before = c.cmd(&["GET", "b"]);
    for bad in ["-1", "4294967296", "one", ""] {
        let reply = c.cmd(&["FB.COMPLETE", "b", "1", &hex(1), "success", "COST", bad]);
        assert!(
            matches!(&reply, crate::resp::Reply::Error(e) if e.starts_with("ERR cost: ")),
            "{bad:?}: {reply:?}"
        );
    }
    assert_eq!(
        c.cmd(&["FB.COMPLETE", "b", "1", &hex(1), "success", "COST"]),
        error("ERR cost: COST needs a value after it")
    );
    assert_eq!(c.cmd(&["GET", "b"]), before, "nothing changed");
    let done = c.cmd(&[
        "FB.COMPLETE",
        "b",
        "1",
        &hex(1),
        "success",
        "COST",
        "4294967295",
    ]);
    assert_eq!(
        done.items()[1],
        int(0),
        "the largest cost is taken, clipped: {done:?}"
    );
    assert_eq!(free(&mut c, "b", 1), 0);
}
