// fusebox dashboard: a live table of keys over server-sent events.
// Plain JS, no framework, no build step. Every value from the server is
// written with textContent, never as HTML.
'use strict';

const PHASE_RANK = { OPEN: 0, HALF_OPEN: 1, ISOLATED: 2, CLOSED: 3 };
const PHASE_LABEL = { OPEN: 'OPEN', HALF_OPEN: 'HALF-OPEN', ISOLATED: 'ISOLATED', CLOSED: 'CLOSED' };
const TIMELINE_MAX = 200;

const $ = (id) => document.getElementById(id);

const state = {
  prefix: new URLSearchParams(location.search).get('prefix') || '',
  source: null,
  keys: new Map(),        // key -> { data, receivedAt, row, cells }
  timeline: [],           // transitions, newest first
  seen: new Set(),        // transition sequence numbers shown
  lastChange: new Map(),  // key -> its latest transition
  counts: { OPEN: 0, HALF_OPEN: 0, ISOLATED: 0, CLOSED: 0 },
  matched: 0,
  truncated: false,
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
  for (const name of ['key', 'phase', 'break', 'fail', 'free', 'queued', 'tickets', 'why', 'actions']) {
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
  cells.break.appendChild(cells.breakText);
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
  cells.keyText.title = `${d.key}\n${d.requests} requests, ${d.turned_away} turned away; ${d.successes} successes, ${d.failures} failures`;

  let breakText = '—';
  let breakClass = 'muted';
  if (d.phase === 'OPEN' && d.open_remaining_ms !== null) {
    const left = d.open_remaining_ms - (now - entry.receivedAt);
    if (left > 0) {
      breakText = duration(left + 999);
      breakClass = 'countdown';
    } else {
      breakText = 'over: next request probes';
      breakClass = 'muted';
    }
  } else if (d.phase === 'HALF_OPEN') {
    breakText = `probing (attempt ${d.half_open_attempts})`;
    breakClass = 'probing';
  } else if (d.phase === 'ISOLATED') {
    breakText = 'until closed';
  }
  setText(cells.breakText, breakText);
  cells.breakText.className = breakClass;

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

  if (d.limit > 0) {
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
}

function sortedKeys() {
  return [...state.keys.values()].sort((a, b) =>
    (PHASE_RANK[a.data.phase] - PHASE_RANK[b.data.phase]) ||
    (a.data.key < b.data.key ? -1 : a.data.key > b.data.key ? 1 : 0));
}

function render() {
  const now = performance.now();
  const body = $('rows');
  let cursor = body.firstChild;
  for (const entry of sortedKeys()) {
    if (!entry.row) Object.assign(entry, makeRow(entry.data.key));
    fillRow(entry, now);
    // Move a row only when it is out of place, so that a button under
    // the pointer is not replaced between press and release.
    if (entry.row !== cursor) body.insertBefore(entry.row, cursor);
    else cursor = cursor.nextSibling;
  }
  while (cursor) {
    const next = cursor.nextSibling;
    if (!state.keys.has(cursor.dataset.key)) cursor.remove();
    cursor = next;
  }
  for (const phase of Object.keys(state.counts)) setText($(`n-${phase}`), String(state.counts[phase]));
  document.querySelectorAll('.count').forEach((c) =>
    c.classList.toggle('zero', state.counts[c.dataset.phase] === 0));
  const empty = $('empty');
  empty.hidden = state.keys.size > 0;
  empty.textContent = state.prefix
    ? `No live keys start with “${state.prefix}”.`
    : 'No live keys yet: a key appears when a client first asks for it.';
  setText($('shown'), state.truncated
    ? `showing ${state.keys.size} of ${state.matched} keys (broken ones first): narrow with a prefix`
    : `${state.matched} key${state.matched === 1 ? '' : 's'}`);
  document.title = state.counts.OPEN + state.counts.HALF_OPEN + state.counts.ISOLATED > 0
    ? `(${state.counts.OPEN} open) fusebox` : 'fusebox';
}

function tick() {
  const now = performance.now();
  for (const entry of state.keys.values()) if (entry.row) fillRow(entry, now);
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

function upsert(data) {
  const entry = state.keys.get(data.key);
  if (entry) {
    entry.data = data;
    entry.receivedAt = performance.now();
  } else {
    state.keys.set(data.key, { data, receivedAt: performance.now() });
  }
}

function setStatus(kind, text) {
  $('status').dataset.state = kind;
  setText($('status-text'), text);
}

function onSnapshot(event) {
  const snap = JSON.parse(event.data);
  const present = new Set(snap.keys.map((k) => k.key));
  for (const key of [...state.keys.keys()]) if (!present.has(key)) state.keys.delete(key);
  for (const k of snap.keys) upsert(k);
  state.counts = { ...snap.by_phase };
  state.matched = snap.matched;
  state.truncated = snap.truncated;
  if (snap.recent) {
    let added = false;
    for (const t of snap.recent) added = addTransition(t) || added;
    if (added) renderTimeline();
  }
  setStatus('live', `live · updated ${clock(Date.now())}`);
  render();
}

function onChange(event) {
  const { key, transition } = JSON.parse(event.data);
  const before = state.keys.get(key.key);
  if (before && state.counts[before.data.phase] > 0) state.counts[before.data.phase] -= 1;
  else if (!before) state.matched += 1;
  state.counts[key.phase] += 1;
  upsert(key);
  if (addTransition(transition)) renderTimeline();
  setStatus('live', `live · updated ${clock(Date.now())}`);
  render();
}

function connect() {
  if (state.source) state.source.close();
  state.keys.clear();
  $('rows').replaceChildren();
  state.timeline = [];
  state.seen.clear();
  renderTimeline();
  setStatus('connecting', 'connecting…');
  const url = `api/events?prefix=${encodeURIComponent(state.prefix)}`;
  const source = new EventSource(url);
  state.source = source;
  source.addEventListener('snapshot', onSnapshot);
  source.addEventListener('change', onChange);
  source.addEventListener('lagged', () => setStatus('connecting', 'fell behind; catching up…'));
  source.addEventListener('error', () => {
    if (source.readyState === EventSource.CLOSED) setStatus('down', 'disconnected: reload the page');
    else setStatus('down', 'server unreachable: retrying…');
  });
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
    const response = await fetch(`api/keys/${encodeURIComponent(key)}/${action}`, {
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
  $('reason-form').addEventListener('submit', submitReason);
  $('reason-cancel').addEventListener('click', () => $('reason-dialog').close());
  $('reason-dialog').addEventListener('close', () => { state.dialog = null; });
  setInterval(tick, 500);
  connect();
}

start();
