//! What a run prints: a mode's report and warnings on standard output,
//! and with `--json FILE` every figure, the settings, the command line
//! and the git commit.

use anyhow::Context;
use serde_json::{json, Value};

use crate::options::Options;
use crate::target::Target;

/// Prints a mode's report and warnings, and writes `--json`.
pub(crate) fn report(
    o: &Options,
    target: Option<&Target>,
    mode: &str,
    text: &str,
    figures: Value,
    warnings: &[String],
) -> anyhow::Result<()> {
    println!("{text}");
    for w in warnings {
        println!("warning: {w}");
    }
    if let Some(path) = &o.json {
        let doc = json!({
            "tool": "fusebox-bench",
            "version": env!("CARGO_PKG_VERSION"),
            "mode": mode,
            "command_line": std::env::args().collect::<Vec<_>>(),
            "git_commit": git_commit(),
            "started_at": fusebox_cli::print::now_s(),
            "settings": settings_json(o, target),
            "warnings": warnings,
            "figures": figures,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("bench: figures written to {}", path.display());
    }
    Ok(())
}

/// A mode's name, its report for people, and its figures for `--json`.
pub(crate) type Report = (&'static str, String, Value);

/// The settings of a run, as `--json` records them.
fn settings_json(o: &Options, target: Option<&Target>) -> Value {
    json!({
        "target": target.map(|t| t.grpcs.join(",")),
        "targets": target.map(|t| &t.grpcs),
        "http": target.map(|t| t.https.join(",")).filter(|h| !h.is_empty()),
        "server_started_by_tool": target.is_some() && o.target.is_none(),
        "server_bin": target.and_then(|t| t.bin.as_ref()),
        "config": o.config,
        "server_cpus": o.server_cpus,
        "client_cpus": o.client_cpus,
        "client_threads": o.client_threads,
        "connections": o.connections,
        "in_flight": o.in_flight,
        "warmup_ms": o.warmup,
        "duration_ms": o.duration,
        "runs": o.runs,
        "arms": o.arms.iter().map(|a| a.name()).collect::<Vec<_>>(),
        "spreads": o.spreads.iter().map(|s| s.name()).collect::<Vec<_>>(),
        "stalled_watchers": o.stalled_watchers,
        "frames": o.frames,
        "rate": o.rate,
        "throttlecrab": o.throttlecrab,
        "ratelimit": o.ratelimit,
        "peer_pids": o.peer_pids,
        "target_pids": o.target_pids,
    })
}

/// The commit of the working directory's git checkout, `-dirty` when
/// tracked files changed; none outside a checkout.
fn git_commit() -> Option<String> {
    let run = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .stderr(std::process::Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let commit = run(&["rev-parse", "HEAD"])?;
    let dirty =
        run(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    Some(if dirty {
        format!("{commit}-dirty")
    } else {
        commit
    })
}
