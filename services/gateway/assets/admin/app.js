// sagaworks inspector: find, explain and repair stuck sagas; inspect and
// replay dead letters. Plain browser JavaScript, no framework, no build step.
//
// The view comes from the query string (`?view=sagas&status=stuck`,
// `?view=saga&id=…`, `?view=dlq&topic=order`, `?view=dlq&topic=order&id=0-3`),
// so every view is a plain link. Data comes from the gateway's admin API with
// the operator's bearer token. Everything from the API goes into the page as
// text (textContent / createElement), never as markup.
//
// `<main data-state>` says where the page is: `loading`, `ready`, `error` or
// `login`; `data-view` names the view shown.

'use strict';

const TOKEN_KEY = 'sagaworks.inspector.token';
const REFRESH_KEY = 'sagaworks.inspector.refresh';
/// The API is at the gateway's root; the page is at `<root>/admin/`.
const API_ROOT = new URL('../', window.location.href);
const SVG_NS = 'http://www.w3.org/2000/svg';
const FINISHED = new Set(['COMPLETED', 'COMPENSATED']);

const page = {
  params: new URLSearchParams(window.location.search),
  /// Reloads the current view (`background`: keep what is shown meanwhile).
  reload: null,
  /// Counts loads, so that an older answer never overwrites a newer one.
  generation: 0,
  timer: null,
  /// What the confirmation dialog will do when confirmed.
  pending: null,
  /// The saga shown in the detail view.
  saga: null,
};

// ---------------------------------------------------------------- DOM helpers

function $(selector) {
  return document.querySelector(selector);
}

/// An element with attributes (`class`, `href`, `data-*`, …) and children
/// (nodes or strings, which become text nodes; null and false are skipped).
function el(tag, attrs, ...children) {
  return build(document.createElement(tag), attrs, children);
}

function svg(tag, attrs, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

function build(node, attrs, children) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value !== null && value !== undefined && value !== false) node.setAttribute(name, String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function clear(node) {
  node.replaceChildren();
  return node;
}

function badge(value) {
  return el('span', { class: `badge ${value}` }, value);
}

/// A row saying that there is nothing to show.
function emptyRow(tbody, columns, text) {
  tbody.append(el('tr', {}, el('td', { class: 'empty', colspan: columns }, text)));
}

function shortId(id) {
  return id && id.length > 12 ? `${id.slice(0, 8)}…` : id || '—';
}

/// A link to another view of this page.
function viewHref(params) {
  const query = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== null && value !== undefined && value !== '') query.set(name, value);
  }
  return `./?${query}`;
}

// ---------------------------------------------------------------- formatting

function millis(time) {
  const t = time ? Date.parse(time) : NaN;
  return Number.isNaN(t) ? null : t;
}

/// `2026-12-04 19:00:00Z`: UTC, to the second, the same for every operator.
function formatTime(time) {
  const t = millis(time);
  return t === null ? '—' : new Date(t).toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
}

function timeEl(time) {
  return time ? el('time', { datetime: time, title: time }, formatTime(time)) : '—';
}

function formatDuration(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return '—';
  if (ms < 0) ms = 0;
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 10000) return `${(ms / 1000).toFixed(1)} s`;
  const s = Math.round(ms / 1000);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

function between(start, end) {
  const a = millis(start);
  const b = millis(end);
  return a === null || b === null ? null : b - a;
}

// ---------------------------------------------------------------- the token

/// `#token=<jwt>` in the URL: kept for this tab, then taken out of the URL.
function takeTokenFromFragment() {
  const fragment = new URLSearchParams(window.location.hash.replace(/^#/, ''));
  const token = fragment.get('token');
  if (!token) return;
  sessionStorage.setItem(TOKEN_KEY, token.trim());
  history.replaceState(history.state, '', window.location.pathname + window.location.search);
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  route();
}

// ---------------------------------------------------------------- the API

/// An answer other than 2xx, as problem+json (or made into one).
class ApiProblem extends Error {
  constructor(problem) {
    super(problem.title || 'Request failed');
    this.problem = problem;
  }
}

/// A fresh Idempotency-Key (crypto.randomUUID needs a secure context).
function newKey() {
  if (window.crypto.randomUUID) return window.crypto.randomUUID();
  const b = window.crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const h = Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

/// Calls the API: `path` relative to the gateway's root (`v1/admin/…`).
async function api(method, path, { query, body, key } = {}) {
  const url = new URL(path, API_ROOT);
  for (const [name, value] of Object.entries(query || {})) {
    if (value !== null && value !== undefined && value !== '') url.searchParams.set(name, value);
  }
  const headers = { Accept: 'application/json, application/problem+json' };
  if (token()) headers.Authorization = `Bearer ${token()}`;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  if (key) headers['Idempotency-Key'] = key;
  let response;
  try {
    response = await fetch(url, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: 'no-store',
      credentials: 'omit',
    });
  } catch (e) {
    throw new ApiProblem({ title: 'The gateway did not answer', detail: String(e.message || e) });
  }
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch (_) {
    data = null;
  }
  if (!response.ok) {
    const problem = data && typeof data === 'object' ? data : {};
    throw new ApiProblem({
      ...problem,
      title: problem.title || response.statusText || 'Request failed',
      status: problem.status || response.status,
      detail: problem.detail || (data === null ? text.slice(0, 500) : undefined),
    });
  }
  return data;
}

// ---------------------------------------------------------------- messages

/// Fills `box` with a problem: title and status, detail, field errors.
function renderProblem(box, problem) {
  clear(box);
  const status = problem.status ? ` (${problem.status})` : '';
  box.append(el('h2', {}, `${problem.title || 'Error'}${status}`));
  if (problem.detail) box.append(el('p', {}, problem.detail));
  if (Array.isArray(problem.errors) && problem.errors.length) {
    box.append(el('ul', {}, problem.errors.map((e) => el('li', {}, el('code', {}, e.field || '?'), `: ${e.message || ''}`))));
  }
  if (problem.type && problem.type !== 'about:blank') box.append(el('p', { class: 'hint' }, `type: ${problem.type}`));
  box.hidden = false;
}

function showProblem(error) {
  const problem = error instanceof ApiProblem ? error.problem : { title: 'Error in the page', detail: String(error) };
  renderProblem($('#problem'), problem);
}

function clearProblem() {
  clear($('#problem')).hidden = true;
}

function notify(text) {
  $('#notice').textContent = text;
}

// ---------------------------------------------------------------- views and loading

const VIEWS = ['login', 'sagas', 'saga', 'dlq', 'dlq-message'];
/// Views that stay shown when their data cannot be loaded: their filters may be what to fix.
const KEEP_ON_ERROR = new Set(['sagas', 'dlq']);

function setState(state, view) {
  const main = $('#main');
  main.dataset.state = state;
  if (view !== undefined) main.dataset.view = view;
  main.setAttribute('aria-busy', state === 'loading' ? 'true' : 'false');
}

/// Shows view `name` (none when null) and marks its section in the navigation.
function showView(name, view = name) {
  for (const each of VIEWS) $(`#view-${each}`).hidden = each !== name;
  $('#sign-out').hidden = name === 'login' || !token();
  const section = view === 'dlq' || view === 'dlq-message' ? 'dlq' : 'sagas';
  for (const link of ['sagas', 'dlq']) {
    const a = $(`#nav-${link}`);
    if (link === section && view !== 'login') a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
}

/// Shows the view the URL names and loads its data.
function route() {
  clearProblem();
  if (!token()) {
    showView('login');
    setState('login', 'login');
    $('#token').focus();
    return;
  }
  const p = page.params;
  const view = p.get('view') || 'sagas';
  if (view === 'saga' && p.get('id')) {
    page.reload = (background) => load('saga', background, () => loadSaga(p.get('id')));
  } else if (view === 'dlq' && p.get('topic') && p.get('id')) {
    page.reload = (background) => load('dlq-message', background, () => loadMessage(p.get('topic'), p.get('id')));
  } else if (view === 'dlq') {
    $('#dlq-filters').elements.topic.value = p.get('topic') || '';
    fillForm($('#dlq-filters'), DLQ_FILTERS, listQuery(p, DLQ_FILTERS));
    page.reload = (background) => load('dlq', background, () => loadDlq(p));
  } else {
    fillForm($('#saga-filters'), SAGA_FILTERS, listQuery(p, SAGA_FILTERS));
    page.reload = (background) => load('sagas', background, () => loadSagas(p));
  }
  page.reload(false);
}

/// Runs a view's loader and shows the view with its data; marks the page
/// ready (or failed) when done. A loader fetches and returns the function
/// that renders what it fetched (which may throw a problem of its own). A
/// background load (auto-refresh) leaves the page as it is until then.
async function load(view, background, loader) {
  const generation = ++page.generation;
  if (!background) setState('loading', view);
  else $('#main').setAttribute('aria-busy', 'true');
  try {
    const render = await loader();
    if (generation !== page.generation) return;
    showView(view);
    clearProblem();
    render();
    setState('ready', view);
  } catch (error) {
    if (generation !== page.generation) return;
    showProblem(error);
    if (error instanceof ApiProblem && error.problem.status === 401) {
      sessionStorage.removeItem(TOKEN_KEY);
      showView('login');
      setState('login', 'login');
      return;
    }
    // What is shown stays on a failed refresh; a detail that cannot be loaded is not shown.
    if (!background) showView(KEEP_ON_ERROR.has(view) ? view : null, view);
    setState('error', view);
  } finally {
    if (generation === page.generation) scheduleRefresh();
  }
}

// ---------------------------------------------------------------- auto-refresh

function scheduleRefresh() {
  window.clearTimeout(page.timer);
  if (!$('#auto-refresh').checked) return;
  const seconds = Number($('#refresh-every').value) || 10;
  page.timer = window.setTimeout(refreshNow, seconds * 1000);
}

function refreshNow() {
  // Not while the operator is confirming an action or the tab is hidden.
  if ($('#confirm').open || document.hidden || !page.reload || !token()) {
    scheduleRefresh();
    return;
  }
  page.reload(true);
}

function setUpRefresh() {
  const saved = sessionStorage.getItem(REFRESH_KEY);
  if (saved) {
    const [on, every] = saved.split(':');
    $('#auto-refresh').checked = on === 'on';
    if ([...$('#refresh-every').options].some((o) => o.value === every)) $('#refresh-every').value = every;
  }
  const save = () => {
    sessionStorage.setItem(REFRESH_KEY, `${$('#auto-refresh').checked ? 'on' : 'off'}:${$('#refresh-every').value}`);
    scheduleRefresh();
  };
  $('#auto-refresh').addEventListener('change', save);
  $('#refresh-every').addEventListener('change', save);
  $('#refresh-now').addEventListener('click', () => page.reload && page.reload(true));
}

// ---------------------------------------------------------------- saga list

const SAGA_FILTERS = ['status', 'step', 'older_than', 'customer_id', 'limit'];

/// The list's query from the page's URL (`names` and `cursor`).
function listQuery(params, names) {
  const query = {};
  for (const name of [...names, 'cursor']) query[name] = params.get(name) || '';
  return query;
}

async function loadSagas(params) {
  const query = listQuery(params, SAGA_FILTERS);
  const data = await api('GET', 'v1/admin/sagas', { query });
  return () => renderSagas(query, data);
}

/// Shows the filters in use in their form (once: a refresh must not undo the operator's typing).
function fillForm(form, names, values) {
  for (const name of names) if (values[name]) form.elements[name].value = values[name];
}

function renderSagas(query, data) {
  const tbody = clear($('#sagas-table tbody'));
  const sagas = data.sagas || [];
  for (const s of sagas) tbody.append(sagaRow(s, query.status === 'stuck'));
  if (!sagas.length) emptyRow(tbody, 8, 'No saga matches these filters.');
  const filters = SAGA_FILTERS.filter((n) => query[n] && n !== 'limit').map((n) => `${n} = ${query[n]}`);
  $('#sagas-summary').textContent =
    `${sagas.length} saga${sagas.length === 1 ? '' : 's'}${filters.length ? ` (${filters.join(', ')})` : ''}` +
    `${query.cursor ? ', a later page' : ''}; updated ${formatTime(new Date().toISOString())}.`;
  const base = { view: 'sagas' };
  for (const name of SAGA_FILTERS) base[name] = query[name];
  pager('#sagas-first', '#sagas-next', base, query.cursor, data.next_cursor);
}

function sagaRow(s, stuck) {
  const link = el('a', { href: viewHref({ view: 'saga', id: s.saga_id }), 'aria-label': `Saga ${s.saga_id}` },
    el('span', { class: 'id' }, shortId(s.saga_id)));
  return el('tr', { 'data-saga-id': s.saga_id },
    el('td', { title: s.saga_id }, link),
    el('td', { title: s.order_id }, el('span', { class: 'id' }, shortId(s.order_id))),
    el('td', {}, badge(s.status), stuck ? badge('stuck') : null),
    el('td', {}, s.current_step ? el('code', {}, s.current_step) : '—'),
    el('td', { class: 'num' }, String(s.attempts ?? '')),
    el('td', { class: 'num' }, formatDuration((s.idle_secs || 0) * 1000)),
    el('td', { class: 'num' }, formatDuration((s.age_secs || 0) * 1000)),
    el('td', { class: 'error' }, s.last_error || s.failure_reason || ''));
}

/// "First page" and "Next page" links of a keyset-paginated list.
function pager(firstSel, nextSel, base, cursor, nextCursor) {
  const first = $(firstSel);
  const next = $(nextSel);
  first.hidden = !cursor;
  first.setAttribute('href', viewHref(base));
  next.hidden = !nextCursor;
  next.setAttribute('href', viewHref({ ...base, cursor: nextCursor || '' }));
}

// ---------------------------------------------------------------- saga detail

async function loadSaga(id) {
  const saga = await api('GET', `v1/admin/sagas/${encodeURIComponent(id)}`);
  return () => renderSaga(saga);
}

function renderSaga(saga) {
  $('#saga-title').textContent = `Saga ${saga.saga_id}`;
  document.title = `Saga ${shortId(saga.saga_id)} · sagaworks inspector`;
  const facts = clear($('#saga-facts'));
  const fact = (name, ...value) => facts.append(el('dt', {}, name), el('dd', {}, ...value));
  fact('Saga', el('code', {}, saga.saga_id));
  fact('Order', el('code', {}, saga.order_id));
  fact('Status', badge(saga.status));
  fact('Current step', saga.current_step ? el('code', {}, saga.current_step) : '— (finished)');
  if (saga.failure_reason) facts.append(el('dt', {}, 'Failure reason'), el('dd', { class: 'error' }, saga.failure_reason));
  fact('Created', timeEl(saga.created_at));
  fact('Last progress', timeEl(saga.progressed_at),
    saga.progressed_at ? ` (${formatDuration(Date.now() - millis(saga.progressed_at))} ago)` : '');
  fact('Updated', timeEl(saga.updated_at));
  if (saga.trace_id) {
    const url = saga.trace_url && /^https?:\/\//i.test(saga.trace_url) ? saga.trace_url : null;
    fact('Trace', url ? el('a', { href: url, rel: 'noopener noreferrer', target: '_blank' }, saga.trace_id)
      : el('code', {}, saga.trace_id));
  }
  renderSagaButtons(saga);
  const attempts = attemptsOf(saga);
  drawTimeline(clear($('#timeline')), saga, attempts);
  renderSteps(saga, attempts);
  renderAudit(saga.actions || []);
}

function renderSagaButtons(saga) {
  const finished = FINISHED.has(saga.status);
  const compensating = saga.status === 'COMPENSATING';
  $('#act-retry').disabled = finished;
  $('#act-resolve').disabled = finished;
  $('#act-compensate').disabled = finished || compensating;
  let hint = 'Retry now runs the current step again at once. Compensate aborts the saga (before its pivot) ' +
    'and undoes what may have taken effect. Resolve states the current step\'s effect by hand.';
  if (finished) hint = 'The saga has finished: there is nothing to act on.';
  else if (compensating) hint = 'The saga is compensating already: retry or resolve the compensation step.';
  $('#saga-actions-hint').textContent = hint;
  page.saga = saga;
}

function renderAudit(actions) {
  const tbody = clear($('#audit-table tbody'));
  for (const a of actions) {
    tbody.append(el('tr', {},
      el('td', {}, timeEl(a.at)), el('td', {}, a.action), el('td', {}, el('code', {}, a.step)),
      el('td', {}, a.actor), el('td', {}, a.reason)));
  }
  if (!actions.length) emptyRow(tbody, 5, 'No operator has acted on this saga.');
}

// ---------------------------------------------------------------- the step timeline

function lastOutcome(step) {
  const history = step.history || [];
  return history.length ? history[history.length - 1].outcome : null;
}

/// The names of the saga's compensation steps (each step's `role` comes
/// from the saga's definition).
function compensationSteps(saga) {
  return new Set((saga.steps || []).filter((s) => s.role === 'compensation').map((s) => s.name));
}

/// Every attempt of every step, in the order they started; a running step's
/// current (or next) attempt last in its lane.
function attemptsOf(saga) {
  const compensations = compensationSteps(saga);
  const list = [];
  (saga.steps || []).forEach((step, lane) => {
    const phase = compensations.has(step.name) ? 'compensation' : 'forward';
    const history = step.history || [];
    for (const a of history) {
      list.push({
        lane, step, phase, kind: 'attempt', attempt: a.attempt, outcome: a.outcome, error: a.error || null,
        start: a.started_at, end: a.ended_at,
      });
    }
    if (step.status === 'RUNNING') {
      const last = history[history.length - 1];
      const waiting = Boolean(last) && last.attempt >= step.attempts;
      list.push({
        lane, step, phase, kind: 'current',
        attempt: waiting ? step.attempts + 1 : step.attempts,
        outcome: waiting ? 'waiting' : 'running',
        error: step.error || null,
        start: last ? last.ended_at : step.started_at,
        end: null,
      });
    }
  });
  const order = (a) => millis(a.start) ?? Number.MAX_SAFE_INTEGER;
  return list.sort((a, b) => order(a) - order(b) || a.lane - b.lane || a.attempt - b.attempt);
}

function attemptDuration(a) {
  return a.end ? between(a.start, a.end) : between(a.start, new Date().toISOString());
}

function attemptSummary(a) {
  const took = a.kind === 'current' ? `for ${formatDuration(attemptDuration(a))}` : formatDuration(attemptDuration(a));
  return `${a.step.name}, attempt ${a.attempt}: ${a.outcome}, ${took}`;
}

const BOX = { label: 170, column: 176, width: 152, lane: 70, height: 56, top: 12 };

/// The picture: one lane per step (compensations in their own colour), one
/// box per attempt, left to right in the order they started, with how long
/// each took and how long the saga waited in between.
function drawTimeline(container, saga, attempts) {
  const steps = saga.steps || [];
  if (!steps.length) {
    container.append(el('p', { class: 'empty' }, 'No step has started yet.'));
    return;
  }
  const width = BOX.label + Math.max(attempts.length, 1) * BOX.column + 12;
  const height = BOX.top + steps.length * BOX.lane + 4;
  const picture = svg('svg', {
    width, height, viewBox: `0 0 ${width} ${height}`, role: 'img', 'aria-labelledby': 'timeline-svg-title',
    'aria-describedby': 'timeline-svg-desc', 'data-attempts': attempts.length,
  });
  picture.append(
    svg('title', { id: 'timeline-svg-title' }, `Step timeline: ${attempts.length} attempts of ${steps.length} steps`),
    svg('desc', { id: 'timeline-svg-desc' }, attempts.map(attemptSummary).join('; ')),
    svg('defs', {}, svg('marker', {
      id: 'arrow', viewBox: '0 0 10 10', refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: 'auto',
    }, svg('path', { d: 'M0,0 L10,5 L0,10 z' }))));
  const compensations = compensationSteps(saga);
  steps.forEach((step, lane) => picture.append(laneLabel(step, lane, width, compensations.has(step.name))));
  attempts.forEach((a, i) => {
    if (i > 0) picture.append(link(attempts[i - 1], i - 1, a, i));
    picture.append(attemptBox(a, i));
  });
  container.append(picture);
}

function laneY(lane) {
  return BOX.top + lane * BOX.lane;
}

function laneLabel(step, lane, width, compensation) {
  const y = laneY(lane);
  return svg('g', { class: 'lane' },
    svg('line', { class: 'lane-line', x1: 0, x2: width, y1: y + BOX.lane - 6, y2: y + BOX.lane - 6 }),
    svg('text', { class: 'lane-label', x: 4, y: y + 24 }, step.name),
    svg('text', { class: 'lane-phase', x: 4, y: y + 42 },
      `${compensation ? 'compensation' : 'forward'} · ${step.status.toLowerCase()}`));
}

function attemptBox(a, column) {
  const x = BOX.label + column * BOX.column;
  const y = laneY(a.lane);
  const took = attemptDuration(a);
  const line2 = a.kind === 'current'
    ? `${a.outcome} · ${formatDuration(took)}`
    : `${a.outcome} · took ${formatDuration(took)}`;
  const tooltip = [
    `${a.step.name}, attempt ${a.attempt} (${a.phase})`,
    `outcome: ${a.outcome}`,
    `started: ${formatTime(a.start)}`,
    a.end ? `ended: ${formatTime(a.end)}` : null,
    `duration: ${formatDuration(took)}`,
    a.error ? `error: ${a.error}` : null,
  ].filter(Boolean).join('\n');
  const outcomeClass = `o-${String(a.outcome).replace(/[^a-z]/g, '')}`;
  return svg('g', {
    class: `box ${a.kind === 'current' ? 'current' : a.phase} ${outcomeClass}`,
    'data-kind': a.kind, 'data-step': a.step.name, 'data-attempt': a.attempt, 'data-phase': a.phase,
    'data-outcome': a.outcome, 'data-duration-ms': took === null ? '' : Math.round(took),
  },
  svg('title', {}, tooltip),
  svg('rect', { class: 'body', x, y, width: BOX.width, height: BOX.height, rx: 5 }),
  svg('rect', { class: 'stripe', x: x + 1, y: y + 1, width: 5, height: BOX.height - 2, rx: 2 }),
  svg('text', { class: 'title', x: x + 12, y: y + 17 }, a.step.name),
  svg('text', { class: 'detail', x: x + 12, y: y + 33 }, `attempt ${a.attempt}`),
  svg('text', { class: 'detail', x: x + 12, y: y + 48 }, line2));
}

/// An arrow from one attempt to the next, with the wait between them.
function link(from, fromColumn, to, toColumn) {
  const x1 = BOX.label + fromColumn * BOX.column + BOX.width;
  const x2 = BOX.label + toColumn * BOX.column;
  const y1 = laneY(from.lane) + BOX.height / 2;
  const y2 = laneY(to.lane) + BOX.height / 2;
  const mid = (x1 + x2) / 2;
  const group = svg('g', {}, svg('path', { class: 'link', d: `M${x1},${y1} H${mid} V${y2} H${x2 - 1}` }));
  const wait = from.end ? between(from.end, to.start) : null;
  if (wait !== null && wait >= 1000) {
    group.append(svg('text', { class: 'gap', x: x1 + 2, y: Math.min(y1, y2) - 4 }, `+${formatDuration(wait)}`));
  }
  return group;
}

/// The same attempts as a table (the picture's text alternative).
function renderSteps(saga, attempts) {
  const tbody = clear($('#steps-table tbody'));
  for (const a of attempts) {
    tbody.append(el('tr', { 'data-kind': a.kind },
      el('td', {}, el('code', {}, a.step.name)),
      el('td', {}, a.phase),
      el('td', {}, badge(a.step.status)),
      el('td', { class: 'num' }, String(a.attempt)),
      el('td', {}, badge(a.outcome)),
      el('td', {}, timeEl(a.start)),
      el('td', {}, a.end ? timeEl(a.end) : '—'),
      el('td', { class: 'num' }, formatDuration(attemptDuration(a))),
      el('td', { class: 'error' }, a.error || '')));
  }
  if (!attempts.length) emptyRow(tbody, 9, 'No step has started yet.');
}

// ---------------------------------------------------------------- saga actions

const SAGA_ACTIONS = {
  retry: { title: 'Retry now', submit: 'Retry now', text: 'runs its current step again at once' },
  compensate: {
    title: 'Compensate', submit: 'Compensate', danger: true,
    text: 'aborts it: whatever may have taken effect is compensated and the order ends CANCELLED',
  },
  resolve: { title: 'Resolve the current step', submit: 'Resolve', text: 'records the current step\'s effect as done by hand; the saga goes on from there' },
};

function actOnSaga(action) {
  const saga = page.saga;
  if (!saga) return;
  const spec = SAGA_ACTIONS[action];
  const step = saga.current_step || '—';
  confirmAction({
    title: `${spec.title}: saga ${shortId(saga.saga_id)}`,
    text: `This ${spec.text}. Saga ${saga.saga_id}, status ${saga.status}, current step ${step}.`,
    submit: spec.submit,
    danger: spec.danger,
    output: action === 'resolve' && saga.current_step === 'reserve_stock',
    run: async (reason, output, key) => {
      const body = output === undefined ? { reason } : { reason, output };
      const path = `v1/admin/sagas/${encodeURIComponent(saga.saga_id)}/${action}`;
      const result = await api('POST', path, { body, key });
      notify(result.replayed
        ? `${spec.title}: this Idempotency-Key was used before; nothing was done again (step ${result.step}).`
        : `${spec.title} done on step ${result.step}.`);
      renderSaga(result.saga);
    },
  });
}

// ---------------------------------------------------------------- the confirmation dialog

/// Asks for a reason (and, when `output`, a step output as JSON); `run`
/// gets them with a fresh Idempotency-Key. A problem stays in the dialog;
/// confirming again sends the same key, so a retry never acts twice.
function confirmAction({ title, text, submit, danger, output, run }) {
  notify('');
  $('#confirm-title').textContent = title;
  $('#confirm-text').textContent = text;
  $('#confirm-reason').value = '';
  $('#confirm-output').value = '';
  $('#confirm-output-field').hidden = !output;
  clear($('#confirm-problem')).hidden = true;
  const ok = $('#confirm-ok');
  ok.textContent = submit;
  ok.classList.toggle('danger', Boolean(danger));
  ok.disabled = false;
  const key = newKey();
  $('#confirm-key').textContent = key;
  page.pending = { run, key, output: Boolean(output) };
  $('#confirm').showModal();
  $('#confirm-reason').focus();
}

async function onConfirm(event) {
  event.preventDefault();
  const pending = page.pending;
  const form = $('#confirm-form');
  if (!pending || !form.reportValidity()) return;
  const reason = $('#confirm-reason').value.trim();
  if (!reason) {
    renderProblem($('#confirm-problem'), { title: 'A reason is needed', detail: 'Say why; it is recorded with the action.' });
    return;
  }
  let output;
  const outputText = $('#confirm-output').value.trim();
  if (pending.output && outputText) {
    try {
      output = JSON.parse(outputText);
    } catch (e) {
      renderProblem($('#confirm-problem'), { title: 'The step output is not JSON', detail: String(e.message) });
      return;
    }
  }
  const ok = $('#confirm-ok');
  ok.disabled = true;
  try {
    await pending.run(reason, output, pending.key);
    page.pending = null;
    $('#confirm').close();
    clearProblem();
  } catch (error) {
    const problem = error instanceof ApiProblem ? error.problem : { title: 'Error in the page', detail: String(error) };
    renderProblem($('#confirm-problem'), problem);
  } finally {
    ok.disabled = false;
  }
}

function setUpDialog() {
  $('#confirm-form').addEventListener('submit', onConfirm);
  $('#confirm-cancel').addEventListener('click', () => $('#confirm').close());
  // (`close` fires a task later: clearing `page.pending` there could clear the next dialog's.)
  $('#confirm').addEventListener('close', scheduleRefresh);
}

// ---------------------------------------------------------------- dead letters

const DLQ_FILTERS = ['state', 'key', 'limit'];

async function loadDlq(params) {
  const topic = params.get('topic');
  const query = listQuery(params, DLQ_FILTERS);
  const topics = await api('GET', 'v1/admin/dlq');
  let messages = { messages: [] };
  let failure = null;
  if (topic) {
    try {
      messages = await api('GET', `v1/admin/dlq/${encodeURIComponent(topic)}/messages`, { query });
    } catch (error) {
      // The topics are shown all the same; the problem with them.
      failure = error;
    }
  }
  return () => {
    renderDlq(topic, topics, query, messages);
    if (failure) throw failure;
  };
}

function renderDlq(topic, topics, query, messages) {
  const tbody = clear($('#dlq-topics tbody'));
  for (const t of topics.topics || []) {
    const current = t.topic === topic;
    tbody.append(el('tr', { 'data-topic': t.topic },
      el('th', { scope: 'row' }, el('a', { href: viewHref({ view: 'dlq', topic: t.topic }), 'aria-current': current ? 'true' : null }, t.topic)),
      el('td', {}, el('code', {}, t.dlq_topic)),
      el('td', { class: 'num' }, String(t.messages)),
      el('td', { class: 'num' }, String(t.pending))));
  }
  if (!(topics.topics || []).length) emptyRow(tbody, 4, 'No dead-letter topics.');
  $('#dlq-messages-section').hidden = !topic;
  if (topic) renderMessages(topic, query, messages);
}

function renderMessages(topic, query, data) {
  $('#dlq-messages-title').textContent = `Messages dead-lettered from ${topic}`;
  const tbody = clear($('#dlq-messages tbody'));
  const list = data.messages || [];
  for (const m of list) tbody.append(messageRow(topic, m));
  if (!list.length) emptyRow(tbody, 10, 'No dead letter matches these filters.');
  $('#dlq-summary').textContent = `${list.length} message${list.length === 1 ? '' : 's'}` +
    `${query.cursor ? ', a later page' : ''}; oldest first; updated ${formatTime(new Date().toISOString())}.`;
  const replayKey = $('#dlq-replay-key');
  replayKey.hidden = !query.key;
  replayKey.onclick = () => replay(topic, { key: query.key }, `every pending message of key ${query.key}`);
  $('#dlq-replay-all').onclick = () => replay(topic, { all: true }, `every pending message dead-lettered from ${topic}`);
  const base = { view: 'dlq', topic };
  for (const name of DLQ_FILTERS) base[name] = query[name];
  pager('#dlq-first', '#dlq-next', base, query.cursor, data.next_cursor);
}

function originalPosition(m) {
  const o = m.original || {};
  return `${o.topic ?? '?'} · partition ${o.partition ?? '?'} · offset ${o.offset ?? '?'}`;
}

function messageRow(topic, m) {
  const pending = m.state === 'pending';
  const buttons = el('td', { class: 'row-actions' },
    el('a', { href: viewHref({ view: 'dlq', topic, id: m.id }), class: 'button secondary small', 'aria-label': `View message ${m.id}` }, 'View'),
    actionButton('Replay', `Replay message ${m.id}`, !pending, () => replay(topic, { id: m.id }, `message ${m.id}`)),
    actionButton('Replay key', `Replay every pending message of key ${m.key}`, !pending || m.key === null || m.key === undefined,
      () => replay(topic, { key: m.key }, `every pending message of key ${m.key}`)),
    actionButton('Discard', `Discard message ${m.id}`, !pending, () => discard(topic, m.id), 'danger'));
  return el('tr', { 'data-message-id': m.id },
    el('td', { class: 'nowrap' }, el('code', {}, m.id)),
    el('td', {}, badge(m.state)),
    el('td', { title: m.key || '' }, m.key === null || m.key === undefined ? '—' : el('code', {}, m.key)),
    el('td', {}, originalPosition(m)),
    el('td', {}, m.group || '—'),
    el('td', {}, m.event_type || '—'),
    el('td', { class: 'error' }, m.error || ''),
    el('td', { class: 'num' }, String(m.attempts ?? '')),
    el('td', {}, timeEl(m.dead_lettered_at)),
    buttons);
}

function actionButton(label, ariaLabel, disabled, onClick, extra) {
  const button = el('button', { type: 'button', class: `small ${extra || ''}`.trim(), 'aria-label': ariaLabel }, label);
  button.disabled = disabled;
  button.addEventListener('click', onClick);
  return button;
}

/// Replays `selector` (`{id}`, `{key}` or `{all: true}`) after confirmation.
function replay(topic, selector, what) {
  confirmAction({
    title: `Replay ${what}`,
    text: `Sends ${what} back to topic ${topic}, each key's messages in their original order. ` +
      'Only pending messages are sent.',
    submit: 'Replay',
    danger: Boolean(selector.all),
    run: async (reason, _output, key) => {
      const result = await api('POST', `v1/admin/dlq/${encodeURIComponent(topic)}/replay`, { body: { reason, ...selector }, key });
      const ids = result.replayed || [];
      notify(result.replay
        ? 'This Idempotency-Key was used before: nothing was sent again.'
        : `Replayed ${ids.length} message${ids.length === 1 ? '' : 's'}${ids.length ? `: ${ids.join(', ')}` : ''}.`);
      page.reload(true);
    },
  });
}

function discard(topic, id) {
  confirmAction({
    title: `Discard message ${id}`,
    text: `Marks dead letter ${id} of topic ${topic} as discarded: it will never be replayed. The message stays for inspection.`,
    submit: 'Discard',
    danger: true,
    run: async (reason, _output, key) => {
      const path = `v1/admin/dlq/${encodeURIComponent(topic)}/messages/${encodeURIComponent(id)}/discard`;
      const result = await api('POST', path, { body: { reason }, key });
      notify(result.replay ? 'This Idempotency-Key was used before: nothing changed.' : `Message ${result.id} discarded.`);
      page.reload(true);
    },
  });
}

// ---------------------------------------------------------------- one dead letter

async function loadMessage(topic, id) {
  const path = `v1/admin/dlq/${encodeURIComponent(topic)}/messages/${encodeURIComponent(id)}`;
  const m = await api('GET', path);
  return () => renderMessage(topic, m);
}

function renderMessage(topic, m) {
  $('#message-back').setAttribute('href', viewHref({ view: 'dlq', topic }));
  $('#message-title').textContent = `Dead letter ${m.id} of ${topic}`;
  const facts = clear($('#message-facts'));
  const fact = (name, ...value) => facts.append(el('dt', {}, name), el('dd', {}, ...value));
  fact('Id', el('code', {}, m.id), ` in ${m.dlq_topic}`);
  fact('State', badge(m.state));
  fact('Key', m.key === null || m.key === undefined ? '— (none)' : el('code', {}, m.key));
  fact('Original position', originalPosition(m));
  fact('Consumer group', m.group || '—');
  fact('Event', m.event_type || '— (no ce_type)', m.event_id ? ` · ${m.event_id}` : '');
  fact('Reason', m.reason ? el('code', {}, m.reason) : '—');
  facts.append(el('dt', {}, 'Error'), el('dd', { class: 'error' }, m.error || ''));
  fact('Attempts', String(m.attempts ?? ''));
  fact('Dead-lettered', timeEl(m.dead_lettered_at));

  const pending = m.state === 'pending';
  const hasKey = m.key !== null && m.key !== undefined;
  $('#msg-replay').disabled = !pending;
  $('#msg-replay').onclick = () => replay(topic, { id: m.id }, `message ${m.id}`);
  $('#msg-replay-key').disabled = !pending || !hasKey;
  $('#msg-replay-key').onclick = () => replay(topic, { key: m.key }, `every pending message of key ${m.key}`);
  $('#msg-discard').disabled = !pending;
  $('#msg-discard').onclick = () => discard(topic, m.id);
  $('#message-actions-hint').textContent = pending
    ? 'Replay sends it back to its original topic; discard marks it as never to be replayed.'
    : `This message is ${m.state}: nothing more to do with it.`;

  renderPayload(m);
  const headers = clear($('#message-headers tbody'));
  const names = Object.keys(m.headers || {}).sort();
  for (const name of names) {
    headers.append(el('tr', {}, el('th', { scope: 'row' }, el('code', {}, name)), el('td', { class: 'mono' }, m.headers[name])));
  }
  if (!names.length) emptyRow(headers, 2, 'No headers.');
  const audit = clear($('#message-audit tbody'));
  for (const a of m.actions || []) {
    audit.append(el('tr', {}, el('td', {}, timeEl(a.at)), el('td', {}, a.action), el('td', {}, a.actor), el('td', {}, a.reason)));
  }
  if (!(m.actions || []).length) emptyRow(audit, 4, 'No operator has acted on this message.');
}

/// The payload as text; JSON indented.
function renderPayload(m) {
  let text = m.payload ?? '';
  let json = false;
  try {
    text = JSON.stringify(JSON.parse(text), null, 2);
    json = true;
  } catch (_) {
    json = false;
  }
  $('#payload').textContent = text === '' ? '(empty)' : text;
  const size = `${m.payload_bytes ?? text.length} bytes`;
  $('#payload-note').textContent = `${size}${json ? ', JSON (indented here)' : ''}` +
    `${m.payload_truncated ? '; truncated: only the first 64 KiB are shown' : ''}.`;
}

// ---------------------------------------------------------------- start

function setUpLogin() {
  $('#login-form').addEventListener('submit', (event) => {
    event.preventDefault();
    const value = $('#token').value.trim().replace(/^Bearer\s+/i, '');
    if (!value) return;
    sessionStorage.setItem(TOKEN_KEY, value);
    $('#token').value = '';
    route();
  });
  $('#sign-out').addEventListener('click', signOut);
}

function setUpSagaButtons() {
  for (const action of Object.keys(SAGA_ACTIONS)) {
    $(`#act-${action}`).addEventListener('click', () => actOnSaga(action));
  }
}

function start() {
  takeTokenFromFragment();
  setUpLogin();
  setUpRefresh();
  setUpDialog();
  setUpSagaButtons();
  document.addEventListener('visibilitychange', () => {
    if (!document.hidden) scheduleRefresh();
  });
  route();
}

start();
