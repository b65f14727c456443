//! The pure decision, measured: one acquire and its complete, on one key and
//! spread over 100,000 keys in a plain map. A baseline in the same run (the
//! map lookup with a counter bump instead of the decision) gives a ratio
//! that means something on a shared, noisy machine.
//!
//! Run: `cargo bench --bench decision`

use std::collections::HashMap;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use fusebox::domain::{Ask, Fuse, Outcome, PolicySpec, TicketId};

fn policy() -> fusebox::domain::Policy {
    let spec: PolicySpec = toml::from_str(
        r#"
        breaker = { mode = "ratio", failure_ratio = 0.5, minimum_throughput = 20, sampling_window = "10s", break = "5s" }
        limiter = { kind = "concurrency", permits = 64, queue_limit = 128 }
        "#,
    )
    .expect("a valid policy");
    spec.validate().expect("a valid policy")
}

fn pair(fuse: &mut Fuse, id: u128, now: u64) {
    let decision = fuse
        .acquire(&Ask::default(), TicketId(id), now)
        .expect("acquire");
    // About one call in ten fails, spread so that no key trips: the high
    // bits of a multiplicative hash of the id, not a residue of it.
    let hashed = (id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 64) as u64;
    let outcome = if hashed.is_multiple_of(10) {
        Outcome::Failure
    } else {
        Outcome::Success
    };
    let grant = decision
        .grant()
        .expect("the policy never trips at this failure rate");
    black_box(fuse.complete(grant.ticket, outcome, now).expect("complete"));
}

fn bench(c: &mut Criterion) {
    let policy = policy();
    let mut group = c.benchmark_group("acquire+complete");

    let mut one = Fuse::new(policy, 0);
    let mut id = 0u128;
    group.bench_function("one key", |b| {
        b.iter(|| {
            id += 1;
            pair(&mut one, id, (id / 1000) as u64);
        })
    });

    const KEYS: usize = 100_000;
    let names: Vec<String> = (0..KEYS).map(|i| format!("dep/{i}")).collect();
    let mut fuses: HashMap<String, Fuse> = names
        .iter()
        .map(|n| (n.clone(), Fuse::new(policy, 0)))
        .collect();
    let mut i = 0usize;
    group.bench_function("100k keys", |b| {
        b.iter(|| {
            i = (i + 7919) % KEYS;
            id += 1;
            let fuse = fuses.get_mut(&names[i]).expect("a key");
            pair(fuse, id, (id / 1000) as u64);
        })
    });

    let mut counters: HashMap<String, u64> = names.iter().map(|n| (n.clone(), 0)).collect();
    group.bench_function("baseline: 100k-key lookup only", |b| {
        b.iter(|| {
            i = (i + 7919) % KEYS;
            *counters.get_mut(&names[i]).expect("a key") += 1;
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
