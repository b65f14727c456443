//! `fusebox keys`: the keys, page by page, as a table or JSON.

use anyhow::bail;
use fusebox_proto::v1 as pb;

use crate::connect::{admin, call_error, ClientOptions, Conn};
use crate::print::{emit, key_json, phase_name, print_part};
use crate::table::{key_cells, render_with, KEY_HEADERS};

/// A phase, as `--phase` takes it.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PhaseArg {
    /// CLOSED.
    Closed,
    /// OPEN.
    Open,
    /// HALF_OPEN.
    #[value(name = "half_open", alias = "half-open")]
    HalfOpen,
    /// ISOLATED.
    Isolated,
}

impl PhaseArg {
    /// The phase on the wire.
    pub fn wire(self) -> pb::Phase {
        match self {
            PhaseArg::Closed => pb::Phase::Closed,
            PhaseArg::Open => pb::Phase::Open,
            PhaseArg::HalfOpen => pb::Phase::HalfOpen,
            PhaseArg::Isolated => pb::Phase::Isolated,
        }
    }
}

/// Lists the keys that start with `prefix` and are in one of `phases`
/// (any phase when none), printing each page as it comes.
pub async fn keys(
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
    /// The listing of the keys that start with `prefix` and are in one
    /// of `phases` (any when none), `page_size` keys a page.
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
