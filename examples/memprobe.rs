use fusebox::domain::Outcome;
use fusebox::engine::{AcquireArgs, Config, Engine};
fn rss() -> u64 { std::fs::read_to_string("/proc/self/status").unwrap().lines().find(|l| l.starts_with("VmRSS")).unwrap().split_whitespace().nth(1).unwrap().parse::<u64>().unwrap()*1024 }
#[tokio::main(flavor="current_thread")]
async fn main() {
    let n: usize = std::env::args().nth(1).map(|s| s.parse().unwrap()).unwrap_or(1_000_000);
    let engine = Engine::with_system_clock(Config::default());
    let before = rss();
    let t = std::time::Instant::now();
    for i in 0..n {
        let r = engine.acquire(AcquireArgs{ key: format!("fill/{i}"), permits: 1, max_wait: 0, lease: None}).await.unwrap();
        engine.complete(&r.ticket.unwrap(), Outcome::Failure).unwrap();
    }
    let el = t.elapsed();
    let after = rss();
    println!("keys {} rss grew {} bytes/key; {:?} per pair", engine.counts().keys, (after-before) as f64 / n as f64, el / n as u32);
    let t = std::time::Instant::now();
    let mut after_key: Option<String> = None; let mut seen = 0;
    loop { let p = engine.list_page("", &[], after_key.as_deref(), 1000); seen += p.readings.len(); after_key = p.readings.last().map(|r| r.key.clone()); if !p.more {break} }
    println!("listed {seen} in {:?}", t.elapsed());
    let t = std::time::Instant::now();
    let p = engine.list("fill/12", &[], None, 1000); 
    println!("prefix page {} in {:?}", p.0.len(), t.elapsed());
    let t = std::time::Instant::now(); let tt = engine.totals(); let b = engine.busiest(100);
    println!("totals {:?} busiest {} in {:?}", tt.keys, b.len(), t.elapsed());
}
