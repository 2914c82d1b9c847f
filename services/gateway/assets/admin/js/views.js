// Views and loading: which view the URL names, its data, and the page's state.

import { ApiProblem, TOKEN_KEY, token } from './api.js';
import { loadDlq, DLQ_FILTERS } from './dlq.js';
import { loadMessage } from './dlq-message.js';
import { $ } from './dom.js';
import { fillForm, listQuery } from './lists.js';
import { clearProblem, showProblem } from './messages.js';
import { scheduleRefresh } from './refresh.js';
import { loadSaga } from './saga.js';
import { loadSagas, SAGA_FILTERS } from './sagas.js';
import { page } from './state.js';

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
export function route() {
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
