//! The client commands of the `fusebox` command: calls to a server and
//! what they print, for people and (`--json`) for programs.

pub(crate) mod bench;
mod top;

pub(crate) use top::top;

use anyhow::{bail, Context};
use fusebox::proto::v1 as pb;
use fusebox::proto::wire::millis_of;

use crate::{ClientOptions, PhaseArg};

/// A connection to a server that sends the caller's credentials with
/// every call.
pub(crate) type Conn =
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Credentials>;

/// The `authorization: Bearer TOKEN` header of `--token` / `FUSEBOX_TOKEN`.
#[derive(Clone)]
pub(crate) struct Credentials(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl Credentials {
    /// No credentials.
    pub(crate) const NONE: Credentials = Credentials(None);

    /// The header for `token`, if any.
    pub(crate) fn of(token: Option<&str>) -> anyhow::Result<Credentials> {
        token
            .map(|t| {
                let mut value: tonic::metadata::MetadataValue<_> =
                    format!("Bearer {}", t.trim()).parse().map_err(|_| {
                        anyhow::anyhow!("--token: a token is printable ASCII without line breaks")
                    })?;
                value.set_sensitive(true);
                Ok(value)
            })
            .transpose()
            .map(Credentials)
    }
}

impl tonic::service::Interceptor for Credentials {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// A connection to the server `client` names, with its credentials.
pub(crate) async fn connect(client: &ClientOptions) -> anyhow::Result<Conn> {
    let credentials = Credentials::of(client.token.as_deref())?;
    let channel = channel(client).await?;
    Ok(tonic::service::interceptor::InterceptedService::new(
        channel,
        credentials,
    ))
}

/// How this command calls the server, for the hints of [`call_error`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Spoke {
    /// Without TLS.
    Plain = 0,
    /// TLS without a client certificate.
    Tls = 1,
    /// TLS with a client certificate.
    MutualTls = 2,
}

static SPOKE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

fn spoke() -> Spoke {
    match SPOKE.load(std::sync::atomic::Ordering::Relaxed) {
        0 => Spoke::Plain,
        1 => Spoke::Tls,
        _ => Spoke::MutualTls,
    }
}

async fn channel(client: &ClientOptions) -> anyhow::Result<tonic::transport::Channel> {
    let tls = client.tls_ca.is_some()
        || client.tls_cert.is_some()
        || client.tls_key.is_some()
        || client.tls_server_name.is_some()
        || client.server.starts_with("https://");
    let mode = match (tls, client.tls_cert.is_some()) {
        (false, _) => Spoke::Plain,
        (true, false) => Spoke::Tls,
        (true, true) => Spoke::MutualTls,
    };
    SPOKE.store(mode as u8, std::sync::atomic::Ordering::Relaxed);
    let url = if client.server.contains("://") {
        client.server.clone()
    } else if tls {
        format!("https://{}", client.server)
    } else {
        format!("http://{}", client.server)
    };
    let mut endpoint = tonic::transport::Endpoint::from_shared(url.clone())
        .with_context(|| format!("--server {}: not an address", client.server))?
        .connect_timeout(std::time::Duration::from_secs(5));
    if tls {
        endpoint = endpoint
            .tls_config(tls_config(client)?)
            .context("the TLS settings cannot be used")?;
    }
    endpoint.connect().await.map_err(|e| {
        let hint = tls_hint(&e, mode).unwrap_or_else(|| {
            "start `fusebox serve` there, or pass --server with the address a running \
             server printed (`listening on ADDR`); if it serves TLS, pass --tls-ca FILE"
                .to_owned()
        });
        anyhow::Error::new(e).context(format!("cannot reach fusebox at {}: {hint}", client.server))
    })
}

/// The client side of TLS, from `--tls-ca`, `--tls-cert`, `--tls-key` and `--tls-server-name`.
fn tls_config(client: &ClientOptions) -> anyhow::Result<tonic::transport::ClientTlsConfig> {
    tls_config_of(
        client.tls_ca.as_deref(),
        client.tls_cert.as_deref(),
        client.tls_key.as_deref(),
        client.tls_server_name.as_deref(),
    )
}

/// The client side of TLS from the files and the server name of the `--tls-*` flags.
pub(crate) fn tls_config_of(
    ca: Option<&std::path::Path>,
    cert: Option<&std::path::Path>,
    key: Option<&std::path::Path>,
    server_name: Option<&str>,
) -> anyhow::Result<tonic::transport::ClientTlsConfig> {
    let read = |flag: &str, path: &std::path::Path| {
        std::fs::read(path).with_context(|| format!("{flag}: cannot read {}", path.display()))
    };
    let Some(ca) = ca else {
        bail!(
            "--tls-ca is missing: pass the PEM file of the CA that signed the server's certificate"
        );
    };
    let mut config = tonic::transport::ClientTlsConfig::new().ca_certificate(
        tonic::transport::Certificate::from_pem(read("--tls-ca", ca)?),
    );
    match (cert, key) {
        (Some(cert), Some(key)) => {
            config = config.identity(tonic::transport::Identity::from_pem(
                read("--tls-cert", cert)?,
                read("--tls-key", key)?,
            ));
        }
        (Some(_), None) => bail!("--tls-cert needs --tls-key (this client's private key)"),
        (None, Some(_)) => bail!("--tls-key needs --tls-cert (this client's certificate)"),
        (None, None) => {}
    }
    if let Some(name) = server_name {
        config = config.domain_name(name.to_owned());
    }
    Ok(config)
}

/// What to check when a connection or call failed for a TLS reason, from
/// the chain of `error`'s causes and how the client spoke.
pub(crate) fn tls_hint(error: &(dyn std::error::Error + 'static), spoke: Spoke) -> Option<String> {
    let mut causes = String::new();
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = next {
        causes.push_str(&format!("{e} {e:?} "));
        next = e.source();
    }
    let has = |needle: &str| causes.contains(needle);
    let closed = has("connection closed")
        || has("onnection reset")
        || has("broken pipe")
        || has("Broken pipe")
        || has("unexpected EOF");
    // A TLS 1.3 server refuses a client's certificate (or its lack) after
    // the client's side of the handshake is done: the first call then
    // fails as the connection goes, named reset, closed or canceled by
    // whichever the client's side noticed first.
    let gone = closed || has("operation was canceled");
    let hint = if has("UnknownIssuer") || has("BadSignature") {
        "the server's certificate is not signed by --tls-ca FILE: pass the CA that signed it"
    } else if has("NotValidForName") {
        "the server's certificate does not name the host of --server: pass --tls-server-name with a name it has"
    } else if has("Expired") {
        "the server's certificate has expired (or this machine's clock is wrong)"
    } else if has("CertificateRequired") {
        "the server wants a client certificate: pass --tls-cert and --tls-key"
    } else if spoke != Spoke::Plain
        && (has("InvalidContentType") || has("CorruptMessage") || has("InvalidMessage"))
    {
        "the server does not speak TLS there: drop --tls-ca, --tls-cert and --tls-key"
    } else if spoke == Spoke::MutualTls
        && (has("UnknownCA") || has("BadCertificate") || has("DecryptError") || gone)
    {
        "the server refused this client's certificate: --tls-cert must be signed by a CA in the server's [tls] client_ca"
    } else if spoke == Spoke::Tls && gone {
        "the server closed the connection after the TLS handshake; it likely wants a client certificate: pass --tls-cert and --tls-key"
    } else if spoke == Spoke::Plain && (closed || has("frame") || has("protocol error")) {
        "the server closed the connection; if it serves TLS, pass --tls-ca FILE (and --tls-cert and --tls-key for mutual TLS)"
    } else {
        return None;
    };
    Some(hint.to_owned())
}

pub(crate) async fn admin(
    client: &ClientOptions,
) -> anyhow::Result<pb::admin_client::AdminClient<Conn>> {
    Ok(pb::admin_client::AdminClient::new(connect(client).await?))
}

pub(crate) fn operator<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let who = std::env::var("USER").unwrap_or_else(|_| "cli".to_owned());
    if let Ok(value) = format!("cli:{who}").parse() {
        request.metadata_mut().insert("x-fusebox-operator", value);
    }
    request
}

/// A failed call, named by its gRPC code as the SPEC and every gRPC client
/// write it (`NOT_FOUND`, `INVALID_ARGUMENT`), then the server's message.
pub(crate) fn call_error(status: tonic::Status) -> anyhow::Error {
    let code = code_name(status.code());
    // A call cut off as its connection went has no cause to read, only
    // tonic's CANCELLED: its words are read instead.
    let hint = match std::error::Error::source(&status) {
        Some(cause) => tls_hint(cause, spoke()),
        None if status.code() == tonic::Code::Cancelled => tls_hint(&status, spoke()),
        None => None,
    };
    if let Some(hint) = hint {
        return anyhow::anyhow!("{code}: {}: {hint}", status.message());
    }
    match status.message() {
        "" => anyhow::anyhow!("{code}"),
        message => anyhow::anyhow!("{code}: {message}"),
    }
}

/// The canonical name of a gRPC code: `NotFound` becomes `NOT_FOUND`.
pub(crate) fn code_name(code: tonic::Code) -> String {
    let mut name = String::new();
    for (i, c) in format!("{code:?}").chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_uppercase());
    }
    name
}

pub(crate) fn phase_name(value: i32) -> &'static str {
    match pb::Phase::try_from(value) {
        Ok(pb::Phase::Closed) => "CLOSED",
        Ok(pb::Phase::Open) => "OPEN",
        Ok(pb::Phase::HalfOpen) => "HALF_OPEN",
        Ok(pb::Phase::Isolated) => "ISOLATED",
        _ => "UNSPECIFIED",
    }
}

pub(crate) fn ms(d: Option<prost_types::Duration>) -> Option<u64> {
    millis_of("duration", d).ok().flatten()
}

pub(crate) fn print_acquire(r: &pb::AcquireResponse, json: bool) -> anyhow::Result<()> {
    let decision = pb::Decision::try_from(r.decision)
        .map(|d| d.as_str_name().trim_start_matches("DECISION_"))
        .unwrap_or("UNSPECIFIED");
    let reason = pb::Reason::try_from(r.reason)
        .ok()
        .filter(|r| *r != pb::Reason::Unspecified)
        .map(|r| r.as_str_name().trim_start_matches("REASON_").to_lowercase());
    if json {
        println!(
            "{}",
            serde_json::json!({
                "decision": decision,
                "ticket": (!r.ticket.is_empty()).then_some(&r.ticket),
                "reason": reason,
                "retry_after_ms": ms(r.retry_after),
                "lease_ms": ms(r.lease),
                "phase": phase_name(r.phase),
            })
        );
        return Ok(());
    }
    let mut line = decision.to_owned();
    if !r.ticket.is_empty() {
        line.push_str(&format!("  ticket {}", r.ticket));
    }
    if let Some(reason) = reason {
        line.push_str(&format!("  reason {reason}"));
    }
    if let Some(retry) = ms(r.retry_after) {
        line.push_str(&format!("  retry after {retry}ms"));
    }
    if let Some(lease) = ms(r.lease) {
        line.push_str(&format!("  lease {lease}ms"));
    }
    line.push_str(&format!("  phase {}", phase_name(r.phase)));
    println!("{line}");
    Ok(())
}

pub(crate) fn print_key(s: &pb::KeyState, json: bool) -> anyhow::Result<()> {
    if s.key.is_empty() {
        bail!("the server answered without a key");
    }
    let open_remaining = ms(s.open_remaining);
    if json {
        println!(
            "{}",
            serde_json::json!({
                "key": s.key,
                "phase": phase_name(s.phase),
                "consecutive_failures": s.consecutive_failures,
                "half_open_attempts": s.half_open_attempts,
                "open_remaining_ms": open_remaining,
                "free": s.free,
                "queued": s.queued,
                "live_tickets": s.live_tickets,
                "waiters": s.waiters,
            })
        );
        return Ok(());
    }
    println!("key                   {}", s.key);
    match open_remaining {
        Some(left) => println!(
            "phase                 {} ({left}ms left in the break)",
            phase_name(s.phase)
        ),
        None => println!("phase                 {}", phase_name(s.phase)),
    }
    println!("consecutive failures  {}", s.consecutive_failures);
    println!("half-open attempts    {}", s.half_open_attempts);
    println!("free permits          {}", s.free);
    println!("queued permits        {} ({} waiters)", s.queued, s.waiters);
    println!("live tickets          {}", s.live_tickets);
    Ok(())
}

// ---------------------------------------------------------------------------
// Operations: `keys`, `watch` and `top`.
// ---------------------------------------------------------------------------

pub(crate) async fn keys(
    client: ClientOptions,
    prefix: String,
    phases: Vec<PhaseArg>,
) -> anyhow::Result<()> {
    let mut admin = admin(&client).await?;
    let phases: Vec<i32> = phases.iter().map(|p| p.wire() as i32).collect();
    // Pages are printed as they come, so that a million keys start
    // showing at once and never sit in memory together.
    let mut pages = Pages::new(&prefix, &phases, LIST_PAGE);
    let mut widths: Vec<usize> = KEY_HEADERS.iter().map(|h| h.chars().count()).collect();
    let mut shown = 0;
    while let Some(keys) = pages.next(&mut admin).await? {
        if client.json && !keys.is_empty() {
            let items: Vec<String> = keys.iter().map(|k| key_json(k).to_string()).collect();
            let open = if shown == 0 { "[" } else { "," };
            print_part(&format!("{open}{}", items.join(",")))?;
        } else if !keys.is_empty() {
            let rows: Vec<Vec<String>> = keys.iter().map(key_cells).collect();
            let lines = render_with(&KEY_HEADERS, &rows, &mut widths);
            let skip = usize::from(shown > 0);
            emit(&lines[skip..].join("\n"))?;
        }
        shown += keys.len();
    }
    if client.json {
        return emit(if shown == 0 { "[]" } else { "]" });
    }
    if shown == 0 {
        let mut line = "no keys".to_owned();
        if !prefix.is_empty() {
            line.push_str(&format!(" start with {prefix:?}"));
        }
        if !phases.is_empty() {
            let names: Vec<&str> = phases.iter().map(|p| phase_name(*p)).collect();
            line.push_str(&format!(
                "{} in phase {}",
                if prefix.is_empty() { "" } else { " and are" },
                names.join(" or ")
            ));
        }
        return emit(&line);
    }
    Ok(())
}

/// Keys per ListKeys page that `fusebox keys` asks for (the most allowed).
const LIST_PAGE: i32 = 1000;

/// The pages of a listing, fetched one at a time by cursor.
pub(crate) struct Pages {
    request: pb::ListKeysRequest,
    done: bool,
}

impl Pages {
    pub(crate) fn new(prefix: &str, phases: &[i32], page_size: i32) -> Pages {
        Pages {
            request: pb::ListKeysRequest {
                prefix: prefix.to_owned(),
                phases: phases.to_vec(),
                page_size,
                page_token: String::new(),
            },
            done: false,
        }
    }

    /// The next page, or `None` after the last.
    pub(crate) async fn next(
        &mut self,
        admin: &mut pb::admin_client::AdminClient<Conn>,
    ) -> anyhow::Result<Option<Vec<pb::KeyState>>> {
        if self.done {
            return Ok(None);
        }
        let page = admin
            .list_keys(self.request.clone())
            .await
            .map_err(call_error)?
            .into_inner();
        if page.next_page_token.is_empty() {
            self.done = true;
        } else if page.next_page_token == self.request.page_token {
            bail!("the server answered the same page token twice; the listing is incomplete");
        }
        self.request.page_token = page.next_page_token;
        Ok(Some(page.keys))
    }
}

/// Prints `text` on standard output with no newline, like [`emit`].
fn print_part(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match write!(out, "{text}").and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => Err(e).context("cannot write to standard output"),
    }
}

/// Prints `text` and a newline on standard output. A reader that went away
/// (`fusebox watch | head`) ends the command quietly.
pub(crate) fn emit(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => Err(e).context("cannot write to standard output"),
    }
}

/// Every request a key answered: admitted, blocked, refused, denied or
/// withdrawn while waiting.
pub(crate) fn requests(s: &pb::KeyState) -> u64 {
    s.stats.as_ref().map_or(0, |st| {
        st.granted + st.probes + st.blocked + st.refused + st.denied + st.withdrawn
    })
}

/// A key as `keys --json` and `watch --json` print it.
pub(crate) fn key_json(s: &pb::KeyState) -> serde_json::Value {
    let st = s.stats.clone().unwrap_or_default();
    let by_reason: serde_json::Map<String, serde_json::Value> = st
        .by_reason
        .iter()
        .map(|(reason, n)| (reason.clone(), (*n).into()))
        .collect();
    serde_json::json!({
        "key": s.key,
        "phase": phase_name(s.phase),
        "open_remaining_ms": ms(s.open_remaining),
        "failure_ratio": s.failure_ratio,
        "consecutive_failures": s.consecutive_failures,
        "half_open_attempts": s.half_open_attempts,
        "free": s.free,
        "limit": s.limit,
        "queued": s.queued,
        "waiters": s.waiters,
        "live_tickets": s.live_tickets,
        "requests": requests(s),
        "phase_changed_at": s.phase_changed_at.map(time_ms),
        "stats": {
            "granted": st.granted,
            "probes": st.probes,
            "blocked": st.blocked,
            "refused": st.refused,
            "denied": st.denied,
            "by_reason": by_reason,
            "queued": st.queued,
            "evicted": st.evicted,
            "timed_out": st.timed_out,
            "withdrawn": st.withdrawn,
            "successes": st.successes,
            "failures": st.failures,
            "ignored": st.ignored,
            "stale": st.stale,
            "expired": st.expired,
        },
    })
}

/// A wall-clock time in RFC 3339 to the second: `2026-11-29T23:59:01Z`.
pub(crate) fn time_s(t: prost_types::Timestamp) -> String {
    prost_types::Timestamp {
        seconds: t.seconds,
        nanos: 0,
    }
    .to_string()
}

/// A wall-clock time in RFC 3339 to the millisecond.
pub(crate) fn time_ms(t: prost_types::Timestamp) -> String {
    prost_types::Timestamp {
        seconds: t.seconds,
        nanos: t.nanos - t.nanos.rem_euclid(1_000_000),
    }
    .to_string()
}

/// This machine's time, to the second.
pub(crate) fn now_s() -> String {
    time_s(prost_types::Timestamp::from(std::time::SystemTime::now()))
}

/// A duration for people: `750ms`, `4.9s`, `2m05s`, `1h30m`.
pub(crate) fn human_ms(ms: u64) -> String {
    match ms {
        0..=999 => format!("{ms}ms"),
        1_000..=59_999 => format!("{}.{}s", ms / 1000, ms % 1000 / 100),
        60_000..=3_599_999 => format!("{}m{:02}s", ms / 60_000, ms % 60_000 / 1000),
        _ => format!("{}h{:02}m", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

/// An interval as given: `1s`, `500ms`, `2m`; otherwise as [`human_ms`].
pub(crate) fn interval_words(ms: u64) -> String {
    match ms {
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms % 1000 == 0 => format!("{}s", ms / 1000),
        ms if ms < 1000 => format!("{ms}ms"),
        ms => human_ms(ms),
    }
}

pub(crate) const KEY_HEADERS: [&str; 8] = [
    "KEY",
    "PHASE",
    "BREAK LEFT",
    "FAIL RATIO",
    "FREE/LIMIT",
    "QUEUED",
    "TICKETS",
    "REQUESTS",
];

/// The table cells of one key, in [`KEY_HEADERS`] order.
pub(crate) fn key_cells(s: &pb::KeyState) -> Vec<String> {
    vec![
        s.key.clone(),
        phase_name(s.phase).to_owned(),
        ms(s.open_remaining).map_or_else(|| "-".to_owned(), human_ms),
        s.failure_ratio
            .map_or_else(|| "-".to_owned(), |r| format!("{:.1}%", r * 100.0)),
        if s.limit == 0 {
            "-".to_owned()
        } else {
            format!("{}/{}", s.free, s.limit)
        },
        s.queued.to_string(),
        s.live_tickets.to_string(),
        requests(s).to_string(),
    ]
}

/// The key table: a header and one line per key. With `width`, keys are
/// shortened so that lines fit. Also returns the columns' widths.
pub(crate) fn key_table(keys: &[pb::KeyState], width: Option<usize>) -> (Vec<String>, Vec<usize>) {
    let mut rows: Vec<Vec<String>> = keys.iter().map(key_cells).collect();
    let (lines, widths) = render_table(&KEY_HEADERS, &rows);
    let total: usize = widths.iter().sum::<usize>() + 2 * (widths.len() - 1);
    match width {
        Some(width) if total > width => {
            let room = (width + widths[0]).saturating_sub(total).max(12);
            for row in &mut rows {
                row[0] = shorten(&row[0], room);
            }
            render_table(&KEY_HEADERS, &rows)
        }
        _ => (lines, widths),
    }
}

/// `text` cut to `max` characters, ending in `…` when cut.
pub(crate) fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut short: String = text.chars().take(max.saturating_sub(1)).collect();
    short.push('…');
    short
}

/// Lines of a table: the first two columns aligned left, the rest (numbers)
/// right, two spaces apart.
pub(crate) fn render_table(headers: &[&str], rows: &[Vec<String>]) -> (Vec<String>, Vec<usize>) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    let lines = render_with(headers, rows, &mut widths);
    (lines, widths)
}

/// Lines of a table like [`render_table`], header first, whose columns are
/// at least `widths` wide; `widths` grows to fit the rows, so that pages
/// printed one after another line up as well as they can.
pub(crate) fn render_with(
    headers: &[&str],
    rows: &[Vec<String>],
    widths: &mut [usize],
) -> Vec<String> {
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.zip(widths.iter()).enumerate() {
            if i > 0 {
                out.push_str("  ");
            }
            if i < 2 {
                out.push_str(&format!("{cell:<w$}"));
            } else {
                out.push_str(&format!("{cell:>w$}"));
            }
        }
        out.trim_end().to_owned()
    };
    let mut lines = vec![line(&mut headers.iter().copied())];
    for row in rows {
        lines.push(line(&mut row.iter().map(String::as_str)));
    }
    lines
}

/// A transition in words: `2026-11-29T23:59:01Z payments/charge CLOSED ->
/// OPEN  failures reached the trip condition`.
pub(crate) fn transition_line(t: &pb::Transition) -> String {
    let at = t.at.map_or_else(now_s, time_s);
    format!(
        "{at} {} {} -> {}  {}",
        t.key,
        phase_name(t.from),
        phase_name(t.to),
        transition_words(t)
    )
}

/// Why a transition happened; for an operator's isolate or close, who
/// asked and why.
pub(crate) fn transition_words(t: &pb::Transition) -> String {
    let verb = match pb::TransitionKind::try_from(t.kind) {
        Ok(pb::TransitionKind::Isolate) => "isolated",
        Ok(pb::TransitionKind::Close) => "closed",
        _ => return t.cause.clone(),
    };
    let mut words = if t.who.is_empty() {
        format!("{verb} by an operator")
    } else {
        format!("{verb} by {}", t.who)
    };
    if !t.reason.is_empty() {
        words.push_str(": ");
        words.push_str(&t.reason);
    }
    words
}

pub(crate) fn transition_json(t: &pb::Transition) -> serde_json::Value {
    let kind = pb::TransitionKind::try_from(t.kind)
        .map(|k| {
            k.as_str_name()
                .trim_start_matches("TRANSITION_KIND_")
                .to_lowercase()
        })
        .unwrap_or_else(|_| "unspecified".to_owned());
    let text = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    serde_json::json!({
        "event": "transition",
        "sequence": t.sequence,
        "at": t.at.map(time_ms),
        "key": t.key,
        "kind": kind,
        "from": phase_name(t.from),
        "to": phase_name(t.to),
        "cause": t.cause,
        "who": text(&t.who),
        "reason": text(&t.reason),
        "state": t.state.as_ref().map(key_json),
    })
}

/// Resolves when the user interrupts (Ctrl-C) or the process is told to
/// stop (SIGTERM, SIGHUP). The handlers are installed at once, so no
/// signal sent after this returns kills the process outright.
pub(crate) fn stop_signal(
) -> anyhow::Result<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut int = signal(SignalKind::interrupt())?;
        let mut term = signal(SignalKind::terminate())?;
        let mut hup = signal(SignalKind::hangup())?;
        Ok(Box::pin(async move {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
                _ = hup.recv() => {}
            }
        }))
    }
    #[cfg(not(unix))]
    {
        Ok(Box::pin(async {
            let _ = tokio::signal::ctrl_c().await;
        }))
    }
}

pub(crate) async fn watch(client: ClientOptions, prefix: String) -> anyhow::Result<()> {
    let mut stop = stop_signal()?;
    let mut admin = admin(&client).await?;
    let mut stream = admin
        .watch(pb::WatchRequest {
            prefix: prefix.clone(),
        })
        .await
        .map_err(call_error)?
        .into_inner();
    // The parts of the snapshot being received.
    let mut snapshot: Vec<pb::KeyState> = Vec::new();
    loop {
        let message = tokio::select! {
            message = stream.message() => message,
            () = &mut stop => return Ok(()),
        };
        let event = match message {
            Ok(Some(pb::WatchEvent { event: Some(event) })) => event,
            Ok(Some(pb::WatchEvent { event: None })) => continue,
            Ok(None) => {
                eprintln!("the server ended the watch stream");
                return Ok(());
            }
            Err(status) => return Err(call_error(status).context("the watch stream broke")),
        };
        match event {
            pb::watch_event::Event::Snapshot(part) if client.json => {
                let keys: Vec<serde_json::Value> = part.keys.iter().map(key_json).collect();
                emit(
                    &serde_json::json!({
                        "event": "snapshot",
                        "complete": part.complete,
                        "keys": keys,
                    })
                    .to_string(),
                )?;
            }
            pb::watch_event::Event::Snapshot(part) => {
                snapshot.extend(part.keys);
                if part.complete {
                    let keys = std::mem::take(&mut snapshot);
                    if !keys.is_empty() {
                        emit(&key_table(&keys, None).0.join("\n"))?;
                    }
                    let which = if prefix.is_empty() {
                        String::new()
                    } else {
                        format!(" starting with {prefix:?}")
                    };
                    let count = match keys.len() {
                        1 => "1 key".to_owned(),
                        n => format!("{n} keys"),
                    };
                    emit(&format!(
                        "{} snapshot: {count}{which}; watching for transitions",
                        now_s()
                    ))?;
                }
            }
            pb::watch_event::Event::Transition(t) if client.json => {
                emit(&transition_json(&t).to_string())?;
            }
            pb::watch_event::Event::Transition(t) => emit(&transition_line(&t))?,
            pb::watch_event::Event::Lagged(lag) if client.json => {
                emit(&serde_json::json!({ "event": "lagged", "missed": lag.missed }).to_string())?;
            }
            pb::watch_event::Event::Lagged(lag) => {
                // Parts of a snapshot cut short are superseded by the next.
                snapshot.clear();
                emit(&format!(
                    "{} lagged: this watcher fell behind and missed {} events; a fresh snapshot follows",
                    now_s(),
                    lag.missed
                ))?;
            }
        }
    }
}

// ---------------------------------------------------------------------------
// `top`: a live table in the terminal.
// ---------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;

    /// A call cut off as a TLS 1.3 server refuses the client's certificate
    /// (or its lack) may end as tonic's bare CANCELLED: it still says what
    /// to pass, and a plain connection is not told about TLS for it.
    #[test]
    fn a_call_canceled_as_the_connection_went_still_says_what_to_pass() {
        let canceled = tonic::Status::cancelled("operation was canceled");
        let hint = |spoke| tls_hint(&canceled, spoke).unwrap_or_default();
        assert!(hint(Spoke::Tls).contains("pass --tls-cert and --tls-key"));
        assert!(hint(Spoke::MutualTls).contains("refused this client's certificate"));
        assert_eq!(tls_hint(&canceled, Spoke::Plain), None);
    }
}
