// One saga (`?view=saga&id=…`): its facts, actions, timeline, steps and audit.

import { api } from './api.js';
import { $, badge, clear, el, emptyRow, shortId } from './dom.js';
import { formatDuration, millis, timeEl } from './format.js';
import { page } from './state.js';
import { attemptsOf, drawTimeline, renderSteps } from './timeline.js';

const FINISHED = new Set(['COMPLETED', 'COMPENSATED']);

export async function loadSaga(id) {
  const saga = await api('GET', `v1/admin/sagas/${encodeURIComponent(id)}`);
  return () => renderSaga(saga);
}

export function renderSaga(saga) {
  $('#saga-title').textContent = `Saga ${saga.saga_id}`;
  document.title = `Saga ${shortId(saga.saga_id)} · sagaworks inspector`;
  const facts = clear($('#saga-facts'));
  const fact = (name, ...value) => facts.append(el('dt', {}, name), el('dd', {}, ...value));
  fact('Saga', el('code', {}, saga.saga_id));
  fact('Order', el('code', {}, saga.order_id));
  fact('Status', badge(saga.status));
  // The version of the saga's definition it started on (docs/design.md, "Changing a saga").
  fact('Version', `v${saga.version}`);
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
