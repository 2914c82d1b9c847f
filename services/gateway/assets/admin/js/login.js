// Signing in with a token, and out.

import { TOKEN_KEY } from './api.js';
import { $ } from './dom.js';
import { route } from './views.js';

function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  route();
}

export function setUpLogin() {
  $('#login-form').addEventListener('submit', (event) => {
    event.preventDefault();
    const value = $('#token').value.trim().replace(/^Bearer\s+/i, '');
    if (!value) return;
    sessionStorage.setItem(TOKEN_KEY, value);
    $('#token').value = '';
    route();
  });
  $('#sign-out').addEventListener('click', signOut);
}
