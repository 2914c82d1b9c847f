-- sagaworks-saga: saga instances and their steps, in the host service's own
-- database (the host runs these migrations with its own).
--
-- One row per saga instance. `current_step` names the step (forward or
-- compensation) to run next, NULL once the saga has finished. `data` holds the
-- saga's typed input and the outputs of the steps that succeeded:
-- {"input": ..., "outputs": {"<step>": ...}}. A driver holds the lease while it
-- drives the instance; any replica may take over an instance whose lease has
-- expired (its driver crashed).
CREATE TABLE saga_instances (
    id               UUID PRIMARY KEY,
    saga_type        TEXT NOT NULL,
    -- The business key (e.g. the order id): one instance per type and key.
    key              TEXT NOT NULL,
    status           TEXT NOT NULL CHECK (status IN ('RUNNING', 'COMPENSATING', 'COMPLETED', 'COMPENSATED')),
    current_step     TEXT,
    data             JSONB NOT NULL,
    failure_reason   TEXT,
    -- The W3C trace context of the call that started the saga: a resumed
    -- saga continues that trace.
    traceparent      TEXT,
    lease_owner      TEXT,
    lease_expires_at TIMESTAMPTZ,
    next_attempt_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- The last transition (a step's result): an unfinished instance whose
    -- progressed_at is older than saga.stuck_after_ms counts as stuck.
    progressed_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at      TIMESTAMPTZ,
    UNIQUE (saga_type, key),
    CHECK ((status IN ('COMPLETED', 'COMPENSATED')) = (current_step IS NULL))
);
CREATE INDEX saga_instances_runnable ON saga_instances (next_attempt_at) WHERE status IN ('RUNNING', 'COMPENSATING');-- Operators list instances newest first by id (UUIDv7 ids are in creation
-- order), on the primary key: no index of its own, which every transition of
-- every instance would have to maintain.

-- One row per step (forward or compensation) of an instance: its latest
-- status, how many attempts it took, the last error, when its first attempt
-- started (a step's deadline counts from there) and when it finished, and the
-- history of its attempts' outcomes:
-- [{"attempt", "started_at", "ended_at", "outcome", "error"}, ...].
CREATE TABLE saga_instance_steps (
    saga_id            UUID NOT NULL REFERENCES saga_instances (id),
    name               TEXT NOT NULL,
    status             TEXT NOT NULL CHECK (status IN ('RUNNING', 'SUCCEEDED', 'FAILED')),
    attempts           INT  NOT NULL DEFAULT 0,
    error              TEXT,
    started_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    attempt_started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at        TIMESTAMPTZ,
    history            JSONB NOT NULL DEFAULT '[]',
    PRIMARY KEY (saga_id, name)
);

-- What operators did to instances (retry now, compensate, resolve), each
-- committed with its effect; one per instance and idempotency key.
CREATE TABLE saga_operator_actions (
    id              BIGSERIAL PRIMARY KEY,
    saga_id         UUID NOT NULL REFERENCES saga_instances (id),
    action          TEXT NOT NULL CHECK (action IN ('RETRY', 'COMPENSATE', 'RESOLVE')),
    step            TEXT NOT NULL,
    actor           TEXT NOT NULL,
    reason          TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    at              TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (saga_id, idempotency_key)
);
