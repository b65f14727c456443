// fusebox dashboard: totals by phase, the keys that are not closed, the
// busiest keys, and pages of keys by prefix, each row with sparklines of its
// request and failure rates; live over server-sent events. The server never
// sends more than a page of rows: paging and filtering happen there.
// Plain JS, no framework, no build step. Every value from the server is
// written with textContent, never as HTML.
'use strict';

const PHASE_LABEL = { OPEN: 'OPEN', HALF_OPEN: 'HALF-OPEN', ISOLATED: 'ISOLATED', CLOSED: 'CLOSED' };
const TIMELINE_MAX = 200;
const SVG = 'http://www.w3.org/2000/svg';
const SPARK_W = 80;
const SPARK_H = 24;
const SPARK_SAMPLES = 100; // the server keeps 100 samples per key

const $ = (id) => document.getElementById(id);

const state = {
  prefix: new URLSearchParams(location.search).get('prefix') || '',
  source: null,
  // Each table: its rows by key ({ data, receivedAt, row, cells }) and its order.
  tables: {
    attention: { rows: new Map(), order: [] },
    busiest: { rows: new Map(), order: [] },
    browse: { rows: new Map(), order: [] },
  },
  trends: new Map(),      // key -> { requests: [...], failures: [...] } per second
  sampleEveryMs: 3000,
  timeline: [],           // transitions, newest first
  seen: new Set(),        // transition sequence numbers shown
  lastChange: new Map(),  // key -> its latest transition
  counts: { OPEN: 0, HALF_OPEN: 0, ISOLATED: 0, CLOSED: 0 },
  totals: { keys: 0, tickets: 0 },
  attentionMore: false,
  cursors: [''],          // the `after` of every page up to the one shown
  next: null,             // the `after` of the next page
  loading: null,          // the page fetch in flight
  dialog: null,           // { key, action }
};

// ---------- formatting ----------

function duration(ms) {
  const s = Math.max(0, Math.floor(ms / 1000));
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${String(s % 60).padStart(2, '0')}s`;
  const h = Math.floor(m / 60);
  if (h < 48) return `${h}h ${String(m % 60).padStart(2, '0')}m`;
  return `${Math.floor(h / 24)}d ${h % 24}h`;
}

function clock(ms) {
  return new Date(ms).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit', hour12: false });
}

function stamp(ms) {
  return new Date(ms).toLocaleString([], { hour12: false });
}

// `n thing` or `n things`.
function plural(n, one, many) {
  return `${n} ${n === 1 ? one : (many || `${one}s`)}`;
}

// A policy's breaker.half_open in words.
function halfOpenPolicy(h) {
  return `at most ${plural(h.probes, 'probe')} at once, ${plural(h.successes, 'success', 'successes')} to close`;
}

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function pill(phase, small) {
  const p = el('span', `pill phase-${phase}${small ? ' small' : ''}`, PHASE_LABEL[phase] || phase);
  return p;
}

function setText(node, text) {
  if (node.textContent !== text) node.textContent = text;
}

// What a transition says about why a key is in its phase: the operator's
// reason (or the breaker's cause), and who did it when.
function why(t) {
  if (t.kind === 'isolate' || t.kind === 'close') {
    const verb = t.kind === 'isolate' ? 'isolated' : 'closed';
    return { main: t.reason, sub: `${verb} by ${t.who} at ${clock(t.at_ms)}` };
  }
  return { main: t.cause, sub: `at ${clock(t.at_ms)}` };
}

// ---------- the table ----------

function makeRow(key) {
  const row = el('tr');
  row.dataset.key = key;
  const cells = {};
  for (const name of ['key', 'phase', 'break', 'fail', 'free', 'queued', 'tickets', 'rate', 'frate', 'why', 'actions']) {
    cells[name] = el('td', `c-${name}`);
    row.appendChild(cells[name]);
  }
  for (const n of ['fail', 'free', 'queued', 'tickets']) cells[n].classList.add('num');
  cells.keyText = el('span', 'key', key);
  cells.key.appendChild(cells.keyText);
  cells.pill = el('span');
  cells.since = el('span', 'since');
  cells.phase.append(cells.pill, cells.since);
  cells.breakText = el('span');
  cells.breakSub = el('span', 'break-sub');
  cells.break.append(cells.breakText, cells.breakSub);
  cells.failText = el('span');
  cells.failBar = el('span', 'ratio-bar');
  cells.failBar.appendChild(el('span'));
  cells.fail.append(cells.failText, cells.failBar);
  cells.whyMain = el('span', 'why-main');
  cells.whySub = el('span', 'why-sub');
  cells.why.append(cells.whyMain, cells.whySub);
  cells.isolate = el('button', 'act isolate', 'Isolate');
  cells.isolate.type = 'button';
  cells.isolate.dataset.action = 'isolate';
  cells.close = el('button', 'act close', 'Close');
  cells.close.type = 'button';
  cells.close.dataset.action = 'close';
  cells.actions.append(cells.isolate, cells.close);
  cells.rateSpark = sparkline('requests');
  cells.rateText = el('span', 'rate-now');
  cells.rate.append(cells.rateSpark, cells.rateText);
  cells.frateSpark = sparkline('failures');
  cells.frateText = el('span', 'rate-now');
  cells.frate.append(cells.frateSpark, cells.frateText);
  cells.isolate.addEventListener('click', () => askReason(key, 'isolate'));
  cells.close.addEventListener('click', () => askReason(key, 'close'));
  return { row, cells };
}

function fillRow(entry, now) {
  const d = entry.data;
  const { row, cells } = entry;
  if (row.dataset.phase !== d.phase) {
    row.dataset.phase = d.phase;
    cells.pill.replaceWith(cells.pill = pill(d.phase));
  }
  setText(cells.since, `for ${duration(Date.now() - d.phase_changed_at_ms)}`);
  cells.since.title = `since ${stamp(d.phase_changed_at_ms)}`;
  cells.keyText.title = `${d.key}\n${d.requests} requests, ${d.turned_away} turned away; ${d.successes} successes, ${d.failures} failures`
    + (d.half_open ? `\nhalf-open: ${halfOpenPolicy(d.half_open)}` : '')
    + (d.slow ? `\nslow calls: older than ${duration(d.slow.duration_ms)}, trip at ${Math.round(d.slow.ratio * 100)}%; ${d.live_slow} in flight, ${d.slow_calls} so far` : '')
    + (d.shadow_policy || d.shadow > 0
      ? `\nshadow policy (dry run): ${d.shadow} requests it would have blocked or denied were granted`
      : '');
  if (!cells.shadowTag) {
    cells.shadowTag = el('span', 'shadow-tag', 'shadow');
    cells.shadowTag.title = 'enforce = false: decisions are counted, never enforced (isolation is)';
    cells.key.appendChild(cells.shadowTag);
  }
  cells.shadowTag.hidden = !d.shadow_policy;

  let breakText = '—';
  let breakClass = 'muted';
  let breakSub = '';
  let breakTitle = '';
  if (d.phase === 'OPEN' && d.open_remaining_ms !== null) {
    const left = d.open_remaining_ms - (now - entry.receivedAt);
    if (left > 0) {
      breakText = duration(left + 999);
      breakClass = 'countdown';
    } else {
      breakText = 'over';
      breakClass = 'muted';
      cells.breakText.title = 'the break is over: the next request probes';
    }
  } else if (d.phase === 'HALF_OPEN') {
    const h = d.half_open || { probes: 1, successes: 1 };
    breakText = `probing: ${d.probes_held} of ${plural(h.probes, 'slot')} held`;
    breakSub = `${d.half_open_successes} of ${plural(h.successes, 'success', 'successes')} to close`;
    breakClass = 'probing';
    breakTitle = `${plural(d.half_open_attempts, 'probe')} admitted since the break ended; `
      + `${halfOpenPolicy(h)}. A probe failure opens the breaker again.`;
  } else if (d.phase === 'ISOLATED') {
    breakText = 'until closed';
  } else if (d.phase === 'CLOSED' && d.slow && d.live_slow > 0) {
    breakText = `${d.live_slow} slow in flight`;
    breakClass = 'warn';
    if (d.slow_ratio !== null && d.slow_ratio !== undefined) {
      breakSub = `${Math.round(d.slow_ratio * 100)}% slow of ${Math.round(d.slow.ratio * 100)}% to trip`;
    }
    breakTitle = `calls older than ${duration(d.slow.duration_ms)} are slow; `
      + `${d.slow_calls} became slow so far. Hanging calls trip the breaker before they return.`;
  }
  setText(cells.breakText, breakText);
  cells.breakText.className = breakClass;
  setText(cells.breakSub, breakSub);
  cells.breakSub.hidden = !breakSub;
  if (d.phase !== 'OPEN') cells.breakText.title = breakTitle;

  if (d.failure_ratio !== null && d.failure_ratio !== undefined) {
    const pct = Math.round(d.failure_ratio * 100);
    setText(cells.failText, `${pct}%`);
    cells.failBar.hidden = false;
    cells.failBar.firstChild.style.width = `${Math.min(100, pct)}%`;
    cells.fail.title = `${pct}% of outcomes in the sampling window failed; ${d.consecutive_failures} in a row`;
  } else {
    setText(cells.failText, d.consecutive_failures > 0 ? `${d.consecutive_failures} in a row` : '0');
    cells.failBar.hidden = true;
    cells.fail.title = `${d.consecutive_failures} failures in a row`;
  }
  cells.failText.className = d.consecutive_failures > 0 || d.failure_ratio > 0 ? 'warn' : 'muted';

  if (d.adaptive_limit > 0) {
    setText(cells.free, `${d.free} / ${d.adaptive_limit}`);
    cells.free.title = `adaptive limit ${d.adaptive_limit} (learned from the calls' durations; at most ${d.limit})`;
    cells.free.className = `c-free num${d.free === 0 ? ' warn' : ''}`;
  } else if (d.limit > 0) {
    cells.free.title = '';
    setText(cells.free, `${d.free} / ${d.limit}`);
    cells.free.className = `c-free num${d.free === 0 ? ' warn' : ''}`;
  } else {
    setText(cells.free, 'no limit');
    cells.free.className = 'c-free num muted';
  }
  setText(cells.queued, d.waiters > 0 ? `${d.queued} (${d.waiters} waiting)` : '0');
  cells.queued.className = `c-queued num${d.waiters > 0 ? ' warn' : ' muted'}`;
  setText(cells.tickets, String(d.live_tickets));
  cells.tickets.className = `c-tickets num${d.live_tickets > 0 ? '' : ' muted'}`;

  const last = state.lastChange.get(d.key);
  const reason = last && last.to === d.phase ? why(last) : null;
  setText(cells.whyMain, reason ? reason.main : '—');
  setText(cells.whySub, reason ? reason.sub : '');
  cells.why.title = reason ? `${reason.main}\n${reason.sub} (${stamp(last.at_ms)})` : '';
  cells.why.classList.toggle('muted', !reason);

  cells.isolate.hidden = d.phase === 'ISOLATED';
  cells.close.hidden = d.phase === 'CLOSED';

  const trend = state.trends.get(d.key);
  drawSpark(cells.rateSpark, cells.rateText, trend ? trend.requests : [], 'requests');
  drawSpark(cells.frateSpark, cells.frateText, trend ? trend.failures : [], 'failures');
}

// ---------- sparklines ----------

function sparkline(kind) {
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('class', `spark spark-${kind}`);
  svg.setAttribute('viewBox', `0 0 ${SPARK_W} ${SPARK_H}`);
  svg.setAttribute('width', String(SPARK_W));
  svg.setAttribute('height', String(SPARK_H));
  svg.setAttribute('role', 'img');
  const base = document.createElementNS(SVG, 'line');
  base.setAttribute('class', 'spark-base');
  base.setAttribute('x1', '0');
  base.setAttribute('x2', String(SPARK_W));
  base.setAttribute('y1', String(SPARK_H - 0.5));
  base.setAttribute('y2', String(SPARK_H - 0.5));
  const area = document.createElementNS(SVG, 'polygon');
  area.setAttribute('class', 'spark-area');
  const line = document.createElementNS(SVG, 'polyline');
  line.setAttribute('class', 'spark-line');
  svg.append(base, area, line);
  svg.dataset.points = '0';
  return svg;
}

function rate(v) {
  if (v === 0) return '0';
  if (v < 10) return v.toFixed(1);
  return String(Math.round(v));
}

// Draws `values` (per second, oldest first) right-aligned: the latest is at
// the right edge, and the width is the server's whole history.
function drawSpark(svg, label, values, kind) {
  const key = values.join(',');
  if (svg.dataset.drawn === key) return;
  svg.dataset.drawn = key;
  svg.dataset.points = String(values.length);
  const [, area, line] = svg.children;
  if (values.length < 2) {
    line.setAttribute('points', '');
    area.setAttribute('points', '');
    svg.classList.add('empty');
    label.textContent = '';
    svg.setAttribute('aria-label', `${kind}: no samples yet`);
    return;
  }
  svg.classList.remove('empty');
  const max = Math.max(...values);
  const step = SPARK_W / (SPARK_SAMPLES - 2);
  const y = (v) => (max > 0 ? SPARK_H - 1 - (v / max) * (SPARK_H - 3) : SPARK_H - 1).toFixed(1);
  const x = (i) => (SPARK_W - (values.length - 1 - i) * step).toFixed(1);
  const points = values.map((v, i) => `${x(i)},${y(v)}`).join(' ');
  line.setAttribute('points', points);
  area.setAttribute('points', `${x(0)},${SPARK_H} ${points} ${SPARK_W},${SPARK_H}`);
  const now = values[values.length - 1];
  label.textContent = rate(now);
  const minutes = Math.max(1, Math.round((values.length * state.sampleEveryMs) / 60000));
  const title = `${kind}: ${rate(now)}/s now, peak ${rate(max)}/s over the last ${minutes} min`;
  svg.setAttribute('aria-label', title);
  let tip = svg.querySelector('title');
  if (!tip) {
    tip = document.createElementNS(SVG, 'title');
    svg.prepend(tip);
  }
  tip.textContent = title;
}

// Sets a table's rows to `list` (key JSON, in the server's order).
function setRows(name, list) {
  const table = state.tables[name];
  const present = new Set();
  for (const data of list) {
    present.add(data.key);
    const entry = table.rows.get(data.key);
    if (entry) {
      entry.data = data;
      entry.receivedAt = performance.now();
    } else {
      table.rows.set(data.key, { data, receivedAt: performance.now() });
    }
  }
  for (const key of [...table.rows.keys()]) if (!present.has(key)) table.rows.delete(key);
  table.order = list.map((d) => d.key);
}

function renderTable(name) {
  const table = state.tables[name];
  const now = performance.now();
  const body = $(`${name}-rows`);
  let cursor = body.firstChild;
  for (const key of table.order) {
    const entry = table.rows.get(key);
    if (!entry) continue;
    if (!entry.row) Object.assign(entry, makeRow(key));
    fillRow(entry, now);
    // Move a row only when it is out of place, so that a button under
    // the pointer is not replaced between press and release.
    if (entry.row !== cursor) body.insertBefore(entry.row, cursor);
    else cursor = cursor.nextSibling;
  }
  while (cursor) {
    const next = cursor.nextSibling;
    cursor.remove();
    cursor = next;
  }
  $(`${name}-empty`).hidden = table.order.length > 0;
}

function render() {
  for (const name of Object.keys(state.tables)) renderTable(name);
  for (const phase of Object.keys(state.counts)) setText($(`n-${phase}`), state.counts[phase].toLocaleString('en-US'));
  setText($('n-keys'), state.totals.keys.toLocaleString('en-US'));
  setText($('n-tickets'), state.totals.tickets.toLocaleString('en-US'));
  document.querySelectorAll('.count[data-phase]').forEach((c) =>
    c.classList.toggle('zero', state.counts[c.dataset.phase] === 0));
  const shown = state.tables.attention.order.length;
  setText($('attention-note'), state.attentionMore
    ? `the first ${shown}, in key order: narrow with a prefix`
    : (state.prefix ? `starting with “${state.prefix}”` : ''));
  $('browse-empty').textContent = state.prefix
    ? `No live keys start with “${state.prefix}”.`
    : 'No live keys yet: a key appears when a client first asks for it.';
  const page = state.cursors.length;
  const n = state.tables.browse.order.length;
  const first = (page - 1) * pageSize + 1;
  setText($('page-label'), n > 0 ? `page ${page} · keys ${first}–${first + n - 1}` : `page ${page}`);
  $('prev').disabled = page <= 1;
  $('next').disabled = !state.next;
  document.title = state.counts.OPEN + state.counts.HALF_OPEN + state.counts.ISOLATED > 0
    ? `(${state.counts.OPEN} open) fusebox` : 'fusebox';
}

function tick() {
  const now = performance.now();
  for (const table of Object.values(state.tables)) {
    for (const entry of table.rows.values()) if (entry.row) fillRow(entry, now);
  }
}

// ---------- pages of keys ----------

const pageSize = 100;

function mergeTrends(trends, everyMs) {
  if (everyMs) state.sampleEveryMs = everyMs;
  for (const [key, trend] of Object.entries(trends || {})) state.trends.set(key, trend);
}

// Fetches the page the cursors point at; `refresh` keeps the page if a
// fetch is already under way.
async function loadPage(refresh) {
  if (refresh && state.loading) return;
  const after = state.cursors[state.cursors.length - 1];
  const url = `api/keys?prefix=${encodeURIComponent(state.prefix)}&limit=${pageSize}`
    + (after ? `&after=${encodeURIComponent(after)}` : '');
  const mine = authorized(url).then((r) => (r.ok ? r.json() : Promise.reject(new Error(r.statusText))));
  state.loading = mine;
  try {
    const page = await mine;
    if (state.loading !== mine) return; // a newer request won
    mergeTrends(page.trends, page.sample_every_ms);
    setRows('browse', page.keys);
    state.next = page.next;
    render();
  } catch (err) {
    if (state.loading === mine) toast(`Could not load keys: ${err.message}`);
  } finally {
    if (state.loading === mine) state.loading = null;
  }
}

// ---------- the timeline ----------

function addTransition(t) {
  if (state.seen.has(t.sequence)) return false;
  state.seen.add(t.sequence);
  state.timeline.push(t);
  const prev = state.lastChange.get(t.key);
  if (!prev || prev.sequence < t.sequence) state.lastChange.set(t.key, t);
  return true;
}

function renderTimeline() {
  state.timeline.sort((a, b) => b.sequence - a.sequence);
  state.timeline.length = Math.min(state.timeline.length, TIMELINE_MAX);
  const list = $('timeline');
  const items = state.timeline.map((t) => {
    const li = el('li', `t to-${t.to} kind-${t.kind}`);
    li.dataset.key = t.key;
    li.dataset.kind = t.kind;
    const head = el('div', 't-head');
    const time = el('time', 't-time', clock(t.at_ms));
    time.dateTime = new Date(t.at_ms).toISOString();
    time.title = stamp(t.at_ms);
    head.append(time, el('span', 'key', t.key));
    const move = el('div', 't-move');
    move.append(pill(t.from, true), el('span', 'arrow', '→'), pill(t.to, true));
    const cause = el('div', 't-cause');
    if (t.kind === 'isolate' || t.kind === 'close') {
      cause.append(el('span', 't-who', `${t.kind === 'isolate' ? 'isolated' : 'closed'} by ${t.who}`));
      cause.append(el('q', 't-reason', t.reason));
    } else {
      cause.textContent = t.cause;
    }
    li.append(head, move, cause);
    return li;
  });
  list.replaceChildren(...items);
  const none = $('timeline-empty');
  none.hidden = items.length > 0;
  none.textContent = state.prefix
    ? `No transitions of keys that start with “${state.prefix}” since the server started.`
    : 'No transitions since the server started.';
}

// ---------- the live feed ----------

// A key's new state, wherever it is shown.
function upsert(data) {
  for (const table of Object.values(state.tables)) {
    const entry = table.rows.get(data.key);
    if (entry) {
      entry.data = data;
      entry.receivedAt = performance.now();
    }
  }
  const attention = state.tables.attention;
  if (data.phase !== 'CLOSED' && !attention.rows.has(data.key)) {
    attention.rows.set(data.key, { data, receivedAt: performance.now() });
    attention.order = [...attention.order, data.key].sort();
  }
}

function setStatus(kind, text) {
  $('status').dataset.state = kind;
  setText($('status-text'), text);
}

function onSnapshot(event) {
  const snap = JSON.parse(event.data);
  mergeTrends(snap.trends, snap.sample_every_ms);
  setRows('attention', snap.attention);
  setRows('busiest', snap.busiest);
  state.attentionMore = snap.attention_more;
  state.counts = { ...snap.totals.by_phase };
  state.totals = { keys: snap.totals.keys, tickets: snap.totals.tickets };
  if (snap.recent) {
    let added = false;
    for (const t of snap.recent) added = addTransition(t) || added;
    if (added) renderTimeline();
  }
  setStatus('live', `live · updated ${clock(Date.now())}`);
  render();
  loadPage(true);
}

function onChange(event) {
  const { key, transition } = JSON.parse(event.data);
  if (transition.from !== transition.to) {
    if (state.counts[transition.from] > 0) state.counts[transition.from] -= 1;
    state.counts[transition.to] += 1;
  }
  upsert(key);
  if (addTransition(transition)) renderTimeline();
  setStatus('live', `live · updated ${clock(Date.now())}`);
  render();
}

function connect() {
  if (state.source) state.source.close();
  for (const table of Object.values(state.tables)) {
    table.rows.clear();
    table.order = [];
  }
  for (const name of Object.keys(state.tables)) $(`${name}-rows`).replaceChildren();
  state.cursors = [''];
  state.next = null;
  state.timeline = [];
  state.seen.clear();
  renderTimeline();
  setStatus('connecting', 'connecting…');
  const url = `api/events?prefix=${encodeURIComponent(state.prefix)}`;
  const source = openEvents(url, {
    snapshot: onSnapshot,
    change: onChange,
    lagged: () => setStatus('connecting', 'fell behind; catching up…'),
    // The token was removed from the server: the retry asks for another.
    refused: (event) => setStatus('down', JSON.parse(event.data).error),
  });
  state.source = source;
  loadPage(false);
}

// ---------- credentials and the event stream ----------

// With [auth] on the server, the API answers 401 until the operator gives
// a token: asked once, kept in sessionStorage (this tab only), and sent as
// `Authorization: Bearer` with every call.
const TOKEN_KEY = 'fusebox-token';
let tokenAsked = null;

function askToken(message) {
  if (tokenAsked) return tokenAsked;
  tokenAsked = new Promise((resolve) => {
    const dialog = $('token-dialog');
    $('token-error').textContent = message || '';
    $('token-input').value = '';
    $('token-form').onsubmit = (event) => {
      event.preventDefault();
      const token = $('token-input').value.trim();
      if (!token) {
        $('token-error').textContent = 'Paste the token an admin gave you.';
        return;
      }
      sessionStorage.setItem(TOKEN_KEY, token);
      dialog.close();
      tokenAsked = null;
      resolve(token);
    };
    dialog.showModal();
    $('token-input').focus();
  });
  return tokenAsked;
}

// fetch() with the tab's token; on 401 asks for one and tries again.
async function authorized(url, options = {}) {
  for (;;) {
    const token = sessionStorage.getItem(TOKEN_KEY);
    const headers = { ...(options.headers || {}) };
    if (token) headers.Authorization = `Bearer ${token}`;
    const response = await fetch(url, { ...options, headers });
    if (response.status !== 401) return response;
    const body = await response.json().catch(() => ({}));
    sessionStorage.removeItem(TOKEN_KEY);
    await askToken(token ? `That token was refused: ${(body.error || {}).message || ''}` : '');
  }
}

// Server-sent events read with fetch (EventSource cannot send a token).
// Reconnects after a pause while the stream is wanted; `close()` stops it.
function openEvents(url, handlers) {
  const control = { closed: false, abort: null };
  const dispatch = (block) => {
    let name = 'message';
    const data = [];
    for (const line of block.split('\n')) {
      if (line.startsWith('event:')) name = line.slice(6).trim();
      else if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
    }
    if (data.length && handlers[name]) handlers[name]({ data: data.join('\n') });
  };
  const run = async () => {
    while (!control.closed) {
      const abort = new AbortController();
      control.abort = abort;
      try {
        const response = await authorized(url, { signal: abort.signal, headers: { Accept: 'text/event-stream' } });
        if (!response.ok) throw new Error(response.statusText);
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = '';
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value.replace(/\r\n/g, '\n');
          let end;
          while ((end = buffer.indexOf('\n\n')) >= 0) {
            dispatch(buffer.slice(0, end));
            buffer = buffer.slice(end + 2);
          }
        }
        if (!control.closed) setStatus('down', 'server unreachable: retrying…');
      } catch (err) {
        if (control.closed) return;
        setStatus('down', 'server unreachable: retrying…');
      }
      await new Promise((resolve) => { setTimeout(resolve, 2000); });
    }
  };
  run();
  return { close() { control.closed = true; if (control.abort) control.abort.abort(); } };
}

// ---------- isolate and close ----------

const ACTIONS = {
  isolate: {
    title: 'Isolate key',
    help: 'Every request on this key is refused until someone closes it.',
    button: 'Isolate',
  },
  close: {
    title: 'Close key',
    help: 'The breaker closes now and its failure counts are cleared: requests are admitted again.',
    button: 'Close',
  },
};

function askReason(key, action) {
  const a = ACTIONS[action];
  state.dialog = { key, action };
  $('reason-title').textContent = a.title;
  $('reason-key').textContent = key;
  $('reason-help').textContent = a.help;
  const submit = $('reason-submit');
  submit.textContent = a.button;
  submit.className = `primary ${action}`;
  submit.disabled = false;
  $('reason-error').textContent = '';
  $('reason-input').value = '';
  $('reason-dialog').showModal();
  $('reason-input').focus();
}

async function submitReason(event) {
  event.preventDefault();
  const { key, action } = state.dialog || {};
  if (!key) return;
  const reason = $('reason-input').value.trim();
  if (!reason) {
    $('reason-error').textContent = 'Say why, for the record.';
    $('reason-input').focus();
    return;
  }
  const submit = $('reason-submit');
  submit.disabled = true;
  try {
    const response = await authorized(`api/keys/${encodeURIComponent(key)}/${action}`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ reason }),
    });
    const body = await response.json().catch(() => ({}));
    if (!response.ok) {
      const e = body.error || {};
      $('reason-error').textContent = `${e.field ? `${e.field}: ` : ''}${e.message || response.statusText}`;
      submit.disabled = false;
      return;
    }
    $('reason-dialog').close();
    state.dialog = null;
    toast(`${action === 'isolate' ? 'Isolated' : 'Closed'} ${key}`);
  } catch (err) {
    $('reason-error').textContent = `The server did not answer: ${err.message}`;
    submit.disabled = false;
  }
}

let toastTimer = null;
function toast(text) {
  const t = $('toast');
  t.textContent = text;
  t.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { t.hidden = true; }, 4000);
}

// ---------- start ----------

function start() {
  const input = $('prefix');
  input.value = state.prefix;
  let debounce = null;
  input.addEventListener('input', () => {
    clearTimeout(debounce);
    debounce = setTimeout(() => {
      if (input.value === state.prefix) return;
      state.prefix = input.value;
      const url = new URL(location.href);
      if (state.prefix) url.searchParams.set('prefix', state.prefix);
      else url.searchParams.delete('prefix');
      history.replaceState(null, '', url);
      connect();
    }, 250);
  });
  document.addEventListener('keydown', (e) => {
    if (e.key === '/' && document.activeElement !== input && !$('reason-dialog').open) {
      e.preventDefault();
      input.focus();
    }
  });
  $('next').addEventListener('click', () => {
    if (!state.next) return;
    state.cursors.push(state.next);
    state.next = null;
    loadPage(false);
  });
  $('prev').addEventListener('click', () => {
    if (state.cursors.length <= 1) return;
    state.cursors.pop();
    loadPage(false);
  });
  $('reason-form').addEventListener('submit', submitReason);
  $('reason-cancel').addEventListener('click', () => $('reason-dialog').close());
  $('reason-dialog').addEventListener('close', () => { state.dialog = null; });
  setInterval(tick, 500);
  connect();
}

start();
