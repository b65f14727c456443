//! Outside tools some tests need: Chromium and Node with playwright-core
//! (the dashboard), the Python Prometheus parser (/metrics), tmux
//! (`fusebox top`). A plain `cargo test` on a machine without one of them
//! skips the tests that need it, saying so on standard output;
//! `./scripts/test` sets `FUSEBOX_TEST_REQUIRE_TOOLS=1` (and installs the
//! tools), under which a missing tool fails the test instead, so that CI
//! never skips silently.

use std::path::{Path, PathBuf};

// One rule for every missing tool, and one way to run one quietly, as
// the Redis module's tests have.
use crate::redis_harness::{missing, spawn};

/// True when `program args...` runs and exits 0.
fn runs(program: &Path, args: &[&str]) -> bool {
    spawn(program, args)
        .and_then(|mut child| child.wait())
        .is_ok_and(|s| s.success())
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A Python with `prometheus_client`: `FUSEBOX_TEST_PYTHON`, else the
/// virtualenv `./scripts/test` makes at `target/venv`.
pub fn python(test: &str) -> Option<PathBuf> {
    let python = std::env::var_os("FUSEBOX_TEST_PYTHON")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/venv/bin/python"));
    if runs(&python, &["-c", "import prometheus_client.parser"]) {
        Some(python)
    } else {
        missing(
            test,
            &format!(
                "no Python with prometheus_client at {} (set FUSEBOX_TEST_PYTHON, or: \
                 python3 -m venv target/venv && target/venv/bin/pip install prometheus_client==0.21.1)",
                python.display()
            ),
        )
    }
}

/// Chromium and the playwright-core driver in `tests/dashboard`:
/// `(chromium, driver directory)`.
pub fn browser(test: &str) -> Option<(PathBuf, PathBuf)> {
    let chromium = std::env::var_os("FUSEBOX_TEST_CHROMIUM")
        .filter(|c| !c.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    if !chromium.exists() {
        return missing(
            test,
            &format!(
                "no Chromium at {} (apt-get install chromium, or set FUSEBOX_TEST_CHROMIUM)",
                chromium.display()
            ),
        );
    }
    if !runs(Path::new("node"), &["--version"]) {
        return missing(test, "no node on PATH (apt-get install nodejs)");
    }
    let driver = root().join("tests/dashboard");
    if !driver.join("node_modules/playwright-core").exists() {
        return missing(test, "no playwright-core: run `npm ci` in tests/dashboard");
    }
    Some((chromium, driver))
}

/// True when tmux runs.
pub fn tmux(test: &str) -> bool {
    runs(Path::new("tmux"), &["-V"])
        || missing::<()>(test, "no tmux on PATH (apt-get install tmux)").is_some()
}

/// The Rust client tool, `examples/client_tool.rs`, as cargo built it next
/// to this test binary (`target/<profile>/examples/client_tool`): `cargo
/// test` builds the examples, `cargo test --test suite` does not.
pub fn client_tool(test: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test binary is in target/<profile>/deps");
    let tool = profile
        .join("examples/client_tool")
        .with_extension(std::env::consts::EXE_EXTENSION);
    if tool.exists() {
        Some(tool)
    } else {
        missing(
            test,
            &format!(
                "no client tool at {} (cargo build --example client_tool, or a plain cargo test)",
                tool.display()
            ),
        )
    }
}
