//! The server under test: one the tool starts itself (the `fusebox`
//! binary as `fusebox serve`, optionally pinned with `taskset`) or one
//! already running; and what the tool reads about it from outside: its memory, its
//! live keys and its CPU time.

use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

use crate::numbers::{bytes, thousands};

/// A config for a server the tool starts itself without `--config`: the
/// built-in default policy, with room for every key the spreads and a
/// growth run create (1m and zipf name up to 2,000,000 keys between them;
/// fill adds its own).
const OWN_CONFIG: &str = "\
[server]
max_keys = 4000000
max_tickets = 4000000
";

/// Lines of the server's log kept to explain an early exit.
const LOG_LINES: usize = 40;

/// The server under test.
pub(crate) struct Target {
    /// `http://ADDR` of its gRPC port (of the first server, with several).
    pub(crate) grpc: String,
    /// `ADDR` of its HTTP port (metrics), when known (the first server's).
    pub(crate) http: Option<String>,
    /// The gRPC address of every server: one, or the list `--target`
    /// gives; a load spreads its connections over them round-robin.
    pub(crate) grpcs: Vec<String>,
    /// The HTTP address of every server whose metrics are read (summed).
    pub(crate) https: Vec<String>,
    /// Its process, when the tool started it.
    child: Option<Child>,
    /// The binary it was started from, when the tool started it.
    pub(crate) bin: Option<PathBuf>,
    /// Its process id, when the tool started it.
    pub(crate) pid: Option<u32>,
    /// The last lines it logged.
    log: Arc<Mutex<VecDeque<String>>>,
    /// The config file written for it, removed at the end.
    config_file: Option<std::path::PathBuf>,
}

/// Config files written for servers the tool starts, so that each has its own.
static CONFIGS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl Target {
    /// Servers that are already running: `grpc` and `http` are one
    /// address or a comma-separated list; an address without a scheme gets
    /// `scheme` (`http` or `https`).
    pub(crate) fn existing(grpc: &str, http: Option<&str>, scheme: &str) -> Target {
        let grpcs: Vec<String> = grpc
            .split(',')
            .map(str::trim)
            .filter(|g| !g.is_empty())
            .map(|g| {
                if g.contains("://") {
                    g.to_owned()
                } else {
                    format!("{scheme}://{g}")
                }
            })
            .collect();
        let https: Vec<String> = http
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(|h| {
                h.trim_start_matches("http://")
                    .trim_end_matches('/')
                    .to_owned()
            })
            .collect();
        Target {
            grpc: grpcs.first().cloned().unwrap_or_default(),
            http: https.first().cloned(),
            grpcs,
            https,
            child: None,
            bin: None,
            pid: None,
            log: Arc::default(),
            config_file: None,
        }
    }

    /// Starts `bin` (a fusebox binary) as `fusebox serve` on free ports,
    /// under `taskset -c CPUS` when `cpus` is given, and reads its
    /// addresses from the first lines it prints.
    pub(crate) async fn start(
        bin: &Path,
        config: Option<&Path>,
        cpus: Option<&str>,
    ) -> anyhow::Result<Target> {
        Target::start_with(bin, config, cpus, &[]).await
    }

    /// [`Target::start`], with more arguments for `fusebox serve` (such as
    /// `--store URL`).
    pub(crate) async fn start_with(
        bin: &Path,
        config: Option<&Path>,
        cpus: Option<&str>,
        more: &[String],
    ) -> anyhow::Result<Target> {
        let mut cmd = match cpus {
            Some(cpus) => {
                let mut c = Command::new("taskset");
                c.arg("-c").arg(cpus).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"]);
        cmd.args(more);
        let mut config_file = None;
        match config {
            Some(path) => {
                cmd.arg("--config").arg(path);
            }
            None => {
                let path = std::env::temp_dir().join(format!(
                    "fusebox-bench-{}-{}.toml",
                    std::process::id(),
                    CONFIGS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                ));
                std::fs::write(&path, OWN_CONFIG)
                    .with_context(|| format!("cannot write {}", path.display()))?;
                cmd.arg("--config").arg(&path);
                config_file = Some(path);
            }
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().with_context(|| match cpus {
            Some(_) => "cannot run `taskset` (util-linux) to pin the server".to_owned(),
            None => format!("cannot start {}", bin.display()),
        })?;
        let pid = child.id();
        let log: Arc<Mutex<VecDeque<String>>> = Arc::default();
        if let Some(stderr) = child.stderr.take() {
            let log = log.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
                    if log.len() == LOG_LINES {
                        log.pop_front();
                    }
                    log.push_back(line);
                }
            });
        }
        let mut target = Target {
            grpc: String::new(),
            http: None,
            grpcs: Vec::new(),
            https: Vec::new(),
            child: None,
            bin: Some(bin.to_owned()),
            pid,
            log,
            config_file,
        };
        let stdout = child.stdout.take().context("the server's output")?;
        target.child = Some(child);
        let mut lines = BufReader::new(stdout).lines();
        let mut next = async || {
            tokio::time::timeout(Duration::from_secs(30), lines.next_line())
                .await
                .ok()
                .and_then(Result::ok)
                .flatten()
        };
        let Some(first) = next().await else {
            bail!(
                "the server exited or said nothing before printing its address{}",
                target.log_tail()
            );
        };
        let Some(grpc) = first.strip_prefix("listening on ") else {
            bail!("the server's first line is not `listening on ADDR`: {first:?}");
        };
        target.grpc = format!("http://{grpc}");
        let second = next().await.unwrap_or_default();
        target.http = second.strip_prefix("http on ").map(str::to_owned);
        target.grpcs = vec![target.grpc.clone()];
        target.https = target.http.iter().cloned().collect();
        // Nothing more is expected; keep reading so the server never blocks.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(target)
    }

    /// The last lines the server logged, for an error message.
    pub(crate) fn log_tail(&self) -> String {
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        if log.is_empty() {
            String::new()
        } else {
            let lines: Vec<&str> = log.iter().map(String::as_str).collect();
            format!("; its log ends:\n{}", lines.join("\n"))
        }
    }

    /// Stops a server the tool started: SIGTERM, then waits (at most 10 s,
    /// then kills it). A server it did not start is left alone.
    pub(crate) async fn stop(&mut self) -> anyhow::Result<()> {
        if let Some(path) = self.config_file.take() {
            let _ = std::fs::remove_file(path);
        }
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        if let Some(pid) = child.id() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .status()
                .await;
        }
        match tokio::time::timeout(Duration::from_secs(10), child.wait()).await {
            Ok(status) => {
                let status = status.context("waiting for the server")?;
                if !status.success() {
                    eprintln!(
                        "warning: the server exited with {status}{}",
                        self.log_tail()
                    );
                }
            }
            Err(_) => {
                eprintln!("warning: the server did not stop within 10 s of SIGTERM; killing it");
                child.kill().await.context("killing the server")?;
            }
        }
        Ok(())
    }

    /// The server's memory and live keys: from `/metrics` when the HTTP
    /// port is known (with several servers, each figure summed over them,
    /// and unknown unless every one gives it), the resident set from
    /// `/proc/PID/status` when the metrics do not have it and the tool
    /// started the server.
    pub(crate) async fn memory(&self) -> Memory {
        let mut memory = Memory::default();
        let mut keys = Some(0);
        let mut rss = Some(0);
        for http in &self.https {
            let text = http_get(http, "/metrics").await.ok();
            let read = |name| text.as_deref().and_then(|t| metric(t, name));
            keys = keys.zip(read("fusebox_keys")).map(|(a, b)| a + b);
            rss = rss
                .zip(read("process_resident_memory_bytes"))
                .map(|(a, b)| a + b);
        }
        if !self.https.is_empty() {
            memory.keys = keys;
            if let Some(rss) = rss {
                memory.rss_bytes = Some(rss);
                memory.rss_source = Some("metrics");
            }
        }
        if memory.rss_bytes.is_none() {
            if let Some(rss) = self.pid.and_then(proc_rss) {
                memory.rss_bytes = Some(rss);
                memory.rss_source = Some("proc");
            }
        }
        memory
    }

    /// Fails if a server the tool started has exited.
    pub(crate) fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(child) = &mut self.child {
            if let Ok(Some(status)) = child.try_wait() {
                bail!("the server exited ({status}){}", self.log_tail());
            }
        }
        Ok(())
    }
}

/// The fusebox binary the tool starts servers from: `flag` (`--server-bin`)
/// when given, else the `fusebox` next to this executable (cargo builds
/// both into the same `target/<profile>/`). An error says what to do when
/// it is not there.
pub(crate) fn server_bin(flag: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(path) = flag {
        if !path.is_file() {
            bail!(
                "--server-bin {}: no such file; give the path of a fusebox binary \
                 (cargo builds it as target/release/fusebox)",
                path.display()
            );
        }
        return Ok(path.to_owned());
    }
    let exe = std::env::current_exe().context(
        "cannot find this executable, to find the fusebox beside it: pass --server-bin PATH",
    )?;
    let bin = exe.with_file_name(format!("fusebox{}", std::env::consts::EXE_SUFFIX));
    if !bin.is_file() {
        bail!(
            "no fusebox binary at {}: the tool starts the server under test from the fusebox \
             built next to it; build both (`cargo build --release -p fusebox -p fusebox-bench`), \
             pass --server-bin PATH, or measure a running server with --target http://ADDR",
            bin.display()
        );
    }
    Ok(bin)
}

/// What the tool knows of the server's memory at one moment.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Memory {
    /// Its resident set, in bytes.
    pub(crate) rss_bytes: Option<u64>,
    /// Where that figure came from: `metrics` or `proc`.
    pub(crate) rss_source: Option<&'static str>,
    /// Its live keys (`fusebox_keys`).
    pub(crate) keys: Option<u64>,
}

impl Memory {
    /// The figures in words, for the end of a report.
    pub(crate) fn line(&self) -> String {
        let rss = self.rss_bytes.map_or_else(
            || "unknown (pass --http of a --target server)".to_owned(),
            |b| bytes(b as f64),
        );
        let source = match self.rss_source {
            Some("metrics") => " (process_resident_memory_bytes)",
            Some("proc") => " (VmRSS of /proc/PID/status)",
            _ => "",
        };
        let keys = self
            .keys
            .map_or_else(|| "unknown".to_owned(), |k| thousands(k as f64));
        let per_key = self
            .bytes_per_key()
            .map_or_else(String::new, |b| format!(", {b:.0} bytes per key"));
        format!("server memory: RSS {rss}{source}, {keys} live keys{per_key}")
    }

    /// The figures as JSON.
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "rss_bytes": self.rss_bytes,
            "rss_source": self.rss_source,
            "keys": self.keys,
            "bytes_per_key": self.bytes_per_key(),
        })
    }

    /// Resident bytes per live key.
    pub(crate) fn bytes_per_key(&self) -> Option<f64> {
        match (self.rss_bytes, self.keys) {
            (Some(rss), Some(keys)) if keys > 0 => Some(rss as f64 / keys as f64),
            _ => None,
        }
    }
}

/// The value of an unlabelled sample in Prometheus text.
pub(crate) fn metric(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?.strip_prefix(' ')?;
        let value: f64 = rest.split_whitespace().next()?.parse().ok()?;
        Some(value as u64)
    })
}

/// A process's resident set from `/proc/PID/status` (VmRSS), in bytes.
fn proc_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// User plus system CPU time of every thread of a process, from a
/// `/proc/.../stat` file (in clock ticks of 1/100 s, as Linux reports them
/// to user space).
pub(crate) fn cpu_time(path: &str) -> Option<Duration> {
    let stat = std::fs::read_to_string(path).ok()?;
    // The command name, in parentheses, may hold spaces: count after it.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Duration::from_millis((utime + stime) * 10))
}

/// CPU time every process of the machine has used, idle excluded, from
/// `/proc/stat` (in ticks of 1/100 s).
pub(crate) fn machine_busy_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal ...: all but idle and
    // iowait are work; guest time is already in user.
    let busy: u64 = ticks.iter().take(8).sum::<u64>() - ticks.get(3)? - ticks.get(4)?;
    Some(Duration::from_millis(busy * 10))
}

/// The CPU time this process has used.
pub(crate) fn own_cpu_time() -> Option<Duration> {
    cpu_time("/proc/self/stat")
}

/// `GET path` over HTTP/1.0 (so the answer is never chunked) from `addr`;
/// the body of a 200 answer.
pub(crate) async fn http_get(addr: &str, path: &str) -> anyhow::Result<String> {
    let mut stream =
        tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
            .await
            .with_context(|| format!("connecting to {addr} timed out"))?
            .with_context(|| format!("cannot reach the HTTP port at {addr}"))?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), stream.read_to_end(&mut answer))
        .await
        .with_context(|| format!("GET {path} took more than 60 s"))??;
    let answer = String::from_utf8_lossy(&answer);
    let Some((head, body)) = answer.split_once("\r\n\r\n") else {
        bail!("GET {path}: not an HTTP answer");
    };
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        bail!("GET {path}: {status}");
    }
    Ok(body.to_owned())
}

/// The time one `GET /metrics` takes, and the size of the answer.
pub(crate) async fn time_scrape(addr: &str) -> anyhow::Result<(Duration, usize)> {
    let started = Instant::now();
    let body = http_get(addr, "/metrics").await?;
    Ok((started.elapsed(), body.len()))
}

/// The CPUs of a `taskset`-style list: `1`, `0,2`, `0-3`.
pub(crate) fn parse_cpu_list(text: &str) -> Result<Vec<usize>, String> {
    let mut cpus = Vec::new();
    for part in text.split(',').map(str::trim) {
        let bad = || format!("{part:?} is not a CPU number or range, e.g. 1, 0,2 or 0-3");
        match part.split_once('-') {
            Some((a, b)) => {
                let a: usize = a.parse().map_err(|_| bad())?;
                let b: usize = b.parse().map_err(|_| bad())?;
                if a > b {
                    return Err(bad());
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().map_err(|_| bad())?),
        }
    }
    if cpus.is_empty() {
        return Err("no CPUs given".to_owned());
    }
    Ok(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_as_taskset_reads_them() {
        assert_eq!(parse_cpu_list("1"), Ok(vec![1]));
        assert_eq!(parse_cpu_list("0,2"), Ok(vec![0, 2]));
        assert_eq!(parse_cpu_list("0-3"), Ok(vec![0, 1, 2, 3]));
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("x").is_err());
    }

    #[test]
    fn metrics_are_read_by_exact_name() {
        let text = "# TYPE fusebox_keys gauge\nfusebox_keys_forgotten_total 3\nfusebox_keys 12\n\
                    process_resident_memory_bytes 1.5e6\n";
        assert_eq!(metric(text, "fusebox_keys"), Some(12));
        assert_eq!(
            metric(text, "process_resident_memory_bytes"),
            Some(1_500_000)
        );
        assert_eq!(metric(text, "fusebox_tickets"), None);
    }

    #[test]
    fn this_process_has_cpu_time() {
        assert!(own_cpu_time().is_some());
    }
}
