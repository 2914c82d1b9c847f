// Problems and notices shown to the operator.

import { ApiProblem } from './api.js';
import { $, clear, el } from './dom.js';

/// Fills `box` with a problem: title and status, detail, field errors.
export function renderProblem(box, problem) {
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

export function showProblem(error) {
  const problem = error instanceof ApiProblem ? error.problem : { title: 'Error in the page', detail: String(error) };
  renderProblem($('#problem'), problem);
}

export function clearProblem() {
  clear($('#problem')).hidden = true;
}

export function notify(text) {
  $('#notice').textContent = text;
}
