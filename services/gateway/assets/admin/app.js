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
//
// This is the entry module; the rest are ES modules under `js/`, one per
// concern or view, loaded by the browser as they are.

import { takeTokenFromFragment } from './js/api.js';
import { setUpDialog } from './js/confirm.js';
import { $ } from './js/dom.js';
import { setUpLogin } from './js/login.js';
import { scheduleRefresh, setUpRefresh } from './js/refresh.js';
import { actOnSaga, SAGA_ACTIONS } from './js/saga-actions.js';
import { route } from './js/views.js';

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
