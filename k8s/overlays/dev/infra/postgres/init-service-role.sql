-- One service's two login roles and its database on that service's own PostgreSQL server
-- (k8s dev overlay: order-db, inventory-db, payment-db). The Kubernetes counterpart of
-- deploy/postgres/init.sql, which does the same for all three services on compose's one
-- server.
--
-- Run once by the official postgres image on an empty data directory (mounted into
-- /docker-entrypoint-initdb.d/), as the superuser, through psql. Roles, passwords and
-- database come from the two Secrets the service itself uses, so they cannot disagree:
--   SERVICE_OWNER_URL     (`<service>-database-owner`, key `url`): the role that owns the
--                         database; the service's `migrate` init container runs as it;
--   SERVICE_DATABASE_URL  (`<service>-database`, key `url`): the role the service serves
--                         as, which may read and write the owner's tables (default
--                         privileges) but not create, change or drop anything.
--
-- Both are plain logins: no superuser, no CREATEDB, no CREATEROLE, no replication; CONNECT
-- is revoked from PUBLIC on every database.

\set ON_ERROR_STOP on

\getenv service_url SERVICE_DATABASE_URL
\if :{?service_url}
\else
    \set service_url ''
\endif
\getenv owner_url SERVICE_OWNER_URL
\if :{?owner_url}
\else
    \set owner_url ''
\endif

-- postgres://<role>:<password>@<host>[:<port>]/<database>[?<params>]. The password is used
-- as written, so it may hold only characters a URL needs no percent-encoding for.
-- A NULL column leaves its variable unset (\gset), which the checks below catch.
SELECT m[1] AS service_role, m[2] AS service_password, m[3] AS service_db
FROM (SELECT regexp_match(:'service_url',
        '^postgres(?:ql)?://([a-z_][a-z0-9_]*):([A-Za-z0-9._~-]+)@[^/@?]+/([a-z_][a-z0-9_]*)(?:\?.*)?$') AS m) AS url
\gset
SELECT m[1] AS owner_role, m[2] AS owner_password, m[3] AS owner_db
FROM (SELECT regexp_match(:'owner_url',
        '^postgres(?:ql)?://([a-z_][a-z0-9_]*):([A-Za-z0-9._~-]+)@[^/@?]+/([a-z_][a-z0-9_]*)(?:\?.*)?$') AS m) AS url
\gset

\if :{?service_role}
\else
    DO $$ BEGIN RAISE EXCEPTION 'SERVICE_DATABASE_URL must be postgres://<role>:<password>@<host>/<database> (role and database: lower-case identifiers; password: unreserved URL characters)'; END $$;
\endif
\if :{?owner_role}
\else
    DO $$ BEGIN RAISE EXCEPTION 'SERVICE_OWNER_URL must be postgres://<role>:<password>@<host>/<database> (role and database: lower-case identifiers; password: unreserved URL characters)'; END $$;
\endif

SELECT :'service_role' IN ('postgres', 'pg_database_owner') OR :'service_role' LIKE 'pg\_%'
       OR :'owner_role' IN ('postgres', 'pg_database_owner') OR :'owner_role' LIKE 'pg\_%' AS reserved_role,
       :'service_db' IN ('postgres', 'template0', 'template1') AS reserved_db,
       :'owner_db' <> :'service_db' OR :'owner_role' = :'service_role' AS mismatch
\gset
\if :reserved_role
    DO $$ BEGIN RAISE EXCEPTION 'SERVICE_DATABASE_URL or SERVICE_OWNER_URL names a reserved role'; END $$;
\endif
\if :reserved_db
    DO $$ BEGIN RAISE EXCEPTION 'SERVICE_DATABASE_URL names a reserved database'; END $$;
\endif
\if :mismatch
    DO $$ BEGIN RAISE EXCEPTION 'SERVICE_DATABASE_URL and SERVICE_OWNER_URL must name one database and two different roles'; END $$;
\endif

-- Nobody but the superuser connects to the maintenance databases.
REVOKE CONNECT, TEMPORARY ON DATABASE postgres FROM PUBLIC;
REVOKE CONNECT, TEMPORARY ON DATABASE template1 FROM PUBLIC;

CREATE ROLE :"owner_role" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
    PASSWORD :'owner_password';
CREATE ROLE :"service_role" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
    PASSWORD :'service_password';
CREATE DATABASE :"service_db" OWNER :"owner_role";
REVOKE CONNECT, TEMPORARY ON DATABASE :"service_db" FROM PUBLIC;
GRANT CONNECT ON DATABASE :"service_db" TO :"service_role";
\connect :"service_db"
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO :"service_role";
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner_role" IN SCHEMA public
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO :"service_role";
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner_role" IN SCHEMA public
    GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO :"service_role";
