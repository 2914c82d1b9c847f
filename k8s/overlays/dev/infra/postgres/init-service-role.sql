-- One service's login role and database on that service's own PostgreSQL server (k8s dev
-- overlay: order-db, inventory-db, payment-db). The Kubernetes counterpart of
-- deploy/postgres/init.sql, which does the same for all three services on compose's one
-- server.
--
-- Run once by the official postgres image on an empty data directory (mounted into
-- /docker-entrypoint-initdb.d/), as the superuser, through psql. Role, password and
-- database come from SERVICE_DATABASE_URL, which the StatefulSet takes from the Secret the
-- service itself connects with (`<service>-database`, key `url`), so they cannot disagree.
--
-- The role owns its database (so it can run its own migrations in the `public` schema)
-- and nothing else: a plain login, no superuser, no CREATEDB, no CREATEROLE, no
-- replication; CONNECT is revoked from PUBLIC on every database.

\set ON_ERROR_STOP on

\getenv service_url SERVICE_DATABASE_URL
\if :{?service_url}
\else
    \set service_url ''
\endif

-- postgres://<role>:<password>@<host>[:<port>]/<database>[?<params>]. The password is used
-- as written, so it may hold only characters a URL needs no percent-encoding for.
-- A NULL column leaves its variable unset (\gset), which the check below catches.
SELECT m[1] AS service_role, m[2] AS service_password, m[3] AS service_db
FROM (SELECT regexp_match(:'service_url',
        '^postgres(?:ql)?://([a-z_][a-z0-9_]*):([A-Za-z0-9._~-]+)@[^/@?]+/([a-z_][a-z0-9_]*)(?:\?.*)?$') AS m) AS url
\gset

\if :{?service_role}
\else
    DO $$ BEGIN RAISE EXCEPTION 'SERVICE_DATABASE_URL must be postgres://<role>:<password>@<host>/<database> (role and database: lower-case identifiers; password: unreserved URL characters)'; END $$;
\endif

SELECT :'service_role' IN ('postgres', 'pg_database_owner') OR :'service_role' LIKE 'pg\_%' AS reserved_role,
       :'service_db' IN ('postgres', 'template0', 'template1') AS reserved_db
\gset
\if :reserved_role
    DO $$ BEGIN RAISE EXCEPTION 'SERVICE_DATABASE_URL names a reserved role'; END $$;
\endif
\if :reserved_db
    DO $$ BEGIN RAISE EXCEPTION 'SERVICE_DATABASE_URL names a reserved database'; END $$;
\endif

-- Nobody but the superuser connects to the maintenance databases.
REVOKE CONNECT, TEMPORARY ON DATABASE postgres FROM PUBLIC;
REVOKE CONNECT, TEMPORARY ON DATABASE template1 FROM PUBLIC;

CREATE ROLE :"service_role" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
    PASSWORD :'service_password';
CREATE DATABASE :"service_db" OWNER :"service_role";
REVOKE CONNECT, TEMPORARY ON DATABASE :"service_db" FROM PUBLIC;
