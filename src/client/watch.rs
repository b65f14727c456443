//! `fusebox watch`: the keys' transitions as they happen.

use fusebox_proto::v1 as pb;

use crate::connect::{admin, call_error, ClientOptions};
use crate::print::{emit, key_json, now_s, transition_json, transition_line};
use crate::signal::stop_signal;
use crate::table::key_table;

/// Streams the transitions of the keys that start with `prefix`: a
/// snapshot first, then every phase change, isolate and close, until the
/// user interrupts or the stream ends.
pub async fn watch(client: ClientOptions, prefix: String) -> anyhow::Result<()> {
    let mut stop = stop_signal()?;
    let mut admin = admin(&client).await?;
    let mut stream = admin
        .watch(pb::WatchRequest {
            prefix: prefix.clone(),
        })
        .await
        .map_err(call_error)?
        .into_inner();
    // The parts of the snapshot being received.
    let mut snapshot: Vec<pb::KeyState> = Vec::new();
    loop {
        let message = tokio::select! {
            message = stream.message() => message,
            () = &mut stop => return Ok(()),
        };
        let event = match message {
            Ok(Some(pb::WatchEvent { event: Some(event) })) => event,
            Ok(Some(pb::WatchEvent { event: None })) => continue,
            Ok(None) => {
                eprintln!("the server ended the watch stream");
                return Ok(());
            }
            Err(status) => return Err(call_error(status).context("the watch stream broke")),
        };
        match event {
            pb::watch_event::Event::Snapshot(part) if client.json => {
                let keys: Vec<serde_json::Value> = part.keys.iter().map(key_json).collect();
                emit(
                    &serde_json::json!({
                        "event": "snapshot",
                        "complete": part.complete,
                        "keys": keys,
                    })
                    .to_string(),
                )?;
            }
            pb::watch_event::Event::Snapshot(part) => {
                snapshot.extend(part.keys);
                if part.complete {
                    let keys = std::mem::take(&mut snapshot);
                    if !keys.is_empty() {
                        emit(&key_table(&keys, None).0.join("\n"))?;
                    }
                    let which = if prefix.is_empty() {
                        String::new()
                    } else {
                        format!(" starting with {prefix:?}")
                    };
                    let count = match keys.len() {
                        1 => "1 key".to_owned(),
                        n => format!("{n} keys"),
                    };
                    emit(&format!(
                        "{} snapshot: {count}{which}; watching for transitions",
                        now_s()
                    ))?;
                }
            }
            pb::watch_event::Event::Transition(t) if client.json => {
                emit(&transition_json(&t).to_string())?;
            }
            pb::watch_event::Event::Transition(t) => emit(&transition_line(&t))?,
            pb::watch_event::Event::Lagged(lag) if client.json => {
                emit(&serde_json::json!({ "event": "lagged", "missed": lag.missed }).to_string())?;
            }
            pb::watch_event::Event::Lagged(lag) => {
                // Parts of a snapshot cut short are superseded by the next.
                snapshot.clear();
                emit(&format!(
                    "{} lagged: this watcher fell behind and missed {} events; a fresh snapshot follows",
                    now_s(),
                    lag.missed
                ))?;
            }
        }
    }
}
