//! `fusebox-bench attack`: an authenticated caller's Acquire latency and
//! the server's memory, quiet and under attack, interleaved run by run.
//!
//! The tool starts the server itself, with `[auth]` and two tokens: the
//! caller's (the load) and the attacker's. The attack, from this process
//! on loopback: connections that send the HTTP/2 preface and no
//! credential, HEADERS-only calls without a token left open, and Decide
//! streams (with the attacker's token) that send status checks and never
//! read an answer.

use std::time::{Duration, Instant};

use anyhow::Context;
use fusebox::proto::v1 as pb;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use fusebox_cli::render_table;

use crate::load::{summary, Arm, Load, Measurement};
use crate::numbers::{median, ms, thousands};
use crate::options::Options;
use crate::report::Report;
use crate::spread::Spread;
use crate::target::{http_get, metric, Target};

/// The sizes of the attack.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Size {
    /// Connections that send only the HTTP/2 preface.
    pub(crate) tokenless: u32,
    /// HEADERS-only calls without a token, left open.
    pub(crate) headers_only: u32,
    /// Connections of never-read Decide streams.
    pub(crate) decide_connections: u32,
    /// Never-read Decide streams on each.
    pub(crate) decide_streams: u32,
}

/// The two tokens of the server the tool starts.
pub(crate) struct Tokens {
    pub(crate) caller: String,
    attacker: String,
}

impl Tokens {
    pub(crate) fn new() -> anyhow::Result<Tokens> {
        Ok(Tokens {
            caller: fusebox::auth::new_token().map_err(|e| anyhow::anyhow!("a token: {e}"))?,
            attacker: fusebox::auth::new_token().map_err(|e| anyhow::anyhow!("a token: {e}"))?,
        })
    }

    /// The config of the server: the tool's usual caps, and the tokens.
    fn config(&self) -> String {
        let entry = |name: &str, token: &str| {
            format!(
                "[[auth.token]]\nname = \"{name}\"\nrole = \"caller\"\nsha256 = \"{}\"\n",
                fusebox::auth::hash_hex(token)
            )
        };
        format!(
            "[server]\nmax_keys = 4000000\nmax_tickets = 4000000\n\n[auth]\n{}{}",
            entry("caller", &self.caller),
            entry("attacker", &self.attacker)
        )
    }
}

/// What an attack holds open; dropping it ends the attack.
struct Attack {
    _sockets: Vec<TcpStream>,
    tasks: tokio::task::JoinSet<()>,
}

impl Drop for Attack {
    fn drop(&mut self) {
        self.tasks.abort_all();
    }
}

/// Opens the attack on the server at `grpc` (http://ADDR).
async fn attack(grpc: &str, size: Size, attacker: &str) -> anyhow::Result<Attack> {
    let addr = grpc.trim_start_matches("http://").to_owned();
    let mut sockets = Vec::new();
    for _ in 0..size.tokenless {
        // A socket the server closed to make room stays closed.
        if let Ok(mut tcp) = TcpStream::connect(&addr).await {
            if tcp.write_all(fusebox::connections::PREFACE).await.is_ok() {
                sockets.push(tcp);
            }
        }
    }
    let mut tasks = tokio::task::JoinSet::new();
    // HEADERS-only calls, 250 to a connection (under its stream cap).
    let mut left = size.headers_only;
    while left > 0 {
        let n = left.min(250);
        left -= n;
        let tcp = TcpStream::connect(&addr).await.context("connect")?;
        let (client, connection) = h2::client::handshake(tcp)
            .await
            .context("an HTTP/2 handshake")?;
        tasks.spawn(async move {
            let _ = connection.await;
        });
        tasks.spawn(async move {
            let mut client = client;
            let mut open = Vec::new();
            for _ in 0..n {
                let Ok(ready) = client.clone().ready().await else {
                    break;
                };
                client = ready;
                let request = http::Request::post(format!(
                    "http://{addr_}/fusebox.v1.Fusebox/Acquire",
                    addr_ = "fusebox"
                ))
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(())
                .expect("a request");
                match client.send_request(request, false) {
                    Ok((response, body)) => open.push((response, body)),
                    Err(_) => break,
                }
            }
            std::future::pending::<()>().await;
            drop(open);
        });
    }
    // Decide streams that never read.
    let frame = pb::DecideRequest {
        frames: (0..1_000)
            .map(|id| pb::DecideFrame {
                id,
                request: Some(pb::decide_frame::Request::Acquire(pb::AcquireRequest {
                    key: format!("attack/{}", id % 100),
                    permits: Some(0),
                    max_wait: None,
                    lease: None,
                    ..Default::default()
                })),
            })
            .collect(),
    };
    let bearer: tonic::metadata::MetadataValue<_> = format!("Bearer {attacker}").parse()?;
    for _ in 0..size.decide_connections {
        let channel = tonic::transport::Endpoint::from_shared(grpc.to_owned())?
            .connect()
            .await
            .context("a Decide connection")?;
        for _ in 0..size.decide_streams {
            let (tx, rx) = tokio::sync::mpsc::channel(2);
            let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
            request
                .metadata_mut()
                .insert("authorization", bearer.clone());
            let mut client = pb::fusebox_client::FuseboxClient::new(channel.clone());
            let frame = frame.clone();
            tasks.spawn(async move {
                let Ok(answers) = client.decide(request).await else {
                    return;
                };
                // Frames for as long as the server reads them; answers never read.
                while tx.send(frame.clone()).await.is_ok() {}
                drop(answers);
            });
        }
    }
    Ok(Attack {
        _sockets: sockets,
        tasks,
    })
}

/// Waits until the server has stopped reading the attack's Decide frames
/// (its answers fill their bounds): no new frame for a second. False if
/// that took more than a minute.
async fn settle(target: &Target) -> bool {
    let Some(http) = target.https.first() else {
        return false;
    };
    let frames = || async {
        let text = http_get(http, "/metrics").await.ok()?;
        metric(&text, "fusebox_decide_frames_total")
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = frames().await;
    let mut since = Instant::now();
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = frames().await;
        if now != last {
            last = now;
            since = Instant::now();
        } else if since.elapsed() >= Duration::from_secs(1) {
            return true;
        }
    }
    false
}

/// Waits until the server has closed every Decide stream of the ended
/// attack (`fusebox_decide_streams` back to 0). False after a minute.
async fn released(target: &Target) -> bool {
    let Some(http) = target.https.first() else {
        return false;
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let text = http_get(http, "/metrics").await.unwrap_or_default();
        if metric(&text, "fusebox_decide_streams") == Some(0) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// What the server counted of the attack, from its `/metrics`.
async fn defences(target: &Target) -> String {
    let Some(http) = target.https.first() else {
        return "  (no HTTP address)".to_owned();
    };
    let Ok(text) = http_get(http, "/metrics").await else {
        return "  (/metrics did not answer)".to_owned();
    };
    [
        "fusebox_strangers_closed_total",
        "fusebox_calls_unauthenticated_total",
        "fusebox_streams_stuck_total{stream=\"decide\"}",
        "fusebox_decide_frames_total",
        "fusebox_decide_streams_refused_total",
        "fusebox_connections_refused_total",
    ]
    .iter()
    .map(|name| match metric(&text, name) {
        Some(v) => format!("  {name} {v}"),
        None => format!("  {name} (absent)"),
    })
    .collect::<Vec<_>>()
    .join("\n")
}

/// `fusebox-bench attack`.
pub(crate) async fn attack_mode(
    o: &Options,
    tokens: &Tokens,
    size: Size,
    store: Option<&str>,
    warnings: &mut Vec<String>,
) -> anyhow::Result<(Report, Target)> {
    let config = std::env::temp_dir().join(format!("fusebox-attack-{}.toml", std::process::id()));
    std::fs::write(&config, tokens.config()).context("the server's config")?;
    let more: Vec<String> = match store {
        Some(url) => vec!["--store".to_owned(), url.to_owned()],
        None => Vec::new(),
    };
    let mut target = Target::start_with(
        &o.server_bin()?,
        Some(&config),
        o.server_cpus.as_deref(),
        &more,
    )
    .await?;
    let _ = std::fs::remove_file(&config);
    eprintln!(
        "bench: server {} (http {}) started by the tool, with [auth]{}",
        target.grpcs.join(", "),
        target.https.join(", "),
        store.map_or(String::new(), |s| format!(", on {s}"))
    );
    let report = measure(o, &mut target, tokens, size, store.is_some(), warnings).await;
    Ok((report?, target))
}

/// The caller's `acquire` on the 1,000-key spread, in run `run`.
async fn acquire_1k(load: &Load, o: &Options, target: &Target, run: u16) -> Measurement {
    load.measure(
        Arm::Acquire,
        Spread::Thousand,
        ms(o.warmup),
        ms(o.duration),
        u64::from(run),
        target.pid.as_slice(),
    )
    .await
}

async fn measure(
    o: &Options,
    target: &mut Target,
    tokens: &Tokens,
    size: Size,
    store: bool,
    warnings: &mut Vec<String>,
) -> anyhow::Result<Report> {
    let load = o.load_on(target).await?;
    let grpc = target.grpcs[0].clone();
    let mut quiet = Vec::new();
    let mut loud = Vec::new();
    let mut growth = Vec::new();
    // Growth is taken from the server's memory before the first attack:
    // memory an attack made the server take is seldom given back to the
    // system, so a later run's own growth would hide it.
    let rss_start = target.memory().await.rss_bytes;
    for run in 0..o.runs {
        eprintln!("bench: run {}/{}: acquire 1k, quiet", run + 1, o.runs);
        quiet.push(acquire_1k(&load, o, target, run).await);
        eprintln!("bench: run {}/{}: opening the attack", run + 1, o.runs);
        let started = Instant::now();
        let held = attack(&grpc, size, &tokens.attacker).await?;
        let settled = settle(target).await;
        eprintln!(
            "bench: run {}/{}: attack open in {:.1?}, {}; acquire 1k under it",
            run + 1,
            o.runs,
            started.elapsed(),
            if settled {
                "the server stopped reading the attack's frames"
            } else {
                "the server still reads the attack's frames after 60 s"
            }
        );
        if !settled {
            warnings.push("the attack's Decide streams were still read after 60 s".to_owned());
        }
        loud.push(acquire_1k(&load, o, target, run).await);
        let rss_loud = target.memory().await.rss_bytes;
        if let (Some(a), Some(b)) = (rss_start, rss_loud) {
            growth.push(b as f64 - a as f64);
        }
        eprintln!(
            "bench: run {}/{}: p99 quiet {:.0} us, under attack {:.0} us",
            run + 1,
            o.runs,
            quiet[usize::from(run)].percentile_us(99.0),
            loud[usize::from(run)].percentile_us(99.0)
        );
        drop(held);
        // The next quiet run starts once the server has let the attack go.
        if !released(target).await {
            warnings
                .push("the attack's Decide streams were still open 60 s after it ended".to_owned());
        }
        target.check_alive()?;
    }
    let figures = defences(target).await;
    // The p99 ratio of each run, then their median.
    let ratios: Vec<f64> = quiet
        .iter()
        .zip(&loud)
        .map(|(q, l)| l.percentile_us(99.0) / q.percentile_us(99.0).max(0.001))
        .collect();
    let ratio = median(ratios.clone());
    let (q, l) = (summary(&quiet), summary(&loud));
    if l["errors"].as_u64().unwrap_or(0) > 0 {
        warnings.push(format!(
            "{} of the caller's calls failed under the attack",
            l["errors"]
        ));
    }
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(0.0);
    let most = growth.iter().copied().fold(f64::NAN, f64::max);
    let grown_mib = (!growth.is_empty()).then(|| most / 1024.0 / 1024.0);
    let row = |name: &str, v: &Value| {
        vec![
            name.to_owned(),
            thousands(f(v, "rate")),
            format!("{:.1}", f(v, "p50_us")),
            format!("{:.1}", f(v, "p99_us")),
        ]
    };
    let (lines, _) = render_table(
        &["", "acquire/s", "p50 us", "p99 us"],
        &[row("quiet", &q), row("attack", &l)],
    );
    let mut text = format!(
        "attack{}: {} tokenless connections, {} HEADERS-only calls, {} x {} Decide streams never read\n\n{}\n",
        if store { " (with --store)" } else { "" },
        size.tokenless,
        size.headers_only,
        size.decide_connections,
        size.decide_streams,
        lines.join("\n")
    );
    let each: Vec<String> = ratios.iter().map(|r| format!("x{r:.2}")).collect();
    text.push_str(&format!(
        "\np99 attack/quiet: x{ratio:.2} (median of the runs' ratios: {})\n",
        each.join(", ")
    ));
    if let Some(mib) = grown_mib {
        text.push_str(&format!(
            "server memory under attack: +{mib:.1} MiB (the most of any run, from before the first attack)\n"
        ));
    }
    text.push_str(&format!(
        "the server's own figures after the runs:\n{figures}\n"
    ));
    Ok((
        "attack",
        text,
        json!({
            "size": {
                "tokenless": size.tokenless,
                "headers_only": size.headers_only,
                "decide_connections": size.decide_connections,
                "decide_streams": size.decide_streams,
            },
            "quiet": q,
            "attack": l,
            "store": store,
            "p99_ratio": ratio,
            "p99_ratios": ratios,
            "rss_growth_mib": grown_mib,
        }),
    ))
}
