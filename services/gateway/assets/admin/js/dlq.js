// Dead letters (`?view=dlq&topic=…`): the topics, a topic's messages, replay and discard.

import { api } from './api.js';
import { confirmAction } from './confirm.js';
import { $, badge, clear, el, emptyRow, viewHref } from './dom.js';
import { formatTime, timeEl } from './format.js';
import { listQuery, pager } from './lists.js';
import { notify } from './messages.js';
import { page } from './state.js';

export const DLQ_FILTERS = ['state', 'key', 'limit'];

export async function loadDlq(params) {
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

export function originalPosition(m) {
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
export function replay(topic, selector, what) {
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

export function discard(topic, id) {
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
