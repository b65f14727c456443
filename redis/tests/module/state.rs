//! The value layout in a real Redis: values of the first encoding read and
//! rewritten, steps on a key with many tickets replicated as the few bytes
//! they wrote, the replication-only command refused to clients, the fence,
//! the census, and the bounded work of a listing call.

use std::time::Duration;

use fusebox_domain::{Ask, Fuse, Outcome, PolicySpec, TicketId};

use crate::harness::{info_field, wait_for, Replicated, Standalone};
use crate::hex;
use crate::resp::{Conn, Reply};

const POLICY: &str = r#"{"breaker":{"mode":"consecutive","failures":2,"break":"10s"},
    "limiter":{"kind":"concurrency","permits":5000}}"#;

fn bytes(reply: Reply) -> Vec<u8> {
    match reply {
        Reply::Bulk(Some(b)) => b,
        other => panic!("a value, not {other:?}"),
    }
}

/// `FB.GET` of a key that must be there.
fn view(c: &mut Conn, key: &str, now: u64) -> serde_json::Value {
    crate::view(c, key, now).unwrap_or_else(|| panic!("FB.GET {key}: nil"))
}

fn offset(c: &mut Conn) -> u64 {
    info_field(&c.cmd(&["INFO", "replication"]), "master_repl_offset")
        .and_then(|v| v.parse().ok())
        .expect("master_repl_offset")
}

/// A value the first version of the module wrote (`FBX\x01` and the
/// state as JSON) is read as it was, and written back in the current
/// encoding at its next step, its tickets and counts kept.
#[test]
fn a_value_of_the_first_encoding_is_read_and_written_back_in_the_current_one() {
    let Some((_redis, mut c)) = Standalone::connected("a_value_of_the_first_encoding") else {
        return;
    };
    let spec: PolicySpec = serde_json::from_str(POLICY).unwrap();
    let mut fuse = Fuse::new(spec.validate().unwrap(), 100);
    for id in 1..=3u128 {
        fuse.acquire(&Ask::default(), TicketId(id), 100).unwrap();
    }
    fuse.complete(TicketId(1), Outcome::Failure, 110).unwrap();
    let old = fusebox_redis::state::encode_v1(&fuse);
    assert!(old.starts_with(b"FBX\x01{"));
    assert!(c.cmd(&[&b"SET"[..], b"old", &old]).is_ok());

    let before = view(&mut c, "old", 120);
    assert_eq!(before["live_tickets"], 2);
    assert_eq!(before["consecutive_failures"], 1);
    assert_eq!(before["stats"]["granted"], 3);
    assert_eq!(bytes(c.cmd(&["GET", "old"])), old, "a read writes nothing");

    let done = c.cmd(&["FB.COMPLETE", "old", "130", &hex(2), "success"]);
    assert_eq!(done.items()[1], Reply::Int(0), "{done:?}");
    let now = bytes(c.cmd(&["GET", "old"]));
    assert!(now.starts_with(b"FBX\x08"), "written in version 8");
    let after = view(&mut c, "old", 130);
    assert_eq!(after["live_tickets"], 1);
    assert_eq!(after["consecutive_failures"], 0);
    assert_eq!(after["stats"]["granted"], 3);
    assert_eq!(after["stats"]["successes"], 1);
    assert_eq!(after["stats"]["failures"], 1);
    let last = c.cmd(&["FB.COMPLETE", "old", "131", &hex(3), "failure"]);
    assert_eq!(last.items()[3], Reply::Bulk(Some(b"closed".to_vec())));
}

/// A value of encoding 2 (written by the module before its heap held
/// leases; five live tickets, one failure counted) is read as it was, and
/// written back in encoding 4 at its next step, every ticket and lease
/// kept.
#[test]
fn a_value_of_the_second_encoding_is_read_and_written_back_in_the_current_one() {
    let Some((_redis, mut c)) = Standalone::connected("a_value_of_the_second_encoding") else {
        return;
    };
    let hex_value = include_str!("fixtures/v2-five-tickets.hex").trim();
    let old: Vec<u8> = (0..hex_value.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex_value[i..i + 2], 16).expect("hex"))
        .collect();
    assert!(old.starts_with(b"FBX\x02"));
    assert!(c.cmd(&[&b"SET"[..], b"old", &old]).is_ok());

    let before = view(&mut c, "old", 130);
    assert_eq!(before["live_tickets"], 5);
    assert_eq!(before["consecutive_failures"], 1);
    assert_eq!(before["next_deadline"], 5120, "ticket 6's lease ends first");
    assert_eq!(bytes(c.cmd(&["GET", "old"])), old, "a read writes nothing");

    let done = c.cmd(&["FB.COMPLETE", "old", "140", &hex(6), "success"]);
    assert_eq!(done.items()[1], Reply::Int(0), "{done:?}");
    let now = bytes(c.cmd(&["GET", "old"]));
    assert!(now.starts_with(b"FBX\x08"), "written in version 8");
    let after = view(&mut c, "old", 140);
    assert_eq!(after["live_tickets"], 4);
    assert_eq!(after["next_deadline"], 60100, "the other four end at 60100");
    assert_eq!(after["stats"]["successes"], 1);
    for id in 2..=5u128 {
        let done = c.cmd(&["FB.COMPLETE", "old", "150", &hex(id), "success"]);
        assert_eq!(done.items()[1], Reply::Int(0), "ticket {id}: {done:?}");
    }
    assert_eq!(view(&mut c, "old", 150)["live_tickets"], 0);
    let unknown = c.cmd(&["FB.COMPLETE", "old", "150", &hex(1), "success"]);
    assert!(
        matches!(&unknown, Reply::Error(e) if e.contains("ticket: not found")),
        "ticket 1 was completed before the value was written: {unknown:?}"
    );
}

/// A value of encoding 3 (written by the module before Complete's cost, U1:
/// a sliding window of 4 permits in 4 segments of 250 ms, 2 permits taken
/// at 0 and 1 at 300) is read as it was: its segment counts (4 bytes
/// each then) count, and its tickets settle no cost; the next step writes
/// encoding 4, and a ticket granted after that settles its cost.
#[test]
fn a_value_of_the_third_encoding_is_read_and_its_tickets_settle_no_cost() {
    let Some((_redis, mut c)) = Standalone::connected("a_value_of_the_third_encoding") else {
        return;
    };
    let hex_value = include_str!("fixtures/v3-sliding-two-tickets.hex").trim();
    let old: Vec<u8> = (0..hex_value.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex_value[i..i + 2], 16).expect("hex"))
        .collect();
    assert!(old.starts_with(b"FBX\x03"));
    assert!(c.cmd(&[&b"SET"[..], b"old", &old]).is_ok());
    let free = |c: &mut Conn, now: u64| view(c, "old", now)["free"].as_u64();
    assert_eq!(free(&mut c, 400), Some(1));
    assert_eq!(view(&mut c, "old", 400)["live_tickets"], 2);

    let done = c.cmd(&["FB.COMPLETE", "old", "400", &hex(1), "success", "COST", "0"]);
    assert_eq!(done.items()[1], Reply::Int(0), "{done:?}");
    assert!(bytes(c.cmd(&["GET", "old"])).starts_with(b"FBX\x08"));
    assert_eq!(free(&mut c, 400), Some(1), "an old ticket settles no cost");
    assert_eq!(
        free(&mut c, 1000),
        Some(3),
        "the first segment left the window"
    );

    let granted = c.cmd(&[
        "FB.ACQUIRE",
        "old",
        "1000",
        &hex(3),
        r#"{"limiter":{"kind":"sliding_window","permits":4,"window":1000,"segments":4}}"#,
    ]);
    assert_eq!(granted.items()[0].text(), "granted", "{granted:?}");
    assert_eq!(free(&mut c, 1000), Some(2));
    let done = c.cmd(&[
        "FB.COMPLETE",
        "old",
        "1000",
        &hex(3),
        "success",
        "COST",
        "0",
    ]);
    assert_eq!(done.items()[1], Reply::Int(0), "{done:?}");
    assert_eq!(
        free(&mut c, 1000),
        Some(3),
        "a new ticket gives its permit back"
    );
}

/// With a thousand live tickets on a key, a step writes (and replicates)
/// a few slots of its table and its header, not the whole value, and the
/// replica holds the same bytes.
#[test]
fn a_step_on_a_key_with_a_thousand_tickets_replicates_only_what_it_wrote() {
    let Some((redis, mut p)) =
        Replicated::connected("a_step_on_a_key_with_a_thousand_tickets", false)
    else {
        return;
    };
    for id in 1..=1000u128 {
        let reply = p.cmd(&["FB.ACQUIRE", "many", "5", &hex(id), POLICY]);
        assert_eq!(reply.items()[0], Reply::Bulk(Some(b"granted".to_vec())));
    }
    let size = bytes(p.cmd(&["GET", "many"])).len();
    assert!(size > 50_000, "a thousand tickets take room: {size} bytes");
    let before = offset(&mut p);
    let id = hex(5000);
    let got = p.cmd(&["FB.ACQUIRE", "many", "6", &id, POLICY]);
    assert_eq!(got.items()[0], Reply::Bulk(Some(b"granted".to_vec())));
    p.cmd(&["FB.COMPLETE", "many", "6", &id, "success"]);
    p.cmd(&["FB.COMPLETE", "many", "6", &hex(17), "ignored"]);
    let sent = offset(&mut p) - before;
    assert!(
        sent < 3_000,
        "three steps replicated {sent} bytes of a {size}-byte value"
    );
    assert_eq!(p.cmd(&["WAIT", "1", "5000"]), Reply::Int(1));
    let mut r = redis.replica.conn();
    assert_eq!(r.cmd(&["GET", "many"]), p.cmd(&["GET", "many"]));
    assert_eq!(view(&mut r, "many", 7)["live_tickets"], 999);
}

/// `FB.PATCH` is how a primary replicates; a client cannot send it.
#[test]
fn fb_patch_is_refused_to_a_client() {
    let Some((_redis, mut c)) = Standalone::connected("fb_patch_is_refused_to_a_client") else {
        return;
    };
    let Reply::Error(e) = c.cmd(&["FB.PATCH", "k", "anything"]) else {
        panic!("FB.PATCH must be refused");
    };
    assert!(e.contains("not a command for clients"), "{e}");
    assert_eq!(c.cmd(&["EXISTS", "k"]), Reply::Int(0));
}

/// `FB.FENCE` writes nothing, but reaches the replicas, so a `WAIT` after
/// it on the same connection counts them.
#[test]
fn fb_fence_writes_nothing_and_reaches_the_replicas() {
    let Some((redis, mut p)) = Replicated::connected("fb_fence_writes_nothing", false) else {
        return;
    };
    let before = offset(&mut p);
    assert!(p.cmd(&["FB.FENCE", "k"]).is_ok());
    assert!(offset(&mut p) > before, "the fence is replicated");
    assert_eq!(p.cmd(&["WAIT", "1", "5000"]), Reply::Int(1));
    assert_eq!(p.cmd(&["EXISTS", "k"]), Reply::Int(0));
    assert_eq!(redis.replica.conn().cmd(&["EXISTS", "k"]), Reply::Int(0));
}

fn census(c: &mut Conn, args: &[&str]) -> (Vec<(String, i64)>, Vec<String>) {
    let mut all = vec!["FB.CENSUS", "*"];
    all.extend_from_slice(args);
    let reply = c.cmd(&all);
    let items = reply.items();
    let mut counts = Vec::new();
    let mut keys = Vec::new();
    for pair in items.chunks(2) {
        match &pair[1] {
            Reply::Int(n) => counts.push((pair[0].text(), *n)),
            Reply::Array(Some(listed)) => {
                keys = listed.chunks(2).map(|kv| kv[0].text()).collect();
            }
            other => panic!("FB.CENSUS field {}: {other:?}", pair[0].text()),
        }
    }
    (counts, keys)
}

fn count(counts: &[(String, i64)], name: &str) -> i64 {
    counts
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("FB.CENSUS has {name}: {counts:?}"))
}

/// `FB.CENSUS` counts at once the keys not at rest (by phase, their
/// tickets and waiters) and lists those not closed; the node's keys are
/// counted by the background pass.
#[test]
fn fb_census_counts_what_is_not_at_rest_and_the_pass_counts_the_keys() {
    let Some((_redis, mut c)) = Standalone::connected("fb_census_counts") else {
        return;
    };
    for key in ["svc:open", "svc:open2"] {
        for id in 1..=2u128 {
            c.cmd(&["FB.ACQUIRE", key, "*", &hex(id), POLICY]);
            c.cmd(&["FB.COMPLETE", key, "*", &hex(id), "failure"]);
        }
    }
    c.cmd(&["FB.ISOLATE", "svc:iso", "*", "POLICY", POLICY]);
    for id in 1..=3u128 {
        c.cmd(&["FB.ACQUIRE", "svc:busy", "*", &hex(id), POLICY]);
    }
    c.cmd(&["FB.ACQUIRE", "svc:quiet", "*", &hex(1), POLICY]);
    c.cmd(&["FB.COMPLETE", "svc:quiet", "*", &hex(1), "success"]);
    let (counts, keys) = census(&mut c, &["MATCH", "svc:", "COUNT", "10"]);
    assert_eq!(count(&counts, "open"), 2);
    assert_eq!(count(&counts, "isolated"), 1);
    assert_eq!(count(&counts, "half_open"), 0);
    assert_eq!(count(&counts, "tickets"), 3);
    assert_eq!(count(&counts, "closed"), 1, "svc:busy holds tickets");
    let mut keys = keys;
    keys.sort();
    assert_eq!(keys, ["svc:iso", "svc:open", "svc:open2"]);
    let (_, none) = census(&mut c, &["MATCH", "other:", "COUNT", "10"]);
    assert!(none.is_empty());
    // The pass counts every fusebox key, at rest too (svc:quiet).
    let keys = wait_for("a pass over the keys", Duration::from_secs(20), || {
        let (counts, _) = census(&mut c, &[]);
        (count(&counts, "complete") == 1 && count(&counts, "keys") == 5)
            .then(|| count(&counts, "keys"))
    });
    assert_eq!(keys, 5);
}

/// One `FB.LIST` call looks at a bounded part of the keyspace whatever
/// the pattern: listing five keys among four thousand takes many calls,
/// each with a few `SCAN` steps, never one walk of everything.
#[test]
fn one_fb_list_call_does_bounded_work() {
    let Some((_redis, mut c)) = Standalone::connected("one_fb_list_call_does_bounded_work") else {
        return;
    };
    for i in 0..4000 {
        c.cmd(&["SET", &format!("other:{i}"), "x"]);
    }
    for i in 0..5u128 {
        c.cmd(&["FB.ACQUIRE", &format!("few:{i}"), "*", &hex(i + 1), POLICY]);
    }
    c.cmd(&["CONFIG", "RESETSTAT"]);
    let mut cursor = "0".to_owned();
    let mut calls = 0;
    let mut listed = Vec::new();
    loop {
        let reply = c.cmd(&["FB.LIST", &cursor, "*", "MATCH", "few:*", "COUNT", "2"]);
        let items = reply.items();
        cursor = items[0].text();
        let found = items[1].items();
        assert!(found.len() <= 4, "at most COUNT keys a call: {reply:?}");
        listed.extend(found.chunks(2).map(|kv| kv[0].text()));
        calls += 1;
        if cursor == "0" {
            break;
        }
    }
    listed.sort();
    assert_eq!(listed, ["few:0", "few:1", "few:2", "few:3", "few:4"]);
    let stats = c.cmd(&["INFO", "commandstats"]).text();
    let scans: u64 = stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_scan:calls="))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .expect("SCAN calls counted");
    assert!(calls > 10, "a call stops after its budget: {calls} calls");
    assert!(
        scans <= calls * 21,
        "{scans} SCAN steps over {calls} calls: at most 20 buckets' worth each"
    );
}

#[test]
fn fb_list_never_answers_more_than_count_and_goes_on_inside_a_bucket() {
    let Some((_redis, mut c)) = Standalone::connected("fb_list_goes_on_inside_a_bucket") else {
        return;
    };
    // 300 keys in a table of 512 buckets: many buckets hold two or more,
    // more than a call of COUNT 1 may answer.
    let mut made: Vec<String> = (0..300u128)
        .map(|i| {
            let key = format!("b:{i}");
            c.cmd(&["FB.ACQUIRE", &key, "*", &hex(i + 1), POLICY]);
            key
        })
        .collect();
    made.sort();
    let mut cursor = "0".to_owned();
    let mut after: Option<String> = None;
    let mut listed = Vec::new();
    let mut inside = 0;
    loop {
        let mut call = vec!["FB.LIST", &cursor, "*", "COUNT", "1"];
        if let Some(key) = &after {
            call.extend(["AFTER", key]);
        }
        let reply = c.cmd(&call);
        let items = reply.items();
        let found = items[1].items();
        assert!(found.len() <= 2, "at most one key a call: {reply:?}");
        listed.extend(found.chunks(2).map(|kv| kv[0].text()));
        after = items.get(2).map(Reply::text);
        if after.is_some() {
            inside += 1;
            assert_eq!(after.as_deref(), listed.last().map(String::as_str));
        }
        cursor = items[0].text();
        if cursor == "0" && after.is_none() {
            break;
        }
    }
    listed.sort();
    assert_eq!(
        listed, made,
        "every key once, none twice, in a table that did not change"
    );
    assert!(
        inside > 0,
        "some bucket held more than one key: the test did not reach its point"
    );
}

/// A value of encoding 6 kept an adaptive limiter's state as an earlier
/// algorithm learned it: its four words are read as zeros, so the limiter
/// learns its baseline again from its next ten calls (CX26); its limit and
/// held permits stay. The value is encoding 7's (written by the module of
/// that release: ten calls of 1 ms, then one held) with its version byte
/// set to 6, the two layouts being the same; encoding 7 keeps its
/// baseline. The next step writes encoding 8.
#[test]
fn an_adaptive_limiter_of_the_sixth_encoding_learns_its_baseline_again() {
    let Some((_redis, mut c)) = Standalone::connected("an_adaptive_limiter_of_the_sixth") else {
        return;
    };
    let limit = |c: &mut Conn, key: &str, now: u64| view(c, key, now)["adaptive_limit"].as_u64();
    let mut value = fixture(include_str!("fixtures/v7-adaptive-held.hex"));
    assert!(value.starts_with(b"FBX\x07"));
    assert!(c.cmd(&[&b"SET"[..], b"kept", &value]).is_ok());
    assert_eq!(limit(&mut c, "kept", 100), Some(8), "a baseline of 1 ms");
    value[3] = 6;
    assert!(c.cmd(&[&b"SET"[..], b"ad", &value]).is_ok());
    for key in ["kept", "ad"] {
        assert_eq!(
            view(&mut c, key, 100)["free"],
            7,
            "the held permit stays held"
        );
    }
    // A call of 200 ms ends a round against the kept baseline (the limit
    // shrinks to 7) but is a first sample of the one read as zeros.
    for key in ["kept", "ad"] {
        let done = c.cmd(&["FB.COMPLETE", key, "300", &hex(99), "success"]);
        assert_eq!(done.items()[1], Reply::Int(0), "{key}: {done:?}");
        assert!(bytes(c.cmd(&["GET", key])).starts_with(b"FBX\x08"));
    }
    assert_eq!(limit(&mut c, "kept", 300), Some(7));
    assert_eq!(limit(&mut c, "ad", 300), Some(8));
}

/// A value of encoding 7 (written by the module of that release: a quorum
/// breaker, `failures` 2, and five tickets granted at 0 whose leases end
/// at 100 as `FAILURE`, four of caller a with ids 5 to 2, then one of
/// caller b with id 1) has no grant numbers: its tickets read as granted
/// together and are settled by id, as that release did (T2 holds for
/// tickets granted since). Ticket 1 (b) and ticket 2 (a) make the quorum:
/// open at 100, a run of 2, the others stale.
#[test]
fn tickets_of_the_seventh_encoding_read_as_granted_together() {
    let Some((_redis, mut c)) = Standalone::connected("tickets_of_the_seventh_encoding") else {
        return;
    };
    let old = fixture(include_str!("fixtures/v7-five-tickets-one-instant.hex"));
    assert!(old.starts_with(b"FBX\x07"));
    assert!(c.cmd(&[&b"SET"[..], b"ties", &old]).is_ok());
    let before = view(&mut c, "ties", 50);
    assert_eq!(before["live_tickets"], 5);
    assert_eq!(bytes(c.cmd(&["GET", "ties"])), old, "a read writes nothing");
    // A step (the lease of ticket 5 renewed to end where it did) writes
    // the value in encoding 8.
    let renewed = c.cmd(&["FB.RENEW", "ties", "50", &hex(5), "LEASE", "50"]);
    assert!(!matches!(renewed, Reply::Error(_)), "{renewed:?}");
    assert!(bytes(c.cmd(&["GET", "ties"])).starts_with(b"FBX\x08"));
    let after = view(&mut c, "ties", 100);
    assert_eq!(after["phase"], "open", "{after}");
    assert_eq!(after["consecutive_failures"], 2, "{after}");
    assert_eq!(after["live_tickets"], 0, "{after}");
}

fn fixture(text: &str) -> Vec<u8> {
    let text = text.trim();
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}
