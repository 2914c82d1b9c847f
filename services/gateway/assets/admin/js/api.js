// The operator's token and the gateway's admin API: fetch, the bearer token,
// answers other than 2xx as problems.

export const TOKEN_KEY = 'sagaworks.inspector.token';
/// The API is at the gateway's root; the page is at `<root>/admin/`.
const API_ROOT = new URL('../', window.location.href);

/// `#token=<jwt>` in the URL: kept for this tab, then taken out of the URL.
export function takeTokenFromFragment() {
  const fragment = new URLSearchParams(window.location.hash.replace(/^#/, ''));
  const token = fragment.get('token');
  if (!token) return;
  sessionStorage.setItem(TOKEN_KEY, token.trim());
  history.replaceState(history.state, '', window.location.pathname + window.location.search);
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

/// An answer other than 2xx, as problem+json (or made into one).
export class ApiProblem extends Error {
  constructor(problem) {
    super(problem.title || 'Request failed');
    this.problem = problem;
  }
}

/// A fresh Idempotency-Key (crypto.randomUUID needs a secure context).
export function newKey() {
  if (window.crypto.randomUUID) return window.crypto.randomUUID();
  const b = window.crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const h = Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

/// Calls the API: `path` relative to the gateway's root (`v1/admin/…`).
export async function api(method, path, { query, body, key } = {}) {
  const url = new URL(path, API_ROOT);
  for (const [name, value] of Object.entries(query || {})) {
    if (value !== null && value !== undefined && value !== '') url.searchParams.set(name, value);
  }
  const headers = { Accept: 'application/json, application/problem+json' };
  if (token()) headers.Authorization = `Bearer ${token()}`;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  if (key) headers['Idempotency-Key'] = key;
  let response;
  try {
    response = await fetch(url, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: 'no-store',
      credentials: 'omit',
    });
  } catch (e) {
    throw new ApiProblem({ title: 'The gateway did not answer', detail: String(e.message || e) });
  }
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch (_) {
    data = null;
  }
  if (!response.ok) {
    const problem = data && typeof data === 'object' ? data : {};
    throw new ApiProblem({
      ...problem,
      title: problem.title || response.statusText || 'Request failed',
      status: problem.status || response.status,
      detail: problem.detail || (data === null ? text.slice(0, 500) : undefined),
    });
  }
  return data;
}
