// The step timeline: a saga's attempts as a picture and as a table.

import { $, badge, clear, el, emptyRow, svg } from './dom.js';
import { between, formatDuration, formatTime, millis, timeEl } from './format.js';

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
export function attemptsOf(saga) {
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
export function drawTimeline(container, saga, attempts) {
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
export function renderSteps(saga, attempts) {
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
