// DOM helpers: elements with attributes and children, data always as text.

const SVG_NS = 'http://www.w3.org/2000/svg';

export function $(selector) {
  return document.querySelector(selector);
}

/// An element with attributes (`class`, `href`, `data-*`, …) and children
/// (nodes or strings, which become text nodes; null and false are skipped).
export function el(tag, attrs, ...children) {
  return build(document.createElement(tag), attrs, children);
}

export function svg(tag, attrs, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

function build(node, attrs, children) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value !== null && value !== undefined && value !== false) node.setAttribute(name, String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function clear(node) {
  node.replaceChildren();
  return node;
}

export function badge(value) {
  return el('span', { class: `badge ${value}` }, value);
}

/// A row saying that there is nothing to show.
export function emptyRow(tbody, columns, text) {
  tbody.append(el('tr', {}, el('td', { class: 'empty', colspan: columns }, text)));
}

export function shortId(id) {
  return id && id.length > 12 ? `${id.slice(0, 8)}…` : id || '—';
}

/// A link to another view of this page.
export function viewHref(params) {
  const query = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== null && value !== undefined && value !== '') query.set(name, value);
  }
  return `./?${query}`;
}
