//! Filling a server with live keys, and the probes that need many keys:
//! listing them all, listing a prefix, scraping the metrics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use fusebox::proto::v1 as pb;
use fusebox::proto::wire::duration_of;
use serde_json::{json, Value};

use crate::channel::{self, Channel};
use crate::load::{Arm, Load, Measurement, SATURATED};
use crate::numbers::{bytes, ms, thousands};
use crate::options::Options;
use crate::report::Report;
use crate::spread::Spread;
use crate::target::{time_scrape, Memory, Target};

/// Keys a fill creates are named `fill/<n>`.
pub(crate) const FILL_PREFIX: &str = "fill/";

/// The page size of the listing probes (the server's largest).
pub(crate) const PAGE_SIZE: i32 = 1000;

/// What a fill did.
#[derive(Debug, Default)]
pub(crate) struct Filled {
    /// Keys asked for.
    pub(crate) asked: u64,
    /// Acquire + Complete(FAILURE) pairs that succeeded: keys created (or
    /// touched again, when they existed).
    pub(crate) created: u64,
    /// Calls that failed with a gRPC status.
    pub(crate) errors: u64,
    /// The first error, in words.
    pub(crate) first_error: Option<String>,
    /// From the first Acquire to the last Complete.
    pub(crate) elapsed: Duration,
}

/// Creates the keys `<prefix><from>` .. `<prefix><from + count - 1>`, each by
/// Acquire + Complete(FAILURE): a failure run of one leaves the key off
/// rest, so the server keeps it. Every caller of `load` takes the next
/// number as soon as its pair is done, so the server gets them as fast as
/// it takes them.
pub(crate) async fn fill(load: &Load, prefix: &'static str, from: u64, count: u64) -> Filled {
    fill_shaped(load, Shape::of(prefix), from, count).await
}

/// How a fill names its keys and what it leaves on them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    /// Keys are `<prefix><n>`.
    pub(crate) prefix: &'static str,
    /// Pads each name with `.` to this many bytes (the longest a key may
    /// be is 256), when set.
    pub(crate) key_bytes: Option<usize>,
    /// Leaves a live ticket on each key (Acquire only, with this lease in
    /// milliseconds) instead of Acquire + Complete FAILURE.
    pub(crate) hold: Option<u64>,
}

impl Shape {
    /// Short names, no ticket left.
    pub(crate) fn of(prefix: &'static str) -> Shape {
        Shape {
            prefix,
            key_bytes: None,
            hold: None,
        }
    }

    /// The name of key `n`.
    pub(crate) fn name(&self, n: u64, into: &mut String) {
        into.clear();
        into.push_str(self.prefix);
        into.push_str(&n.to_string());
        if let Some(len) = self.key_bytes {
            while into.len() < len {
                into.push('.');
            }
        }
    }
}

/// [`fill`] with keys named and left as `shape` says.
pub(crate) async fn fill_shaped(load: &Load, shape: Shape, from: u64, count: u64) -> Filled {
    let next = Arc::new(AtomicU64::new(from));
    let last = from + count;
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for channel in &load.channels {
        for _ in 0..load.in_flight {
            let next = next.clone();
            let mut client = pb::fusebox_client::FuseboxClient::new(channel.clone());
            tasks.spawn(async move {
                let mut done = Filled::default();
                let mut key = String::with_capacity(shape.key_bytes.unwrap_or(24));
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= last {
                        return done;
                    }
                    shape.name(n, &mut key);
                    let result = async {
                        let ticket = client
                            .acquire(pb::AcquireRequest {
                                key: key.clone(),
                                lease: shape.hold.map(duration_of),
                                ..Default::default()
                            })
                            .await?
                            .into_inner()
                            .ticket;
                        if ticket.is_empty() {
                            return Err(tonic::Status::failed_precondition(format!(
                                "{key} was not granted (a policy with a limiter or a \
                                 breaker that is not closed?)"
                            )));
                        }
                        if shape.hold.is_some() {
                            return Ok(());
                        }
                        client
                            .complete(pb::CompleteRequest {
                                ticket,
                                outcome: pb::Outcome::Failure as i32,
                                cost: None,
                            })
                            .await
                            .map(drop)
                    }
                    .await;
                    match result {
                        Ok(_) => done.created += 1,
                        Err(status) => {
                            done.errors += 1;
                            if done.first_error.is_none() {
                                done.first_error =
                                    Some(format!("{:?}: {}", status.code(), status.message()));
                            }
                            // Past a cap, or with the server gone, the rest
                            // would fail alike: stop everyone.
                            if matches!(
                                status.code(),
                                tonic::Code::ResourceExhausted | tonic::Code::Unavailable
                            ) {
                                next.store(last, Ordering::Relaxed);
                            }
                        }
                    }
                }
            });
        }
    }
    let mut total = Filled {
        asked: count,
        ..Filled::default()
    };
    while let Some(done) = tasks.join_next().await {
        if let Ok(done) = done {
            total.created += done.created;
            total.errors += done.errors;
            if total.first_error.is_none() {
                total.first_error = done.first_error;
            }
        }
    }
    total.elapsed = started.elapsed();
    total
}

/// One listing of every key that starts with a prefix.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Listing {
    /// Keys listed.
    pub(crate) keys: u64,
    /// Pages (ListKeys calls) it took.
    pub(crate) pages: u64,
    /// From the first call to the last answer.
    pub(crate) elapsed: Duration,
}

/// Lists every key starting with `prefix`, page by page ([`PAGE_SIZE`]),
/// following `next_page_token`, as `fusebox keys` does.
pub(crate) async fn list_all(channel: Channel, prefix: &str) -> anyhow::Result<Listing> {
    let mut admin =
        pb::admin_client::AdminClient::new(channel).max_decoding_message_size(64 * 1024 * 1024);
    let started = Instant::now();
    let mut listing = Listing {
        keys: 0,
        pages: 0,
        elapsed: Duration::ZERO,
    };
    let mut page_token = String::new();
    loop {
        let page = admin
            .list_keys(pb::ListKeysRequest {
                prefix: prefix.to_owned(),
                phases: Vec::new(),
                page_size: PAGE_SIZE,
                page_token: std::mem::take(&mut page_token),
            })
            .await
            .with_context(|| format!("ListKeys (prefix {prefix:?}) failed"))?
            .into_inner();
        listing.pages += 1;
        listing.keys += page.keys.len() as u64;
        if page.next_page_token.is_empty() {
            listing.elapsed = started.elapsed();
            return Ok(listing);
        }
        if page.keys.is_empty() {
            bail!("ListKeys answered an empty page with a next page token");
        }
        page_token = page.next_page_token;
    }
}

/// Lists every key over and over, page by page, until `until`: the
/// complete listings, and the pages read in all (the last listing may be
/// cut short).
pub(crate) async fn list_until(
    channel: Channel,
    until: Instant,
) -> anyhow::Result<(Vec<Listing>, u64)> {
    let mut admin =
        pb::admin_client::AdminClient::new(channel).max_decoding_message_size(64 * 1024 * 1024);
    let mut listings = Vec::new();
    let mut pages = 0;
    let mut listing = Listing {
        keys: 0,
        pages: 0,
        elapsed: Duration::ZERO,
    };
    let mut started = Instant::now();
    let mut page_token = String::new();
    loop {
        let call = admin.list_keys(pb::ListKeysRequest {
            prefix: String::new(),
            phases: Vec::new(),
            page_size: PAGE_SIZE,
            page_token: std::mem::take(&mut page_token),
        });
        let page = tokio::select! {
            page = call => page.context("ListKeys failed")?.into_inner(),
            () = tokio::time::sleep_until(until.into()) => return Ok((listings, pages)),
        };
        pages += 1;
        listing.pages += 1;
        listing.keys += page.keys.len() as u64;
        if page.next_page_token.is_empty() {
            listing.elapsed = started.elapsed();
            listings.push(listing);
            listing.keys = 0;
            listing.pages = 0;
            started = Instant::now();
        } else {
            page_token = page.next_page_token;
        }
    }
}

/// How many of the numbers `0..n` are written with the decimal prefix `p`.
pub(crate) fn numbers_with_prefix(p: u64, n: u64) -> u64 {
    if p == 0 {
        return u64::from(n > 0);
    }
    let mut count = 0;
    let mut low = p;
    let mut width = 1u64;
    while low < n {
        count += (low + width).min(n) - low;
        match (low.checked_mul(10), width.checked_mul(10)) {
            (Some(l), Some(w)) => {
                low = l;
                width = w;
            }
            _ => break,
        }
    }
    count
}

/// A prefix of the keys `fill/0` .. `fill/<n - 1>` that matches about
/// 1/27 of them (as close as a decimal prefix gets), and how many it
/// matches.
pub(crate) fn probe_prefix(n: u64) -> (String, u64) {
    let goal = (n as f64 / 27.0).max(1.0);
    let distance = |count: u64| (count.max(1) as f64 / goal).ln().abs();
    let best = (1..1000u64)
        .min_by(|a, b| {
            distance(numbers_with_prefix(*a, n)).total_cmp(&distance(numbers_with_prefix(*b, n)))
        })
        .unwrap_or(1);
    (format!("{FILL_PREFIX}{best}"), numbers_with_prefix(best, n))
}

// -------------------------------------------------------------------------
// The fill mode.
// -------------------------------------------------------------------------

/// `fusebox-bench fill`: `keys` live keys named `prefix<n>`, then (with
/// `listing`, and the digits of the prefix to list) the listing probes.
pub(crate) async fn fill_mode(
    o: &Options,
    target: &mut Target,
    keys: u64,
    shape: Shape,
    listing: Option<Option<u64>>,
    warnings: &mut Vec<String>,
) -> anyhow::Result<Report> {
    let load = o.load_on(target).await?;
    let before = target.memory().await;
    eprintln!("bench: filling {keys} keys");
    let filled = fill_shaped(
        &load,
        Shape {
            hold: None,
            ..shape
        },
        0,
        keys,
    )
    .await;
    target.check_alive()?;
    let after = target.memory().await;
    let mut text = fill_text(&filled, &before, &after);
    if let Some(e) = &filled.first_error {
        warnings.push(format!(
            "fill: {} calls failed, the first with {e}",
            filled.errors
        ));
    }
    let mut figures = json!({ "fill": fill_json(&filled, &before, &after) });
    if shape.hold.is_some() {
        // One live ticket on each key just made: what the growth now
        // costs is the tickets' alone.
        eprintln!("bench: taking a ticket on each of the {keys} keys");
        let held = fill_shaped(&load, shape, 0, keys).await;
        target.check_alive()?;
        let with_tickets = target.memory().await;
        if let Some(e) = &held.first_error {
            warnings.push(format!(
                "tickets: {} calls failed, the first with {e}",
                held.errors
            ));
        }
        let mut tickets = fill_json(&held, &after, &with_tickets);
        if let Some(per) = tickets.get("bytes_per_key").cloned() {
            tickets["bytes_per_ticket"] = per;
        }
        text.push_str(&format!(
            "tickets: {} live tickets left on them: {}",
            thousands(held.created as f64),
            fill_text(&held, &after, &with_tickets)
                .replace(
                    "(Acquire + Complete FAILURE)",
                    "(Acquire, the ticket left live)"
                )
                .replace("per key", "per ticket")
        ));
        figures["tickets"] = tickets;
    }
    if let Some(prefix_digits) = listing {
        let (probe_text, probe) =
            listing_probes(o, target, &load, keys, prefix_digits, warnings).await?;
        text.push_str(&probe_text);
        figures["listing"] = probe;
    }
    Ok(("fill", text, figures))
}

/// A fill's figures for `--json`.
pub(crate) fn fill_json(filled: &Filled, before: &Memory, after: &Memory) -> Value {
    let growth = match (before.rss_bytes, after.rss_bytes) {
        (Some(a), Some(b)) => Some(b as f64 - a as f64),
        _ => None,
    };
    json!({
        "keys": filled.asked,
        "created": filled.created,
        "errors": filled.errors,
        "first_error": filled.first_error,
        "seconds": filled.elapsed.as_secs_f64(),
        "pairs_per_s": filled.created as f64 / filled.elapsed.as_secs_f64().max(1e-9),
        "before": before.json(),
        "after": after.json(),
        "rss_growth_bytes": growth,
        "bytes_per_key": growth.map(|g| g / filled.asked.max(1) as f64),
    })
}

/// A fill's figures in words.
pub(crate) fn fill_text(filled: &Filled, before: &Memory, after: &Memory) -> String {
    let secs = filled.elapsed.as_secs_f64().max(1e-9);
    let mut text = format!(
        "fill: {} keys asked, {} created (Acquire + Complete FAILURE) in {secs:.2} s: {} pairs/s, {} errors\n",
        thousands(filled.asked as f64),
        thousands(filled.created as f64),
        thousands(filled.created as f64 / secs),
        filled.errors
    );
    let keys = |m: &Memory| {
        m.keys
            .map_or_else(|| "?".to_owned(), |k| thousands(k as f64))
    };
    match (before.rss_bytes, after.rss_bytes) {
        (Some(a), Some(b)) => {
            let growth = b as f64 - a as f64;
            text.push_str(&format!(
                "server RSS: {} before ({} live keys), {} after ({} live keys): grew {}, {:.0} bytes per key\n",
                bytes(a as f64),
                keys(before),
                bytes(b as f64),
                keys(after),
                bytes(growth),
                growth / filled.asked.max(1) as f64
            ));
        }
        _ => text.push_str(&format!(
            "server RSS unknown (pass --http of a --target server); live keys {} before, {} after\n",
            keys(before),
            keys(after)
        )),
    }
    text
}

/// Lists every key, then a prefix, scrapes /metrics, and measures pair
/// p99 on 1,000 keys without and while listing.
async fn listing_probes(
    o: &Options,
    target: &Target,
    load: &Load,
    keys: u64,
    prefix_digits: Option<u64>,
    warnings: &mut Vec<String>,
) -> anyhow::Result<(String, Value)> {
    let channel = channel::connect(&target.grpc).await?;
    eprintln!("bench: listing every key, {PAGE_SIZE} a page");
    let all = list_all(channel.clone(), "").await?;
    let (prefix, expected) = match prefix_digits {
        Some(digits) => (
            format!("{FILL_PREFIX}{digits}"),
            numbers_with_prefix(digits, keys),
        ),
        None => probe_prefix(keys),
    };
    eprintln!("bench: listing prefix {prefix}");
    let some = list_all(channel.clone(), &prefix).await?;
    let scrape = match &target.http {
        Some(http) => Some(time_scrape(http).await?),
        None => None,
    };
    let (warmup, duration) = (ms(o.warmup), ms(o.duration));
    eprintln!("bench: pair 1k without listing");
    let quiet = load
        .measure(
            Arm::Pair,
            Spread::Thousand,
            warmup,
            duration,
            0,
            target.pid.as_slice(),
        )
        .await;
    eprintln!("bench: pair 1k while listing every key over and over");
    let end = Instant::now() + warmup + duration;
    let lister = tokio::spawn(list_until(channel, end));
    let busy = load
        .measure(
            Arm::Pair,
            Spread::Thousand,
            warmup,
            duration,
            1,
            target.pid.as_slice(),
        )
        .await;
    let (listings, pages) = lister.await.context("the listing task failed")??;
    for m in [&quiet, &busy] {
        if m.client_cpu
            .is_some_and(|c| c / f64::from(o.client_threads) >= SATURATED)
        {
            warnings.push(
                "the load generator's CPU was saturated during the listing probe: its p99 \
                 includes the client's own work of decoding the listings"
                    .to_owned(),
            );
            break;
        }
    }
    let per_s = |l: &Listing| l.keys as f64 / l.elapsed.as_secs_f64().max(1e-9);
    let mut text = format!(
        "\nlist every key: {} keys in {} pages, {:.3} s ({} keys/s)\n\
         list prefix {prefix:?}: {} keys matched (1/{:.0} of the fill; {} expected) in {} pages, {:.3} s\n",
        thousands(all.keys as f64),
        all.pages,
        all.elapsed.as_secs_f64(),
        thousands(per_s(&all)),
        thousands(some.keys as f64),
        keys as f64 / some.keys.max(1) as f64,
        thousands(expected as f64),
        some.pages,
        some.elapsed.as_secs_f64()
    );
    if let Some((took, size)) = scrape {
        text.push_str(&format!(
            "GET /metrics: {:.1} ms, {}\n",
            took.as_secs_f64() * 1e3,
            bytes(size as f64)
        ));
    }
    text.push_str(&format!(
        "pair 1k p99: {:.1} µs without listing, {:.1} µs while listing ({} pages, {} full \
         listings; p999 {:.1} / {:.1} µs; {} / {} pairs/s)",
        quiet.percentile_us(99.0),
        busy.percentile_us(99.0),
        pages,
        listings.len(),
        quiet.percentile_us(99.9),
        busy.percentile_us(99.9),
        thousands(quiet.rate()),
        thousands(busy.rate()),
    ));
    let listing_json =
        |l: &Listing| json!({"keys": l.keys, "pages": l.pages, "seconds": l.elapsed.as_secs_f64()});
    let pair_json = |m: &Measurement| {
        json!({
            "rate": m.rate(),
            "p50_us": m.percentile_us(50.0),
            "p99_us": m.percentile_us(99.0),
            "p999_us": m.percentile_us(99.9),
            "client_cpu": m.client_cpu,
            "server_cpu": m.server_cpu,
            "other_cpu": m.other_cpu(),
            "errors": m.tally.errors,
        })
    };
    let figures = json!({
        "page_size": PAGE_SIZE,
        "all": listing_json(&all),
        "prefix": prefix,
        "prefix_expected": expected,
        "prefix_listing": listing_json(&some),
        "metrics_scrape": scrape.map(|(took, size)| json!({"seconds": took.as_secs_f64(), "bytes": size})),
        "pair_without_listing": pair_json(&quiet),
        "pair_while_listing": pair_json(&busy),
        "listings_during_load": listings.iter().map(listing_json).collect::<Vec<_>>(),
        "pages_during_load": pages,
    });
    Ok((text, figures))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_counts_match_a_brute_count() {
        for n in [0, 1, 9, 10, 11, 99, 100, 1234, 100_000] {
            for p in [0, 1, 2, 12, 37, 99, 123] {
                let brute = (0..n)
                    .filter(|k| k.to_string().starts_with(&p.to_string()))
                    .count() as u64;
                assert_eq!(numbers_with_prefix(p, n), brute, "prefix {p} of 0..{n}");
            }
        }
    }

    #[test]
    fn the_probe_prefix_matches_a_small_share() {
        let (prefix, matched) = probe_prefix(100_000);
        assert!(prefix.starts_with("fill/"));
        assert!(
            (100_000 / 100..=100_000 / 9).contains(&matched),
            "{prefix}: {matched}"
        );
    }
}
