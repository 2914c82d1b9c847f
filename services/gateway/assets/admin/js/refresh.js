// Auto-refresh of the view shown.

import { token } from './api.js';
import { $ } from './dom.js';
import { page } from './state.js';

const REFRESH_KEY = 'sagaworks.inspector.refresh';

export function scheduleRefresh() {
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

export function setUpRefresh() {
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
