// The saga list (`?view=sagas`).

import { api } from './api.js';
import { $, badge, clear, el, emptyRow, shortId, viewHref } from './dom.js';
import { formatDuration, formatTime } from './format.js';
import { listQuery, pager } from './lists.js';

export const SAGA_FILTERS = ['status', 'step', 'older_than', 'customer_id', 'limit'];

export async function loadSagas(params) {
  const query = listQuery(params, SAGA_FILTERS);
  const data = await api('GET', 'v1/admin/sagas', { query });
  return () => renderSagas(query, data);
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
