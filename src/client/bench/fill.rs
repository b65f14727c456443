//! Filling a server with live keys, and the probes that need many keys:
//! listing them all, listing a prefix, scraping the metrics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::load::Channel;
use anyhow::{bail, Context};
use fusebox::proto::v1 as pb;

use super::load::Load;

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
                let mut key = String::with_capacity(24);
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= last {
                        return done;
                    }
                    key.clear();
                    key.push_str(prefix);
                    key.push_str(&n.to_string());
                    let result = async {
                        let ticket = client
                            .acquire(pb::AcquireRequest {
                                key: key.clone(),
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
                        client
                            .complete(pb::CompleteRequest {
                                ticket,
                                outcome: pb::Outcome::Failure as i32,
                            })
                            .await
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
