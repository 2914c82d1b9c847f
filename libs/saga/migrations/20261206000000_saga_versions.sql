-- Which version of its saga's definition an instance started on: a driver reads it
-- through that version's definition (docs/design.md, "Changing a saga"). Instances
-- written before versions existed started on version 1.
ALTER TABLE saga_instances ADD COLUMN version INT NOT NULL DEFAULT 1;

-- Per saga and version, the fingerprint of its shape (steps, kinds, compensations,
-- output schemas) when a host registered it, and that shape: a host whose version has
-- another shape is refused while instances of it are unfinished (Engine::register).
CREATE TABLE saga_versions (
    saga_type     TEXT NOT NULL,
    version       INT  NOT NULL,
    fingerprint   TEXT NOT NULL,
    shape         JSONB NOT NULL,
    registered_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (saga_type, version)
);
