// The confirmation dialog: a reason (and a step output), sent with an Idempotency-Key.

import { ApiProblem, newKey } from './api.js';
import { $, clear } from './dom.js';
import { clearProblem, notify, renderProblem } from './messages.js';
import { scheduleRefresh } from './refresh.js';
import { page } from './state.js';

/// Asks for a reason (and, when `output`, a step output as JSON); `run`
/// gets them with a fresh Idempotency-Key. A problem stays in the dialog;
/// confirming again sends the same key, so a retry never acts twice.
export function confirmAction({ title, text, submit, danger, output, run }) {
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

export function setUpDialog() {
  $('#confirm-form').addEventListener('submit', onConfirm);
  $('#confirm-cancel').addEventListener('click', () => $('#confirm').close());
  // (`close` fires a task later: clearing `page.pending` there could clear the next dialog's.)
  $('#confirm').addEventListener('close', scheduleRefresh);
}
