//! The dashboard's JSON: the overview (totals, the keys not closed, the
//! busiest keys, their sparklines), pages of keys, recent transitions, and
//! the isolate and close actions. Errors are JSON that names the field at
//! fault. No answer walks every key, and none holds more than a page of
//! rows ([`PAGE`]).

use std::collections::HashMap;
use std::net::SocketAddr;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::error::ApiError;
use super::guard::Caller;
use super::json::{KeyJson, TotalsJson, TransitionJson};
use super::state::AppState;
use super::trends::{current_board, Board, Trend, ATTENTION};
use crate::domain::OperatorAction;
use crate::engine::{Cursor, EngineError, KeyReading};
use crate::proto::wire::{filter_of, page_after, page_token};

/// Most keys in a page of `/api/keys`, and its default size.
pub const PAGE: usize = 100;

/// How many of the busiest keys the overview shows.
pub const BUSIEST_SHOWN: usize = 10;

/// Longest prefix filter accepted, in bytes (the longest key).
const MAX_PREFIX_BYTES: usize = 256;

/// What the dashboard shows above its pages: `GET /api/overview`, and each
/// `snapshot` of `/api/events`.
#[derive(Clone, Debug, Serialize)]
pub struct Overview {
    /// The prefix the keys were filtered by (the totals are engine-wide).
    pub prefix: String,
    /// The sampler's round the overview comes from (0: none yet).
    pub round: u64,
    /// Engine-wide figures.
    pub totals: TotalsJson,
    /// The first keys that are not closed (open, half-open, isolated) and
    /// start with the prefix, in key order: at most [`ATTENTION`].
    pub attention: Vec<KeyJson>,
    /// True when more keys are not closed than `attention` holds.
    pub attention_more: bool,
    /// The busiest keys that start with the prefix, busiest first: at most
    /// [`BUSIEST_SHOWN`].
    pub busiest: Vec<KeyJson>,
    /// Sparklines of the keys above, by key ([`Trend`]).
    pub trends: HashMap<String, Trend>,
    /// How far apart the sparklines' samples are, in ms.
    pub sample_every_ms: u64,
}

/// The overview of the keys that start with `prefix`, from `board`: with
/// no prefix, nothing is read beyond the board; with one, a page of keys
/// not closed under it.
pub async fn overview(state: &AppState, board: &Board, prefix: &str) -> Result<Overview, ApiError> {
    let core = state.store.core();
    let (attention, attention_more) = if prefix.is_empty() {
        (board.attention.clone(), board.attention_more)
    } else {
        state.store.not_closed(prefix, ATTENTION).await?
    };
    let busiest: Vec<&KeyReading> = board
        .busiest
        .iter()
        .filter(|r| r.key.starts_with(prefix))
        .take(BUSIEST_SHOWN)
        .collect();
    let keys = || attention.iter().chain(busiest.iter().copied());
    state.trends.show(keys().map(|r| r.key.as_str()));
    Ok(Overview {
        prefix: prefix.to_owned(),
        round: board.round,
        totals: TotalsJson::of(&board.totals, core.limits().max_keys),
        trends: state.trends.of(keys().map(|r| r.key.as_str())),
        attention: attention.iter().map(|r| KeyJson::of(core, r)).collect(),
        attention_more,
        busiest: busiest.iter().map(|r| KeyJson::of(core, r)).collect(),
        sample_every_ms: state.trends.every().as_millis() as u64,
    })
}

/// A page of keys: `GET /api/keys`.
#[derive(Clone, Debug, Serialize)]
pub struct Page {
    /// The prefix the keys start with.
    pub prefix: String,
    /// At most [`PAGE`] live keys, in key order, after the request's `after`.
    pub keys: Vec<KeyJson>,
    /// The `after` of the next page; `null` on the last page.
    pub next: Option<String>,
    /// Sparklines of the keys of the page, by key ([`Trend`]).
    pub trends: HashMap<String, Trend>,
    /// How far apart the sparklines' samples are, in ms.
    pub sample_every_ms: u64,
}

/// The page of `limit` keys that start with `prefix` and come after the
/// cursor `after` (a `next` of an earlier page of the same prefix). With
/// state in Redis the keys are read from there; otherwise off the async
/// workers.
pub async fn page(
    state: AppState,
    prefix: String,
    after: Option<String>,
    limit: usize,
) -> Result<Page, ApiError> {
    let filter = filter_of(&prefix, &[]);
    let after = after
        .map(|token| {
            page_after(&token, &filter).map_err(|_| {
                ApiError::invalid(
                    "after",
                    "is not the `next` of an earlier page with the same prefix",
                )
            })
        })
        .transpose()?;
    let from = match after {
        None => Cursor::Start,
        Some(text) => Cursor::of_text(&text).ok_or_else(|| {
            ApiError::invalid(
                "after",
                "is not the `next` of an earlier page with the same prefix",
            )
        })?,
    };
    let listed = state.store.list_page(&prefix, &[], &from, limit).await?;
    let readings = listed.readings;
    let next = listed.next.map(|next| page_token(&filter, &next.text()));
    let keys = || readings.iter().map(|r| r.key.as_str());
    state.trends.show(keys());
    Ok(Page {
        prefix,
        trends: state.trends.of(keys()),
        keys: readings
            .iter()
            .map(|r| KeyJson::of(state.store.core(), r))
            .collect(),
        next,
        sample_every_ms: state.trends.every().as_millis() as u64,
    })
}

/// The query of `/api/keys` and `/api/events`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefixQuery {
    /// Only keys that start with this.
    #[serde(default)]
    pub prefix: String,
}

/// Reads the query by hand, so that a bad one is JSON that names the field.
pub fn prefix_of(
    query: Result<Query<PrefixQuery>, impl std::fmt::Display>,
) -> Result<String, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::invalid("query", e.to_string()))?;
    if q.prefix.len() > MAX_PREFIX_BYTES {
        return Err(ApiError::invalid(
            "prefix",
            format!(
                "must be at most {MAX_PREFIX_BYTES} bytes, not {}",
                q.prefix.len()
            ),
        ));
    }
    if let Some(c) = q
        .prefix
        .chars()
        .find(|&c| crate::domain::key::is_control(c))
    {
        return Err(ApiError::invalid(
            "prefix",
            format!(
                "must not contain control characters (found U+{:04X})",
                u32::from(c)
            ),
        ));
    }
    Ok(q.prefix)
}

/// The query of `/api/keys`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    /// Only keys that start with this.
    #[serde(default)]
    pub prefix: String,
    /// The `next` of the previous page; absent for the first.
    #[serde(default)]
    pub after: Option<String>,
    /// Keys in the page: 1 to [`PAGE`] (default [`PAGE`]).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// `GET /api/keys?prefix=&after=&limit=`: a page of keys in key order.
pub async fn keys(
    State(state): State<AppState>,
    query: Result<Query<PageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Page>, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::invalid("query", e.to_string()))?;
    let prefix = prefix_of(Ok::<_, String>(Query(PrefixQuery { prefix: q.prefix })))?;
    let limit = match q.limit {
        None => PAGE,
        Some(n) if (1..=PAGE).contains(&n) => n,
        Some(n) => {
            return Err(ApiError::invalid(
                "limit",
                format!("must be 1 to {PAGE}, not {n}"),
            ))
        }
    };
    let after = q.after.filter(|a| !a.is_empty());
    page(state, prefix, after, limit).await.map(Json)
}

/// `GET /api/overview?prefix=`: what the dashboard shows above its pages.
pub async fn overview_json(
    State(state): State<AppState>,
    query: Result<Query<PrefixQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Overview>, ApiError> {
    let prefix = prefix_of(query)?;
    let mut boards = state.trends.subscribe();
    let board = current_board(&mut boards)
        .await
        .ok_or_else(|| ApiError::from(EngineError::ShuttingDown))?;
    overview(&state, &board, &prefix).await.map(Json)
}

/// `GET /api/transitions?prefix=`: the remembered transitions, oldest first.
pub async fn transitions(
    State(state): State<AppState>,
    query: Result<Query<PrefixQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Vec<TransitionJson>>, ApiError> {
    let prefix = prefix_of(query)?;
    Ok(Json(state.history.matching(&prefix)))
}

/// Reads `{"reason": "..."}`; anything else is refused, naming the field.
fn reason_of(headers: &HeaderMap, body: &[u8]) -> Result<String, ApiError> {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        // Also what keeps other sites' pages out: a cross-origin JSON POST
        // needs a preflight that this server never grants.
        return Err(ApiError {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            field: Some("Content-Type"),
            message: "must be application/json".into(),
        });
    }
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::invalid(
            "body",
            format!("is not JSON ({e}); send {{\"reason\": \"...\"}}"),
        )
    })?;
    let serde_json::Value::Object(fields) = value else {
        return Err(ApiError::invalid(
            "body",
            "must be a JSON object: {\"reason\": \"...\"}",
        ));
    };
    if let Some(unknown) = fields.keys().find(|k| k.as_str() != "reason") {
        return Err(ApiError::invalid(
            "body",
            format!("unknown field {unknown:?}; the only field is \"reason\""),
        ));
    }
    match fields.get("reason") {
        None => Err(ApiError::invalid(
            "reason",
            "is required: say why, for the record",
        )),
        Some(serde_json::Value::String(reason)) if reason.trim().is_empty() => Err(
            ApiError::invalid("reason", "must not be blank: say why, for the record"),
        ),
        Some(serde_json::Value::String(reason)) => Ok(reason.trim().to_owned()),
        Some(_) => Err(ApiError::invalid("reason", "must be a string")),
    }
}

/// Who asked, for the record: the dashboard and the credential's name, or
/// the peer's address when `[auth]` is off.
fn who(peer: SocketAddr, caller: &Caller) -> String {
    match caller.name() {
        Some(name) => format!("dashboard:{name}"),
        None => format!("dashboard:{peer}"),
    }
}

/// The key of a path, or the JSON error that says why it cannot be read
/// (a bad percent-encoding, say).
fn key_of(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    path.map(|Path(key)| key).map_err(|e| ApiError {
        status: e.status(),
        field: Some("key"),
        message: format!(
            "{}; percent-encode the key as UTF-8, e.g. payments%2Fcharge",
            e.body_text()
        ),
    })
}

/// The body, or the JSON error that says why it cannot be read (too large).
fn body_of(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| ApiError {
        status: e.status(),
        field: Some("body"),
        message: if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            format!("is larger than {MAX_BODY_BYTES} bytes; send {{\"reason\": \"...\"}} only")
        } else {
            e.body_text()
        },
    })
}

/// The largest body the actions read, in bytes.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Answers 413 (JSON) at once to a request that announces a body larger
/// than [`MAX_BODY_BYTES`], without reading it.
pub async fn refuse_large_bodies(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let announced = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match announced {
        Some(n) if n > MAX_BODY_BYTES as u64 => ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            field: Some("body"),
            message: format!(
                "is {n} bytes, larger than {MAX_BODY_BYTES}; send {{\"reason\": \"...\"}} only"
            ),
        }
        .into_response(),
        _ => next.run(request).await,
    }
}

/// `POST /api/keys/{key}/isolate` and `POST /api/keys/{key}/close`, with
/// `{"reason": "..."}`: an operator's action from the dashboard (the
/// route gives which, as an extension), with its reason and who asked.
/// The key and the body are read, the caller checked against the key,
/// then the action runs.
pub async fn operate(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(caller): Extension<Caller>,
    Extension(action): Extension<OperatorAction>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<KeyJson>, ApiError> {
    let key = key_of(path)?;
    let body = body_of(body)?;
    caller.may_steer(&key, action.as_str())?;
    let reason = reason_of(&headers, &body)?;
    let who = who(peer, &caller);
    let r = state.store.operate(&key, &reason, &who, action).await?;
    Ok(Json(KeyJson::of(state.store.core(), &r)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json_headers() -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
        h
    }

    #[test]
    fn a_reason_is_a_non_blank_string_and_the_only_field() {
        let h = json_headers();
        assert_eq!(reason_of(&h, br#"{"reason":" why "}"#).unwrap(), "why");
        for (body, field) in [
            (&br#"{"reason":""}"#[..], "reason"),
            (br#"{"reason":5}"#, "reason"),
            (br#"{}"#, "reason"),
            (br#"{"reason":"x","who":"me"}"#, "body"),
            (br#"["x"]"#, "body"),
            (br#"{"#, "body"),
        ] {
            assert_eq!(reason_of(&h, body).unwrap_err().field, Some(field));
        }
        let e = reason_of(&HeaderMap::new(), br#"{"reason":"x"}"#).unwrap_err();
        assert_eq!(e.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    }
}
