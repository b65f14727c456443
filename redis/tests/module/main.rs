//! The module inside a real `redis-server`: loaded standalone, and in a
//! 3-primary, 3-replica Redis Cluster. See `harness.rs` for what the tests
//! need and how they find it.

mod commands;
mod cost;
mod harness;
mod notices;
mod resp;
mod state;

use harness::{Cluster, Standalone};
use resp::{Conn, Reply};

// Replies as the tests write them.

fn bulk(text: &str) -> Reply {
    Reply::Bulk(Some(text.as_bytes().to_vec()))
}

fn nil() -> Reply {
    Reply::Bulk(None)
}

fn int(n: i64) -> Reply {
    Reply::Int(n)
}

fn array(items: Vec<Reply>) -> Reply {
    Reply::Array(Some(items))
}

fn error(text: &str) -> Reply {
    Reply::Error(text.to_owned())
}

/// A ticket id as the module writes it: 32 lower-case hex digits.
fn hex(id: u128) -> String {
    format!("{id:032x}")
}

/// `FB.GET` parsed, or `None` for nil.
fn view(conn: &mut Conn, key: &str, now: u64) -> Option<serde_json::Value> {
    match conn.cmd(&["FB.GET", key, &now.to_string()]) {
        Reply::Bulk(None) => None,
        Reply::Bulk(Some(json)) => Some(serde_json::from_slice(&json).expect("FB.GET gives JSON")),
        other => panic!("FB.GET {key}: {other:?}"),
    }
}

#[test]
fn the_module_loads_as_fusebox() {
    let Some(redis) = Standalone::start("the_module_loads_as_fusebox") else {
        return;
    };
    let modules = redis.server.conn().cmd(&["MODULE", "LIST"]);
    let names: Vec<String> = modules
        .items()
        .iter()
        .map(|m| {
            let fields = m.items();
            let at = fields
                .iter()
                .position(|f| f.text() == "name")
                .expect("a name field");
            fields[at + 1].text()
        })
        .collect();
    assert_eq!(names, ["fusebox"], "{modules:?}");
    assert!(
        redis.server.log().contains("Module 'fusebox' loaded"),
        "{}",
        redis.server.log()
    );
}

#[test]
fn fb_version_names_the_module_and_the_state_encoding() {
    let Some((_redis, mut conn)) =
        Standalone::connected("fb_version_names_the_module_and_the_state_encoding")
    else {
        return;
    };
    let version = conn.cmd(&["FB.VERSION"]);
    assert_eq!(
        version,
        Reply::Array(Some(vec![
            Reply::Simple("module".into()),
            Reply::Simple(env!("CARGO_PKG_VERSION").into()),
            Reply::Simple("encoding".into()),
            Reply::Int(fusebox_redis::state::ENCODING_VERSION.into()),
            Reply::Simple("signing".into()),
            Reply::Simple("off".into()),
        ]))
    );
    assert_eq!(
        conn.cmd(&["FB.VERSION", "extra"]),
        error("ERR wrong number of arguments for 'fb.version' command")
    );
}

#[test]
fn fb_keycheck_accepts_valid_keys_and_names_the_field_it_refuses() {
    let Some((_redis, mut conn)) =
        Standalone::connected("fb_keycheck_accepts_valid_keys_and_names_the_field_it_refuses")
    else {
        return;
    };
    for key in ["payments", "payments/eu-west/ünïcode", &"x".repeat(256)] {
        assert!(conn.cmd(&["FB.KEYCHECK", key]).is_ok(), "{key}");
    }
    assert_eq!(
        conn.cmd(&["FB.KEYCHECK", ""]),
        error("ERR key: must not be empty")
    );
    assert_eq!(
        conn.cmd(&["FB.KEYCHECK", &"x".repeat(257)]),
        error("ERR key: must be at most 256 bytes of UTF-8, not 257")
    );
    assert_eq!(
        conn.cmd(&["FB.KEYCHECK", "pay\u{202E}ments"]),
        error("ERR key: must not contain control characters (found U+202E)")
    );
    assert_eq!(
        conn.cmd(&[&b"FB.KEYCHECK"[..], b"\xff\xfe"]),
        error("ERR key: must be UTF-8; send the key's UTF-8 bytes")
    );
    assert_eq!(
        conn.cmd(&["FB.KEYCHECK"]),
        error("ERR wrong number of arguments for 'fb.keycheck' command")
    );
}

#[test]
fn fb_keycheck_reads_the_key_as_a_versioned_string() {
    let Some((_redis, mut conn)) =
        Standalone::connected("fb_keycheck_reads_the_key_as_a_versioned_string")
    else {
        return;
    };
    let state = b"FBX\x02\x00any payload\xff";
    assert!(conn.cmd(&[&b"SET"[..], b"fuse/ok", &state[..]]).is_ok());
    assert!(conn.cmd(&["FB.KEYCHECK", "fuse/ok"]).is_ok());

    assert!(conn.cmd(&["SET", "fuse/foreign", "hello"]).is_ok());
    let Reply::Error(foreign) = conn.cmd(&["FB.KEYCHECK", "fuse/foreign"]) else {
        panic!("a foreign string must be refused");
    };
    assert!(foreign.starts_with("ERR state: "), "{foreign}");

    assert!(conn.cmd(&["SET", "fuse/newer", "FBX\u{7f}"]).is_ok());
    let Reply::Error(newer) = conn.cmd(&["FB.KEYCHECK", "fuse/newer"]) else {
        panic!("a newer encoding must be refused");
    };
    assert!(
        newer.starts_with("ERR state: ") && newer.contains("127"),
        "{newer}"
    );

    assert_eq!(conn.cmd(&["HSET", "fuse/hash", "a", "b"]), Reply::Int(1));
    assert_eq!(
        conn.cmd(&["FB.KEYCHECK", "fuse/hash"]),
        error("WRONGTYPE Operation against a key holding the wrong kind of value")
    );
}

#[test]
fn commands_name_their_keys_for_cluster_routing() {
    let Some((_redis, mut conn)) =
        Standalone::connected("commands_name_their_keys_for_cluster_routing")
    else {
        return;
    };
    assert_eq!(
        conn.cmd(&["COMMAND", "GETKEYS", "FB.KEYCHECK", "k"]),
        Reply::Array(Some(vec![Reply::Bulk(Some(b"k".to_vec()))]))
    );
    let info = conn.cmd(&["COMMAND", "INFO", "fb.keycheck", "fb.version"]);
    let [keycheck, version] = info.items() else {
        panic!("{info:?}");
    };
    // name, arity, flags, first key, last key, step
    assert_eq!(
        keycheck.items()[3..6],
        [Reply::Int(1), Reply::Int(1), Reply::Int(1)]
    );
    assert_eq!(
        version.items()[3..6],
        [Reply::Int(0), Reply::Int(0), Reply::Int(0)]
    );
}

#[test]
fn in_a_cluster_each_key_is_answered_by_its_slot_owner_and_moved_elsewhere() {
    let Some(cluster) =
        Cluster::start("in_a_cluster_each_key_is_answered_by_its_slot_owner_and_moved_elsewhere")
    else {
        return;
    };
    println!(
        "cluster of 3 primaries and 3 replicas healthy after {:?} ({:?})",
        cluster.start_time, cluster.steps
    );
    let primaries = cluster.primaries();
    let replicas = cluster.replicas();
    assert_eq!((primaries.len(), replicas.len()), (3, 3));

    // Keys until every primary has owned at least one.
    let mut owners_seen = std::collections::BTreeSet::new();
    for i in 0.. {
        let key = format!("fuse/{i}");
        let slot = match primaries[0].conn().cmd(&["CLUSTER", "KEYSLOT", &key]) {
            Reply::Int(slot) => slot,
            other => panic!("CLUSTER KEYSLOT {key}: {other:?}"),
        };
        let mut owner = None;
        for node in &primaries {
            match node.conn().cmd(&["FB.KEYCHECK", &key]) {
                r if r.is_ok() => {
                    assert_eq!(owner.replace(node.port), None, "{key}: two owners");
                }
                Reply::Error(e) => {
                    let (moved, rest) = e.split_once(' ').unwrap_or_default();
                    assert_eq!(moved, "MOVED", "{key} on {}: {e}", node.port);
                    assert!(
                        rest.starts_with(&format!("{slot} 127.0.0.1:")),
                        "{key}: {e}"
                    );
                }
                other => panic!("{key} on {}: {other:?}", node.port),
            }
        }
        let owner = owner.unwrap_or_else(|| panic!("{key}: no primary answered OK"));
        // Every MOVED pointed at the owner.
        for node in primaries.iter().filter(|n| n.port != owner) {
            assert_eq!(
                node.conn().cmd(&["FB.KEYCHECK", &key]),
                error(&format!("MOVED {slot} 127.0.0.1:{owner}"))
            );
        }
        // A replica redirects to its primary until the client says READONLY.
        for replica in &replicas {
            let mut conn = replica.conn();
            let reply = conn.cmd(&["FB.KEYCHECK", &key]);
            assert!(
                matches!(reply, Reply::Error(ref e) if e.starts_with("MOVED ")),
                "{reply:?}"
            );
        }
        owners_seen.insert(owner);
        if owners_seen.len() == 3 {
            assert!(i >= 2);
            break;
        }
        assert!(i < 1000, "keys never reached all three primaries");
    }
}
