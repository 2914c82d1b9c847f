// An operator's actions on a saga: retry now, compensate, resolve.

import { api } from './api.js';
import { confirmAction } from './confirm.js';
import { shortId } from './dom.js';
import { notify } from './messages.js';
import { renderSaga } from './saga.js';
import { page } from './state.js';

export const SAGA_ACTIONS = {
  retry: { title: 'Retry now', submit: 'Retry now', text: 'runs its current step again at once' },
  compensate: {
    title: 'Compensate', submit: 'Compensate', danger: true,
    text: 'aborts it: whatever may have taken effect is compensated and the order ends CANCELLED',
  },
  resolve: { title: 'Resolve the current step', submit: 'Resolve', text: 'records the current step\'s effect as done by hand; the saga goes on from there' },
};

export function actOnSaga(action) {
  const saga = page.saga;
  if (!saga) return;
  const spec = SAGA_ACTIONS[action];
  const step = saga.current_step || '—';
  confirmAction({
    title: `${spec.title}: saga ${shortId(saga.saga_id)}`,
    text: `This ${spec.text}. Saga ${saga.saga_id}, status ${saga.status}, current step ${step}.`,
    submit: spec.submit,
    danger: spec.danger,
    output: action === 'resolve' && saga.current_step === 'reserve_stock',
    run: async (reason, output, key) => {
      const body = output === undefined ? { reason } : { reason, output };
      const path = `v1/admin/sagas/${encodeURIComponent(saga.saga_id)}/${action}`;
      const result = await api('POST', path, { body, key });
      notify(result.replayed
        ? `${spec.title}: this Idempotency-Key was used before; nothing was done again (step ${result.step}).`
        : `${spec.title} done on step ${result.step}.`);
      renderSaga(result.saga);
    },
  });
}
