//! `fusebox top`: a live terminal table of keys, refreshed in place.
//!
//! The terminal is driven through crossterm: raw mode (keys one at a time,
//! no echo, Ctrl-C a key like any other), the alternate screen, the
//! cursor hidden. A screen guard puts it back as it was on every way out: q,
//! Ctrl-C, a signal, an error, and a panic (through the panic hook, which
//! restores it before the message is printed).

use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Once};
use std::time::Duration;

use anyhow::{bail, Context};
use crossterm::event::{Event, EventStream, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use crossterm::style::{Print, Stylize};
use crossterm::terminal::{self, ClearType};
use crossterm::{cursor, execute, queue};
use fusebox_proto::v1 as pb;
use tokio_stream::StreamExt;

use crate::connect::{connect, ClientOptions, Conn};
use crate::keys::Pages;
use crate::print::{human_ms, interval_words, now_s, phase_name, requests, transition_line};
use crate::signal::stop_signal;
use crate::table::{key_table, shorten};

/// How many recent transitions `top` keeps below the table.
const TOP_RECENT: usize = 5;

/// Whether `top` holds the terminal (raw mode, alternate screen): set by
/// [`Screen::enter`], cleared by [`restore`], whichever of the screen's
/// drop and the panic hook comes first.
static ON_SCREEN: AtomicBool = AtomicBool::new(false);

/// The terminal while `top` runs: raw mode, the alternate screen, the
/// cursor hidden. Dropping it puts the terminal back as it was.
struct Screen;

impl Screen {
    fn enter() -> anyhow::Result<Screen> {
        restore_on_panic();
        terminal::enable_raw_mode().context(
            "cannot put the terminal in raw mode; use `fusebox keys` or `fusebox watch` instead",
        )?;
        ON_SCREEN.store(true, Ordering::SeqCst);
        // From here on, every way out drops the screen and restores.
        let screen = Screen;
        execute!(
            std::io::stdout(),
            terminal::EnterAlternateScreen,
            cursor::Hide,
            terminal::Clear(ClearType::All)
        )
        .context("cannot draw on the terminal")?;
        Ok(screen)
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        restore();
    }
}

/// Puts the terminal back (cursor shown, normal screen, the mode it had)
/// if `top` holds it; once, however many ways out call it.
fn restore() {
    if ON_SCREEN.swap(false, Ordering::SeqCst) {
        let _ = execute!(
            std::io::stdout(),
            cursor::Show,
            terminal::LeaveAlternateScreen
        );
        let _ = terminal::disable_raw_mode();
    }
}

/// Installs, once, a panic hook that restores the terminal before the
/// previous hook prints the panic's message (which the alternate screen
/// would otherwise swallow, and raw mode garble).
fn restore_on_panic() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            previous(info);
        }));
    });
}

/// The terminal's size: rows and columns (`LINES` and `COLUMNS`, or 24 x
/// 80, when the terminal does not say).
fn terminal_size() -> (usize, usize) {
    let from_env = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    match terminal::size() {
        Ok((cols, rows)) if rows > 0 && cols > 0 => (usize::from(rows), usize::from(cols)),
        _ => (from_env("LINES", 24), from_env("COLUMNS", 80)),
    }
}

/// What a key pressed asks of `top`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Press {
    /// q, Q or Ctrl-C: quit.
    Quit,
    /// r or R: read the keys again now.
    Refresh,
    /// Anything else.
    Nothing,
}

fn press(key: KeyEvent) -> Press {
    if key.kind != KeyEventKind::Press {
        return Press::Nothing;
    }
    match key.code {
        KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => Press::Quit,
        KeyCode::Char('q' | 'Q') => Press::Quit,
        KeyCode::Char('r' | 'R') => Press::Refresh,
        _ => Press::Nothing,
    }
}

/// What `top` learns from the server, in the order it arrives.
enum TopNews {
    /// A full read of the keys, or why it failed.
    Keys(Result<Vec<pb::KeyState>, String>),
    /// A transition from the Watch stream.
    Transition(Box<pb::Transition>),
    /// The Watch stream is (again) live or has broken.
    Watching(bool),
}

/// Severity for sorting: the most broken first.
fn severity(phase: i32) -> u8 {
    match pb::Phase::try_from(phase) {
        Ok(pb::Phase::Isolated) => 0,
        Ok(pb::Phase::Open) => 1,
        Ok(pb::Phase::HalfOpen) => 2,
        _ => 3,
    }
}

/// A phase's cell in its colour: ISOLATED magenta, OPEN red, HALF_OPEN
/// yellow (each bold), CLOSED green.
fn paint_phase(phase: &str) -> String {
    match phase {
        "ISOLATED" => phase.magenta().bold().to_string(),
        "OPEN" => phase.red().bold().to_string(),
        "HALF_OPEN" => phase.yellow().bold().to_string(),
        _ => phase.green().to_string(),
    }
}

/// What one frame of `top` shows.
struct TopView<'a> {
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
fn top_frame(view: &TopView<'_>, rows: usize, cols: usize) -> Vec<String> {
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
        lines[0] = lines[0].as_str().bold().to_string();
        if view.error.is_some() {
            lines[1] = lines[1].as_str().red().bold().to_string();
        }
        if let Some(header) = lines.get_mut(3) {
            *header = format!("{header:<cols$}").reverse().to_string();
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
            *line = format!("{before}{}{after}", paint_phase(&phase));
        }
    }
    lines
}

/// What `top` reads each round: the keys that are not CLOSED and the first
/// page of keys, at most 1000 of each, so that a round costs the same with
/// a million keys as with a thousand.
async fn top_keys(
    admin: &mut pb::admin_client::AdminClient<Conn>,
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

/// What feeds `top`'s table: a connection, the keys asked for, how often
/// to read them, where to send what it learns, and the poke that asks for
/// a read now.
#[derive(Clone)]
struct Feed {
    admin: pb::admin_client::AdminClient<Conn>,
    prefix: String,
    interval: std::time::Duration,
    news: tokio::sync::mpsc::Sender<TopNews>,
    poke: Arc<tokio::sync::Notify>,
}

impl Feed {
    /// Reads the keys worth showing now and then (or when poked), for
    /// `top`.
    fn poll(mut self) {
        tokio::spawn(async move {
            let patience = self.interval.max(std::time::Duration::from_secs(5));
            loop {
                let read =
                    match tokio::time::timeout(patience, top_keys(&mut self.admin, &self.prefix))
                        .await
                    {
                        Ok(Ok(keys)) => Ok(keys),
                        Ok(Err(e)) => Err(format!("{e:#}")),
                        Err(_) => Err(format!(
                            "the server did not list its keys within {}",
                            human_ms(patience.as_millis() as u64)
                        )),
                    };
                if self.news.send(TopNews::Keys(read)).await.is_err() {
                    return;
                }
                tokio::select! {
                    () = tokio::time::sleep(self.interval) => {}
                    () = self.poke.notified() => {}
                }
            }
        });
    }

    /// Follows the Watch stream for `top`, again after every break.
    fn watch(mut self) {
        tokio::spawn(async move {
            loop {
                if let Ok(response) = self
                    .admin
                    .watch(pb::WatchRequest {
                        prefix: self.prefix.clone(),
                    })
                    .await
                {
                    let mut stream = response.into_inner();
                    if self.news.send(TopNews::Watching(true)).await.is_err() {
                        return;
                    }
                    while let Ok(Some(event)) = stream.message().await {
                        let news_item = match event.event {
                            Some(pb::watch_event::Event::Transition(t)) => {
                                TopNews::Transition(Box::new(t))
                            }
                            // Events were missed: read everything again.
                            Some(pb::watch_event::Event::Lagged(_)) => {
                                self.poke.notify_one();
                                continue;
                            }
                            _ => continue,
                        };
                        if self.news.send(news_item).await.is_err() {
                            return;
                        }
                    }
                    if self.news.send(TopNews::Watching(false)).await.is_err() {
                        return;
                    }
                }
                tokio::time::sleep(self.interval).await;
            }
        });
    }
}

/// `fusebox top`: a live table of the keys that start with `prefix`,
/// read every `interval_ms` and at each transition, the most broken
/// first, until q, Ctrl-C or a signal.
pub async fn top(client: ClientOptions, prefix: String, interval_ms: u64) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    if client.json {
        bail!("top draws a live table and prints no JSON; use `fusebox keys --json` or `fusebox watch --json`");
    }
    if !std::io::stdout().is_terminal() {
        bail!("top draws a live table and needs a terminal; use `fusebox keys` or `fusebox watch` to print to a pipe or a file");
    }
    let mut stop = stop_signal()?;
    let channel = connect(&client).await?;
    let interval = Duration::from_millis(interval_ms);
    let (tx, mut news) = tokio::sync::mpsc::channel(256);
    let poke = Arc::new(tokio::sync::Notify::new());
    let feed = Feed {
        admin: pb::admin_client::AdminClient::new(channel),
        prefix: prefix.clone(),
        interval,
        news: tx,
        poke: poke.clone(),
    };
    feed.clone().poll();
    feed.watch();
    let colour = std::env::var_os("NO_COLOR").is_none();

    let screen = Screen::enter()?;
    let mut events = EventStream::new();
    let mut keyboard = true;
    let mut size = terminal_size();
    let mut keys = BTreeMap::new();
    let mut recent = VecDeque::new();
    let mut error: Option<String> = None;
    let mut watching = false;
    // Draw at most every 50 ms, however fast transitions come.
    let mut dirty = true;
    let mut clock = tokio::time::interval(Duration::from_millis(50));
    clock.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_second = String::new();
    let mut last_draw: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            () = &mut stop => break,
            event = events.next(), if keyboard => match event {
                Some(Ok(Event::Key(key))) => match press(key) {
                    Press::Quit => break,
                    Press::Refresh => poke.notify_one(),
                    Press::Nothing => {}
                },
                Some(Ok(Event::Resize(cols, rows))) => {
                    size = (usize::from(rows), usize::from(cols));
                    queue!(std::io::stdout(), terminal::Clear(ClearType::All))
                        .context("cannot draw on the terminal")?;
                    dirty = true;
                }
                Some(Ok(_)) => {}
                // The terminal can no longer be read: q is gone, Ctrl-C
                // and signals still stop top.
                Some(Err(_)) | None => keyboard = false,
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
            _ = clock.tick() => {
                // The clock in the header moves every second.
                if now_s() != last_second {
                    dirty = true;
                }
            }
        }
        if !ON_SCREEN.load(Ordering::SeqCst) {
            // A task of top's panicked, and the hook gave the terminal back.
            bail!("top stopped after the internal error printed above; please report it");
        }
        let due = last_draw.is_none_or(|at| at.elapsed() >= Duration::from_millis(50));
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
            draw(&top_frame(&view, size.0, size.1)).context("cannot draw on the terminal")?;
            dirty = false;
        }
    }
    drop(screen);
    Ok(())
}

/// Draws `lines` from the top left corner, each line and the rest of the
/// screen below them cleared of what the last frame left.
fn draw(lines: &[String]) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    queue!(out, cursor::MoveTo(0, 0))?;
    for (i, line) in lines.iter().enumerate() {
        if i > 0 {
            // Raw mode: a line feed alone does not return the carriage.
            queue!(out, Print("\r\n"))?;
        }
        queue!(out, Print(line), terminal::Clear(ClearType::UntilNewLine))?;
    }
    queue!(out, terminal::Clear(ClearType::FromCursorDown))?;
    out.flush()
}
