-- Order sagas move to the saga library's tables (saga_instances and
-- saga_instance_steps, created by sagaworks-saga's own migration, which the
-- service runs first). Sagas of an older release, finished or in flight,
-- come along: an in-flight one is resumed by the new engine where it stood.
--
-- `data` is the saga's typed input and the outputs of its steps that
-- succeeded, in the shapes of `order::saga` (OrderInput, Reserved; the other
-- steps' outputs are null, which is not stored).
INSERT INTO saga_instances (id, saga_type, key, status, current_step, data, failure_reason, traceparent,
                            lease_owner, lease_expires_at, next_attempt_at, created_at, updated_at, progressed_at,
                            finished_at)
SELECT s.id, 'place_order', s.order_id::text, s.status,
       CASE WHEN s.status IN ('COMPLETED', 'COMPENSATED') THEN NULL ELSE s.current_step END,
       jsonb_build_object(
           'input', jsonb_build_object(
               'order_id', o.id,
               'customer_id', o.customer_id,
               'items', (SELECT COALESCE(jsonb_agg(jsonb_build_object('product_id', i.product_id, 'quantity', i.quantity)
                                                   ORDER BY i.product_id), '[]')
                         FROM order_items i WHERE i.order_id = o.id)),
           'outputs', jsonb_strip_nulls(jsonb_build_object(
               'reserve_stock',
               CASE WHEN EXISTS (SELECT 1 FROM saga_steps st
                                 WHERE st.saga_id = s.id AND st.name = 'reserve_stock' AND st.status = 'SUCCEEDED')
                    THEN jsonb_build_object(
                        'total_cents', o.total_cents,
                        'prices', (SELECT COALESCE(jsonb_agg(jsonb_build_object('product_id', i.product_id,
                                                                                'unit_price_cents', i.unit_price_cents)
                                                             ORDER BY i.product_id), '[]')
                                   FROM order_items i WHERE i.order_id = o.id))
               END))),
       s.failure_reason, o.traceparent, s.lease_owner, s.lease_expires_at, s.next_attempt_at,
       s.created_at, s.updated_at, s.updated_at, s.finished_at
FROM sagas s JOIN orders o ON o.id = s.order_id;

INSERT INTO saga_instance_steps (saga_id, name, status, attempts, error, started_at, attempt_started_at, finished_at)
SELECT saga_id, name, status, attempts, error, started_at, started_at, finished_at FROM saga_steps;

DROP TABLE saga_steps;
DROP TABLE sagas;
