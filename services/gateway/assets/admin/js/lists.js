// Lists with filters and keyset pagination (sagas, dead letters).

import { $, viewHref } from './dom.js';

/// The list's query from the page's URL (`names` and `cursor`).
export function listQuery(params, names) {
  const query = {};
  for (const name of [...names, 'cursor']) query[name] = params.get(name) || '';
  return query;
}

/// Shows the filters in use in their form (once: a refresh must not undo the operator's typing).
export function fillForm(form, names, values) {
  for (const name of names) if (values[name]) form.elements[name].value = values[name];
}

/// "First page" and "Next page" links of a keyset-paginated list.
export function pager(firstSel, nextSel, base, cursor, nextCursor) {
  const first = $(firstSel);
  const next = $(nextSel);
  first.hidden = !cursor;
  first.setAttribute('href', viewHref(base));
  next.hidden = !nextCursor;
  next.setAttribute('href', viewHref({ ...base, cursor: nextCursor || '' }));
}
