//! Time `*`, the notices published on `fusebox:answers` and
//! `fusebox:events`, `FB.SETTLE`, `FB.WITHDRAW` and the settler timer,
//! against a real `redis-server`.

use std::time::Duration;

use crate::harness::{info_field, wait_for, Replicated, Server, Standalone};
use crate::resp::{Conn, Reply};
use crate::{bulk, hex, int, nil};

/// One permit, a queue of 4, and a breaker that trips on 1 failure.
const ONE: &str = r#"{"breaker":{"mode":"consecutive","failures":1,"break":1000},
    "limiter":{"kind":"concurrency","permits":1,"queue_limit":4}}"#;

fn json(reply: &Reply) -> serde_json::Value {
    serde_json::from_str(&reply.text()).expect("JSON")
}

/// A connection subscribed to both channels.
fn subscriber(server: &Server) -> Conn {
    let mut s = server.conn();
    s.cmd(&["SUBSCRIBE", "fusebox:answers", "fusebox:events"]);
    s.read().expect("the second subscription");
    s
}

/// The next message on a subscribed connection: `(channel, JSON)`.
fn message(s: &mut Conn) -> (String, serde_json::Value) {
    let m = s.read().expect("a message within the read timeout");
    let items = m.items();
    assert_eq!(items[0].text(), "message", "{m:?}");
    let text = items[2].text();
    (
        items[1].text(),
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    )
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[test]
fn a_star_time_is_the_servers_clock_and_replicates_as_a_number() {
    let test = "a_star_time_is_the_servers_clock_and_replicates_as_a_number";
    let Some((redis, mut p)) = Replicated::connected(test, true) else {
        return;
    };
    let before = wall_ms();
    let reply = p.cmd(&["FB.ACQUIRE", "k", "*", "1", ONE]);
    let after = wall_ms();
    let items = reply.items();
    assert_eq!(items.len(), 7, "{reply:?}");
    assert_eq!(items[0], bulk("granted"));
    assert_eq!(items[5], bulk("closed"));
    let Reply::Int(now) = items[6] else {
        panic!("now_ms: {reply:?}");
    };
    let now = now as u64;
    assert!((before..=after).contains(&now), "{before} {now} {after}");
    // An explicit time earlier than the key's is refused; * never goes back.
    let Reply::Error(e) = p.cmd(&["FB.COMPLETE", "k", "5", "1", "success"]) else {
        panic!("an earlier time must be refused");
    };
    assert!(e.starts_with("ERR now (5 ms) is earlier"), "{e}");
    let later = now + 20_000;
    let got = p.cmd(&["FB.GET", "k", &later.to_string()]);
    assert_eq!(json(&got)["now_ms"], later);
    assert!(p
        .cmd(&["FB.RENEW", "k", &later.to_string(), "1"])
        .eq(&int(30_000)));
    let star = p.cmd(&["FB.COMPLETE", "k", "*", "1", "success"]);
    assert_eq!(star.items()[3], bulk("closed"));
    assert_eq!(
        json(&p.cmd(&["FB.GET", "k", "*"]))["last_now"],
        later,
        "* is raised to the key's last time seen"
    );

    assert_eq!(p.cmd(&["WAIT", "1", "5000"]), int(1));
    let mut r = redis.replica.conn();
    assert_eq!(r.cmd(&["GET", "k"]), p.cmd(&["GET", "k"]));
    // The AOF holds the bytes each step wrote (FB.PATCH), never the
    // command with *: a replay writes them again without the step.
    let aof_dir = redis.primary.dir.join("appendonlydir");
    let aof: Vec<u8> = wait_for("the AOF holding the steps", Duration::from_secs(10), || {
        let mut all = Vec::new();
        for entry in std::fs::read_dir(&aof_dir).ok()? {
            let path = entry.ok()?.path();
            if path.to_string_lossy().ends_with(".incr.aof") {
                all.extend(std::fs::read(path).ok()?);
            }
        }
        let text = String::from_utf8_lossy(&all).to_lowercase();
        (text.matches("fb.patch").count() >= 3).then_some(all)
    });
    let text = String::from_utf8_lossy(&aof).to_lowercase();
    assert!(
        !text.contains("fb.complete") && !text.contains("fb.acquire"),
        "{text}"
    );
    assert!(!text.contains("\r\n$1\r\n*\r\n"), "{text}");
    let Reply::Bulk(Some(value)) = p.cmd(&["GET", "k"]) else {
        panic!("the key holds state");
    };
    let last = u64::from_le_bytes(value[48..56].try_into().unwrap());
    assert_eq!(last, later, "the time used is in the bytes");
}

#[test]
fn a_status_check_on_an_empty_key_makes_no_key() {
    let Some((_redis, mut c)) =
        Standalone::connected("a_status_check_on_an_empty_key_makes_no_key")
    else {
        return;
    };
    let reply = c.cmd(&["FB.ACQUIRE", "k", "*", "1", ONE, "PERMITS", "0"]);
    assert_eq!(
        reply.items()[..6],
        [bulk("granted"), nil(), nil(), nil(), nil(), bulk("closed")]
    );
    assert_eq!(c.cmd(&["EXISTS", "k"]), int(0));
    assert_eq!(
        c.cmd(&["FB.SETTLE", "k", "*"]),
        Reply::Array(Some(vec![nil(), nil()]))
    );
    assert_eq!(c.cmd(&["FB.WITHDRAW", "k", "*", "1"]), bulk("unknown"));
    assert_eq!(c.cmd(&["EXISTS", "k"]), int(0));
}

#[test]
fn answers_and_events_are_published_and_settle_reports_a_waiter() {
    let Some(redis) =
        Standalone::start("answers_and_events_are_published_and_settle_reports_a_waiter")
    else {
        return;
    };
    let mut s = subscriber(&redis.server);
    let mut c = redis.server.conn();
    assert_eq!(
        c.cmd(&["FB.ACQUIRE", "k", "0", "1", ONE]).items()[0],
        bulk("granted")
    );
    assert_eq!(
        c.cmd(&["FB.ACQUIRE", "k", "1", "2", ONE, "MAXWAIT", "1000"])
            .items()[0],
        bulk("queued")
    );
    let settled = c.cmd(&["FB.SETTLE", "k", "2", "WAITER", "2"]);
    assert_eq!(settled.items()[0], int(1001), "the wait's end is next");
    assert_eq!(settled.items()[1].items()[0], bulk("queued"));

    // The completion serves the waiter: its answer is published.
    assert_eq!(
        c.cmd(&["FB.COMPLETE", "k", "3", "1", "success"]).items()[3],
        bulk("closed")
    );
    let (channel, answer) = message(&mut s);
    assert_eq!(channel, "fusebox:answers");
    assert_eq!(
        answer,
        serde_json::json!({"key": "k", "waiter": hex(2), "decision": "granted",
            "reason": null, "ticket": hex(2), "lease_ms": 30_000, "retry_after_ms": null,
            "phase": "closed", "now_ms": 3})
    );
    // SETTLE tells of the served waiter by its ticket, and of an unknown one.
    let settled = c.cmd(&["FB.SETTLE", "k", "4", "WAITER", "2"]);
    assert_eq!(
        settled.items()[1],
        Reply::Array(Some(vec![
            bulk("granted"),
            nil(),
            bulk(&hex(2)),
            int(29_999),
            nil(),
            bulk("closed"),
            int(4)
        ]))
    );
    assert_eq!(
        c.cmd(&["FB.SETTLE", "k", "4", "WAITER", "99"]).items()[1],
        nil()
    );

    // A failure trips the breaker: an event.
    c.cmd(&["FB.COMPLETE", "k", "5", "2", "failure"]);
    let (channel, event) = message(&mut s);
    assert_eq!(channel, "fusebox:events");
    assert_eq!(
        (&event["key"], &event["from"], &event["to"], &event["at_ms"]),
        (&"k".into(), &"closed".into(), &"open".into(), &5.into())
    );
    assert_eq!(event["cause"], "failures reached the trip condition");
    assert_eq!(
        (&event["who"], &event["why"]),
        (&serde_json::Value::Null, &serde_json::Value::Null)
    );
    assert_eq!(event["view"]["phase"], "open");

    // An operator's isolation carries who and why.
    let view = json(&c.cmd(&["FB.ISOLATE", "k", "6", "BY", "alice", "WHY", "db upgrade"]));
    assert_eq!(view["phase"], "isolated");
    let (channel, event) = message(&mut s);
    assert_eq!(channel, "fusebox:events");
    assert_eq!(
        (&event["to"], &event["who"], &event["why"], &event["view"]),
        (
            &"isolated".into(),
            &"alice".into(),
            &"db upgrade".into(),
            &view
        )
    );
    let Reply::Error(e) = c.cmd(&["FB.CLOSE", "k", "7", "BY", &"x".repeat(257)]) else {
        panic!("a long BY must be refused");
    };
    assert!(e.starts_with("ERR by: "), "{e}");

    // SETTLE reports the answer it gave itself: a wait that timed out.
    c.cmd(&["FB.CLOSE", "k", "8"]);
    assert_eq!(message(&mut s).1["to"], "closed");
    assert_eq!(
        c.cmd(&["FB.ACQUIRE", "k", "9", "3", ONE]).items()[0],
        bulk("granted")
    );
    c.cmd(&["FB.ACQUIRE", "k", "9", "4", ONE, "MAXWAIT", "10"]);
    let settled = c.cmd(&["FB.SETTLE", "k", "50", "WAITER", "4"]);
    assert_eq!(
        settled.items()[1].items()[..2],
        [bulk("denied"), bulk("timeout")]
    );
    assert_eq!(message(&mut s).1["decision"], "denied");
}

#[test]
fn withdraw_tells_withdrawn_released_and_unknown_apart() {
    let Some((_redis, mut c)) =
        Standalone::connected("withdraw_tells_withdrawn_released_and_unknown_apart")
    else {
        return;
    };
    c.cmd(&["FB.ACQUIRE", "w", "0", "1", ONE]);
    c.cmd(&["FB.ACQUIRE", "w", "1", "2", ONE, "MAXWAIT", "1000"]);
    assert_eq!(c.cmd(&["FB.WITHDRAW", "w", "2", "2"]), bulk("withdrawn"));
    assert_eq!(c.cmd(&["FB.WITHDRAW", "w", "3", "1"]), bulk("released"));
    assert_eq!(c.cmd(&["FB.WITHDRAW", "w", "4", "1"]), bulk("unknown"));
    let v = json(&c.cmd(&["FB.GET", "w", "4"]));
    assert_eq!(
        (
            v["free"].as_u64(),
            v["live_tickets"].as_u64(),
            v["waiters"].as_u64()
        ),
        (Some(1), Some(0), Some(0))
    );
    assert_eq!(
        (
            v["stats"]["withdrawn"].as_u64(),
            v["stats"]["ignored"].as_u64()
        ),
        (Some(1), Some(1))
    );
}

#[test]
fn a_replica_does_not_publish() {
    let Some((redis, mut p)) = Replicated::connected("a_replica_does_not_publish", false) else {
        return;
    };
    let mut on_primary = subscriber(&redis.primary);
    let mut on_replica = subscriber(&redis.replica);
    p.cmd(&["FB.ACQUIRE", "k", "0", "1", ONE]);
    p.cmd(&["FB.COMPLETE", "k", "1", "1", "failure"]);
    assert_eq!(p.cmd(&["WAIT", "1", "5000"]), int(1));
    assert_eq!(message(&mut on_primary).1["to"], "open");
    // The replica ran the same commands; the first message its subscriber
    // sees is a marker published after them.
    redis
        .replica
        .conn()
        .cmd(&["PUBLISH", "fusebox:events", "marker"]);
    assert_eq!(message(&mut on_replica).1, "marker");
}

#[test]
fn the_timer_settles_an_ended_lease_on_the_servers_clock() {
    let Some((_redis, mut c)) =
        Standalone::connected("the_timer_settles_an_ended_lease_on_the_servers_clock")
    else {
        return;
    };
    let reply = c.cmd(&["FB.ACQUIRE", "t", "*", "1", ONE, "LEASE", "50"]);
    assert_eq!(reply.items()[0], bulk("granted"));
    // Read the stored bytes, not FB.GET (which settles on a copy): only the
    // timer writes the key.
    wait_for(
        "the timer to settle the lease",
        Duration::from_secs(10),
        || {
            let Reply::Bulk(Some(value)) = c.cmd(&["GET", "t"]) else {
                panic!("the key is there");
            };
            let fuse = fusebox_redis::keyed::read_copy(&value).expect("fusebox state");
            (fuse.live_tickets() == 0 && fuse.stats().expired == 1).then_some(())
        },
    );
    let v = json(&c.cmd(&["FB.GET", "t", "*"]));
    assert_eq!(
        (v["live_tickets"].as_u64(), v["free"].as_u64()),
        (Some(0), Some(1))
    );
    // A key on a caller's own clock is left alone until touched.
    c.cmd(&["FB.ACQUIRE", "m", "1000", "1", ONE, "LEASE", "50"]);
    let before = c.cmd(&["GET", "m"]);
    wait_for(
        "another settled key, after m's lease",
        Duration::from_secs(10),
        || {
            c.cmd(&["FB.ACQUIRE", "u", "*", "2", ONE, "LEASE", "1"]);
            let Reply::Bulk(Some(value)) = c.cmd(&["GET", "u"]) else {
                return None;
            };
            let fuse = fusebox_redis::keyed::read_copy(&value).ok()?;
            (fuse.stats().expired >= 1).then_some(())
        },
    );
    assert_eq!(c.cmd(&["GET", "m"]), before);
}

#[test]
fn in_a_cluster_each_notice_is_published_once_and_the_timers_step_replicates() {
    let Some(cluster) = crate::harness::Cluster::start(
        "in_a_cluster_each_notice_is_published_once_and_the_timers_step_replicates",
    ) else {
        return;
    };
    let key = "fuse/{a}";
    let owner = cluster
        .primaries()
        .into_iter()
        .find(|n| n.conn().cmd(&["FB.KEYCHECK", key]).is_ok())
        .expect("a primary owns the key");
    let mut subscribers: Vec<(u16, Conn)> = cluster
        .nodes
        .iter()
        .map(|n| (n.port, subscriber(n)))
        .collect();
    let mut p = owner.conn();
    p.cmd(&["FB.ACQUIRE", key, "0", "1", ONE]);
    p.cmd(&["FB.COMPLETE", key, "1", "1", "failure"]);
    assert_eq!(p.cmd(&["WAIT", "1", "5000"]), int(1));
    p.cmd(&["PUBLISH", "fusebox:events", "marker"]);
    // Every node's subscriber hears the event once, then the marker.
    for (port, s) in &mut subscribers {
        let (channel, event) = message(s);
        assert_eq!(
            (channel.as_str(), &event["to"]),
            ("fusebox:events", &"open".into()),
            "{port}"
        );
        assert_eq!(message(s).1, "marker", "node {port} heard the event twice");
    }

    // The timer's step on the primary reaches the replica.
    let timed = "fuse/{a}/timed";
    p.cmd(&["FB.ACQUIRE", timed, "*", "1", ONE, "LEASE", "50"]);
    let replica = cluster
        .replicas()
        .into_iter()
        .find(|r| {
            let info = r.conn().cmd(&["INFO", "replication"]);
            info_field(&info, "master_port").as_deref() == Some(&owner.port.to_string())
        })
        .expect("the owner's replica");
    let mut r = replica.conn();
    r.cmd(&["READONLY"]);
    wait_for(
        "the replica to hold the settled key",
        Duration::from_secs(10),
        || {
            let Reply::Bulk(Some(value)) = r.cmd(&["GET", timed]) else {
                return None;
            };
            let fuse = fusebox_redis::keyed::read_copy(&value).ok()?;
            (fuse.stats().expired == 1).then_some(())
        },
    );
    assert_eq!(r.cmd(&["GET", timed]), p.cmd(&["GET", timed]));
}

/// `(now_ms, seq)` of an event.
fn order(event: &serde_json::Value) -> (u64, u64) {
    let order = &event["order"];
    let field = |name: &str| {
        order[name]
            .as_u64()
            .unwrap_or_else(|| panic!("order.{name} in {event}"))
    };
    (field("now_ms"), field("seq"))
}

/// Every event carries its place in its key's sequence: the step's time
/// and the breaker's epoch. They grow with every transition, at one
/// instant too, and a key forgotten and made again comes after its old
/// events by its time.
#[test]
fn a_keys_events_are_in_a_strict_order_that_a_new_key_keeps() {
    let Some(redis) = Standalone::start("a_keys_events_are_in_a_strict_order_that_a_new_key_keeps")
    else {
        return;
    };
    let mut s = subscriber(&redis.server);
    let mut c = redis.server.conn();
    c.cmd(&["FB.ACQUIRE", "k", "10", "1", ONE]);
    c.cmd(&["FB.COMPLETE", "k", "10", "1", "failure"]);
    c.cmd(&["FB.ISOLATE", "k", "10"]);
    c.cmd(&["FB.CLOSE", "k", "10"]);
    c.cmd(&["FB.ISOLATE", "k", "11"]);
    c.cmd(&["FB.CLOSE", "k", "12"]);
    let mut seen = Vec::new();
    for to in ["open", "isolated", "closed", "isolated", "closed"] {
        let (channel, event) = message(&mut s);
        assert_eq!(
            (channel.as_str(), &event["to"]),
            ("fusebox:events", &to.into())
        );
        assert_eq!(order(&event).1, event["view"]["epoch"].as_u64().unwrap());
        seen.push(order(&event));
    }
    assert_eq!(seen[0].0, 10);
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    // The key made afresh: its epochs start again, its time does not.
    assert_eq!(c.cmd(&["DEL", "k"]), int(1));
    c.cmd(&["FB.ACQUIRE", "k", "13", "1", ONE]);
    c.cmd(&["FB.COMPLETE", "k", "13", "1", "failure"]);
    let (_, event) = message(&mut s);
    let afresh = order(&event);
    assert!(afresh.1 < seen[4].1, "{afresh:?} {seen:?}");
    assert!(afresh > seen[4], "{afresh:?} {seen:?}");
}
