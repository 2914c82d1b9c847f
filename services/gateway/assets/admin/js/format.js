// Formatting times and durations.

import { el } from './dom.js';

export function millis(time) {
  const t = time ? Date.parse(time) : NaN;
  return Number.isNaN(t) ? null : t;
}

/// `2026-12-04 19:00:00Z`: UTC, to the second, the same for every operator.
export function formatTime(time) {
  const t = millis(time);
  return t === null ? '—' : new Date(t).toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
}

export function timeEl(time) {
  return time ? el('time', { datetime: time, title: time }, formatTime(time)) : '—';
}

export function formatDuration(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return '—';
  if (ms < 0) ms = 0;
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 10000) return `${(ms / 1000).toFixed(1)} s`;
  const s = Math.round(ms / 1000);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

export function between(start, end) {
  const a = millis(start);
  const b = millis(end);
  return a === null || b === null ? null : b - a;
}
