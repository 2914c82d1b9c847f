// One dead letter (`?view=dlq&topic=…&id=…`): its facts, actions, payload, headers and audit.

import { api } from './api.js';
import { discard, originalPosition, replay } from './dlq.js';
import { $, badge, clear, el, emptyRow, viewHref } from './dom.js';
import { timeEl } from './format.js';

export async function loadMessage(topic, id) {
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
