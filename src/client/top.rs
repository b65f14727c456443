//! `fusebox top`: a live terminal table of keys, refreshed in place.

use std::sync::Arc;

use anyhow::{bail, Context};
use fusebox::proto::v1 as pb;

use super::*;
use crate::ClientOptions;
/// How many recent transitions `top` keeps below the table.
pub(crate) const TOP_RECENT: usize = 5;

/// The terminal while `top` runs: the alternate screen with the cursor
/// hidden and keys read one at a time without echo. Dropping it puts the
/// terminal back as it was, on every way out (quit, signal, error, panic).
pub(crate) struct Screen {
    saved_mode: Option<String>,
}

impl Screen {
    fn enter() -> Screen {
        let saved_mode = stty(&["-g"]).ok().filter(|mode| !mode.is_empty());
        if saved_mode.is_some() {
            // Signals (Ctrl-C) still work; only line editing and echo go.
            let _ = stty(&["-icanon", "-echo", "min", "1", "time", "0"]);
        }
        let _ = write_out("\x1b[?1049h\x1b[?25l\x1b[H\x1b[2J");
        Screen { saved_mode }
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = write_out("\x1b[?25h\x1b[?1049l");
        if let Some(mode) = &self.saved_mode {
            let _ = stty(&[mode]);
        }
    }
}

/// Runs `stty ARGS` on the controlling terminal and returns what it printed.
pub(crate) fn stty(args: &[&str]) -> std::io::Result<String> {
    let tty = std::fs::File::open("/dev/tty")?;
    let output = std::process::Command::new("stty")
        .args(args)
        .stdin(tty)
        .stderr(std::process::Stdio::null())
        .output()?;
    if !output.status.success() {
        return Err(std::io::Error::other("stty failed"));
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// The terminal's size: rows and columns.
pub(crate) fn terminal_size() -> (usize, usize) {
    let from_stty = stty(&["size"]).ok().and_then(|size| {
        let (rows, cols) = size.split_once(' ')?;
        Some((rows.parse().ok()?, cols.parse().ok()?))
    });
    let from_env = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    match from_stty {
        Some((rows, cols)) if rows > 0 && cols > 0 => (rows, cols),
        _ => (from_env("LINES", 24), from_env("COLUMNS", 80)),
    }
}

pub(crate) fn write_out(text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()
}

/// Keys pressed on the terminal, read on a thread of their own (a read
/// blocked on the terminal must never hold up the program's exit).
pub(crate) fn key_presses() -> tokio::sync::mpsc::UnboundedReceiver<u8> {
    use std::io::Read;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    if let Ok(mut tty) = std::fs::File::open("/dev/tty") {
        std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            while let Ok(n @ 1..) = tty.read(&mut buf) {
                for &b in &buf[..n] {
                    if tx.send(b).is_err() {
                        return;
                    }
                }
            }
        });
    }
    rx
}

/// What `top` learns from the server, in the order it arrives.
pub(crate) enum TopNews {
    /// A full read of the keys, or why it failed.
    Keys(Result<Vec<pb::KeyState>, String>),
    /// A transition from the Watch stream.
    Transition(Box<pb::Transition>),
    /// The Watch stream is (again) live or has broken.
    Watching(bool),
}

/// Severity for sorting: the most broken first.
pub(crate) fn severity(phase: i32) -> u8 {
    match pb::Phase::try_from(phase) {
        Ok(pb::Phase::Isolated) => 0,
        Ok(pb::Phase::Open) => 1,
        Ok(pb::Phase::HalfOpen) => 2,
        _ => 3,
    }
}

pub(crate) fn phase_colour(phase: &str) -> &'static str {
    match phase {
        "ISOLATED" => "\x1b[1;35m",
        "OPEN" => "\x1b[1;31m",
        "HALF_OPEN" => "\x1b[1;33m",
        _ => "\x1b[32m",
    }
}

/// What one frame of `top` shows.
pub(crate) struct TopView<'a> {
    server: &'a str,
    prefix: &'a str,
    interval_ms: u64,
    keys: &'a std::collections::BTreeMap<String, pb::KeyState>,
    recent: &'a std::collections::VecDeque<String>,
    error: Option<&'a str>,
    watching: bool,
    colour: bool,
    now: String,
}

/// The lines of one frame of `top`, fitted to `rows` x `cols`.
pub(crate) fn top_frame(view: &TopView<'_>, rows: usize, cols: usize) -> Vec<String> {
    let mut keys: Vec<&pb::KeyState> = view.keys.values().collect();
    keys.sort_by(|a, b| {
        severity(a.phase)
            .cmp(&severity(b.phase))
            .then(requests(b).cmp(&requests(a)))
            .then(a.key.cmp(&b.key))
    });
    let count = |p: pb::Phase| keys.iter().filter(|k| k.phase == p as i32).count();
    let mut title = format!("fusebox top  {}", view.server);
    if !view.prefix.is_empty() {
        title.push_str(&format!("  keys starting with {:?}", view.prefix));
    }
    title.push_str(&format!("  {}", view.now));
    let status = match view.error {
        Some(error) => format!(
            "error: {error} (trying again every {})",
            interval_words(view.interval_ms)
        ),
        None => format!(
            "{} keys: {} isolated, {} open, {} half-open, {} closed   refresh every {}{}   q quits",
            keys.len(),
            count(pb::Phase::Isolated),
            count(pb::Phase::Open),
            count(pb::Phase::HalfOpen),
            count(pb::Phase::Closed),
            interval_words(view.interval_ms),
            if view.watching {
                " and at each transition"
            } else {
                ""
            },
        ),
    };
    let mut plain = vec![title, status, String::new()];
    // (line index, offset and width of the phase cell) to colour.
    let mut coloured: Vec<(usize, usize, String)> = Vec::new();

    let recent_room = if view.recent.is_empty() || rows < 16 {
        0
    } else {
        view.recent.len().min(TOP_RECENT) + 2
    };
    let room = rows.saturating_sub(plain.len() + 1 + recent_room).max(1);
    let owned: Vec<pb::KeyState> = keys.iter().map(|k| (*k).clone()).collect();
    let shown = if owned.len() > room {
        room.saturating_sub(1)
    } else {
        owned.len()
    };
    let (table, widths) = key_table(&owned[..shown], Some(cols));
    let mut table = table.into_iter();
    if let Some(header) = table.next() {
        plain.push(header);
    }
    for (state, line) in owned.iter().zip(table) {
        coloured.push((
            plain.len(),
            widths[0] + 2,
            phase_name(state.phase).to_owned(),
        ));
        plain.push(line);
    }
    if owned.is_empty() {
        plain.push("no keys yet".to_owned());
    } else if shown < owned.len() {
        plain.push(format!("… and {} more keys", owned.len() - shown));
    }
    if recent_room > 0 {
        plain.push(String::new());
        plain.push("recent transitions".to_owned());
        plain.extend(view.recent.iter().take(TOP_RECENT).cloned());
    }
    plain.truncate(rows);
    let mut lines: Vec<String> = plain.iter().map(|l| shorten(l, cols)).collect();
    if view.colour {
        lines[0] = format!("\x1b[1m{}\x1b[0m", lines[0]);
        if view.error.is_some() {
            lines[1] = format!("\x1b[1;31m{}\x1b[0m", lines[1]);
        }
        if let Some(header) = lines.get_mut(3) {
            *header = format!("\x1b[7m{header:<cols$}\x1b[0m");
        }
        for (index, offset, phase) in coloured {
            let Some(line) = lines.get_mut(index) else {
                continue;
            };
            let chars: Vec<char> = line.chars().collect();
            let end = offset + phase.chars().count();
            if chars.len() < end {
                continue;
            }
            let before: String = chars[..offset].iter().collect();
            let after: String = chars[end..].iter().collect();
            *line = format!("{before}{}{phase}\x1b[0m{after}", phase_colour(&phase));
        }
    }
    lines
}

/// What `top` reads each round: the keys that are not CLOSED and the first
/// page of keys, at most 1000 of each, so that a round costs the same with
/// a million keys as with a thousand.
async fn top_keys(
    admin: &mut pb::admin_client::AdminClient<super::Conn>,
    prefix: &str,
) -> anyhow::Result<Vec<pb::KeyState>> {
    let broken = [pb::Phase::Open, pb::Phase::HalfOpen, pb::Phase::Isolated].map(|p| p as i32);
    let mut keys = Pages::new(prefix, &broken, 1000)
        .next(admin)
        .await?
        .unwrap_or_default();
    let first = Pages::new(prefix, &[], 1000).next(admin).await?;
    let seen: std::collections::HashSet<String> = keys.iter().map(|k| k.key.clone()).collect();
    keys.extend(
        first
            .into_iter()
            .flatten()
            .filter(|k| !seen.contains(&k.key)),
    );
    Ok(keys)
}

/// Reads the keys worth showing now and then (or when poked), for `top`.
pub(crate) fn top_poller(
    mut admin: pb::admin_client::AdminClient<super::Conn>,
    prefix: String,
    interval: std::time::Duration,
    news: tokio::sync::mpsc::Sender<TopNews>,
    poke: Arc<tokio::sync::Notify>,
) {
    tokio::spawn(async move {
        let patience = interval.max(std::time::Duration::from_secs(5));
        loop {
            let read = match tokio::time::timeout(patience, top_keys(&mut admin, &prefix)).await {
                Ok(Ok(keys)) => Ok(keys),
                Ok(Err(e)) => Err(format!("{e:#}")),
                Err(_) => Err(format!(
                    "the server did not list its keys within {}",
                    human_ms(patience.as_millis() as u64)
                )),
            };
            if news.send(TopNews::Keys(read)).await.is_err() {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                () = poke.notified() => {}
            }
        }
    });
}

/// Follows the Watch stream for `top`, again after every break.
pub(crate) fn top_watcher(
    mut admin: pb::admin_client::AdminClient<super::Conn>,
    prefix: String,
    interval: std::time::Duration,
    news: tokio::sync::mpsc::Sender<TopNews>,
    poke: Arc<tokio::sync::Notify>,
) {
    tokio::spawn(async move {
        loop {
            if let Ok(response) = admin
                .watch(pb::WatchRequest {
                    prefix: prefix.clone(),
                })
                .await
            {
                let mut stream = response.into_inner();
                if news.send(TopNews::Watching(true)).await.is_err() {
                    return;
                }
                while let Ok(Some(event)) = stream.message().await {
                    let news_item = match event.event {
                        Some(pb::watch_event::Event::Transition(t)) => {
                            TopNews::Transition(Box::new(t))
                        }
                        // Events were missed: read everything again.
                        Some(pb::watch_event::Event::Lagged(_)) => {
                            poke.notify_one();
                            continue;
                        }
                        _ => continue,
                    };
                    if news.send(news_item).await.is_err() {
                        return;
                    }
                }
                if news.send(TopNews::Watching(false)).await.is_err() {
                    return;
                }
            }
            tokio::time::sleep(interval).await;
        }
    });
}

pub(crate) async fn top(
    client: ClientOptions,
    prefix: String,
    interval_ms: u64,
) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    if client.json {
        bail!("top draws a live table and prints no JSON; use `fusebox keys --json` or `fusebox watch --json`");
    }
    if !std::io::stdout().is_terminal() {
        bail!("top draws a live table and needs a terminal; use `fusebox keys` or `fusebox watch` to print to a pipe or a file");
    }
    let mut stop = stop_signal()?;
    let channel = connect(&client).await?;
    let interval = std::time::Duration::from_millis(interval_ms);
    let (tx, mut news) = tokio::sync::mpsc::channel(256);
    let poke = Arc::new(tokio::sync::Notify::new());
    top_poller(
        pb::admin_client::AdminClient::new(channel.clone()),
        prefix.clone(),
        interval,
        tx.clone(),
        poke.clone(),
    );
    top_watcher(
        pb::admin_client::AdminClient::new(channel),
        prefix.clone(),
        interval,
        tx,
        poke.clone(),
    );
    #[cfg(unix)]
    let mut resized =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())?;
    let mut presses = key_presses();
    let mut keyboard = true;
    let colour = std::env::var_os("NO_COLOR").is_none();

    let screen = Screen::enter();
    let mut size = terminal_size();
    let mut keys = std::collections::BTreeMap::new();
    let mut recent = std::collections::VecDeque::new();
    let mut error: Option<String> = None;
    let mut watching = false;
    // Draw at most every 50 ms, however fast transitions come.
    let mut dirty = true;
    let mut clock = tokio::time::interval(std::time::Duration::from_millis(50));
    clock.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_second = String::new();
    let mut last_draw: Option<tokio::time::Instant> = None;
    loop {
        #[cfg(unix)]
        let resize = resized.recv();
        #[cfg(not(unix))]
        let resize = std::future::pending::<Option<()>>();
        tokio::select! {
            () = &mut stop => break,
            key = presses.recv(), if keyboard => match key {
                Some(b'q' | b'Q') => break,
                Some(b'r' | b'R') => poke.notify_one(),
                Some(_) => {}
                None => keyboard = false,
            },
            Some(item) = news.recv() => {
                match item {
                    TopNews::Keys(Ok(read)) => {
                        keys = read.into_iter().map(|k| (k.key.clone(), k)).collect();
                        error = None;
                    }
                    TopNews::Keys(Err(e)) => error = Some(e),
                    TopNews::Transition(t) => {
                        recent.push_front(transition_line(&t));
                        recent.truncate(TOP_RECENT);
                        if let Some(state) = t.state {
                            keys.insert(state.key.clone(), state);
                        }
                    }
                    TopNews::Watching(live) => watching = live,
                }
                dirty = true;
            }
            _ = resize => {
                size = terminal_size();
                let _ = write_out("\x1b[2J");
                dirty = true;
            }
            _ = clock.tick() => {
                // The clock in the header moves every second.
                if now_s() != last_second {
                    dirty = true;
                }
            }
        }
        let due = last_draw.is_none_or(|at| at.elapsed() >= std::time::Duration::from_millis(50));
        if dirty && due {
            last_draw = Some(tokio::time::Instant::now());
            last_second = now_s();
            let view = TopView {
                server: &client.server,
                prefix: &prefix,
                interval_ms,
                keys: &keys,
                recent: &recent,
                error: error.as_deref(),
                watching,
                colour,
                now: last_second.clone(),
            };
            let frame = top_frame(&view, size.0, size.1).join("\x1b[K\r\n");
            write_out(&format!("\x1b[H{frame}\x1b[K\x1b[J"))
                .context("cannot draw on the terminal")?;
            dirty = false;
        }
    }
    drop(screen);
    Ok(())
}
