//! Config reload: on SIGHUP and whenever the file's content changes. An
//! invalid file keeps the running config and says why, in the log and in
//! the reload-failure counter (Y2, Y4).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::node::Node;
use crate::tls::Hangup;

/// How often the config file is checked for changes.
pub const POLL_EVERY: Duration = Duration::from_millis(250);

/// How long a changed file must stay the same before it is reloaded, so
/// that a file caught while being written (truncated, half written) is not
/// taken for the new config.
pub const SETTLE: Duration = Duration::from_millis(50);

/// Reloads the config from `path` into `node`; on an invalid file the
/// running config stays. Returns whether the new config was applied.
pub fn reload(node: &Node, path: &Path, why: &str) -> bool {
    match Config::load(path) {
        Ok(config) => {
            if config.limits != node.limits() {
                tracing::warn!(
                    file = %path.display(),
                    "[server] limits changed in the config file; they take effect when the server restarts"
                );
            }
            if config.telemetry.as_ref() != node.telemetry().map(|t| t.config()) {
                tracing::warn!(
                    file = %path.display(),
                    "[telemetry] changed in the config file; it takes effect when the server restarts"
                );
            }
            let rules = config.rules.rules.len();
            // A reload replaces every rule, those set at run time too.
            node.store().reload_rules(config.rules);
            node.set_rls(config.rls);
            set_access(node, config.access, path);
            node.count_reload(true);
            tracing::info!(file = %path.display(), rules, "config reloaded ({why}): keys adopt the new policies at their next operation");
            true
        }
        Err(e) => {
            node.count_reload(false);
            tracing::error!(file = %path.display(), "config not reloaded ({why}), the running config stays: {e}");
            false
        }
    }
}

/// Adopts a reloaded `[auth]`. Removing the section at run time would
/// open the server to anyone, so it takes a restart: the running
/// credentials stay.
fn set_access(node: &Node, access: Option<crate::auth::Access>, path: &Path) {
    let current = node.access();
    match access {
        Some(access) => {
            let (tokens, clients) = access.sizes();
            if current.as_deref() != Some(&access) {
                tracing::info!(file = %path.display(), tokens, client_names = clients, "[auth] reloaded: new credentials apply to the next request");
            }
            node.set_access(Some(Arc::new(access)));
        }
        None if current.is_some() => tracing::warn!(
            file = %path.display(),
            "[auth] was removed from the config file; the running credentials stay until the server restarts (removing authentication is never done at run time)"
        ),
        None => {}
    }
}

/// The files a reload reads: the config and, if `[auth]` names one, the
/// token file.
fn watched_files(node: &Node, path: &Path) -> Vec<PathBuf> {
    let mut files = vec![path.to_path_buf()];
    if let Some(file) = node.access().and_then(|a| a.token_file.clone()) {
        files.push(file);
    }
    files
}

/// The content of every watched file; `None` when the config itself
/// cannot be read (a missing token file reads as empty, so that its
/// return is noticed).
async fn read_all(files: &[PathBuf]) -> Option<Vec<Vec<u8>>> {
    let mut out = Vec::with_capacity(files.len());
    for (i, file) in files.iter().enumerate() {
        match tokio::fs::read(file).await {
            Ok(bytes) => out.push(bytes),
            Err(_) if i > 0 => out.push(Vec::new()),
            Err(_) => return None,
        }
    }
    Some(out)
}

/// Reloads `path` into `node` on SIGHUP and when its content changes;
/// runs until the task is dropped.
///
/// The SIGHUP handler is installed and the file read before this returns,
/// so that a signal or an edit right after start-up is not missed (nor does
/// SIGHUP's default action end the process). Call it within a runtime.
pub fn watch_config(node: Arc<Node>, path: PathBuf) -> impl std::future::Future<Output = ()> {
    let seen = watched_files(&node, &path)
        .iter()
        .map(std::fs::read)
        .collect::<Result<Vec<_>, _>>()
        .ok();
    watch(node, path, seen, Hangup::install())
}

async fn watch(node: Arc<Node>, path: PathBuf, mut seen: Option<Vec<Vec<u8>>>, mut hangup: Hangup) {
    loop {
        tokio::select! {
            () = hangup.next() => {
                reload(&node, &path, "SIGHUP");
                seen = read_all(&watched_files(&node, &path)).await;
            }
            () = tokio::time::sleep(POLL_EVERY) => {
                let files = watched_files(&node, &path);
                let now = read_all(&files).await;
                if now.is_some() && now != seen {
                    tokio::time::sleep(SETTLE).await;
                    if read_all(&files).await != now {
                        continue; // still being written: look again at the next poll
                    }
                    reload(&node, &path, "the file changed");
                    // The token file may have been named or renamed.
                    seen = read_all(&watched_files(&node, &path)).await;
                }
            }
        }
    }
}
