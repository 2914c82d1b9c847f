-- One PostgreSQL server, one database and two login roles per service, no cross access.
--
-- Run once by the official postgres image on an empty data directory
-- (mounted into /docker-entrypoint-initdb.d/), as the superuser, through psql:
-- the passwords come from the environment (<SERVICE>_DB_PASSWORD and
-- <SERVICE>_DB_OWNER_PASSWORD for order, inventory and payment) via \getenv, so none is
-- written here.
--
-- Per service: `<service>_svc_owner` owns the database and runs the migrations
-- (database.owner_url); `<service>_svc`, which the service serves as (database.url), may
-- read and write the tables the owner creates (default privileges) but not create, change
-- or drop anything. CONNECT is revoked from PUBLIC on every database, so order_svc cannot
-- even open sagaworks_inventory. The roles are plain logins: no superuser, no CREATEDB, no
-- CREATEROLE.

\set ON_ERROR_STOP on

\getenv order_password ORDER_DB_PASSWORD
\if :{?order_password}
\else
    \set order_password ''
\endif
SELECT :'order_password' = '' AS missing_password \gset
\if :missing_password
    DO $$ BEGIN RAISE EXCEPTION 'ORDER_DB_PASSWORD must be set to a non-empty password'; END $$;
\endif

\getenv order_owner_password ORDER_DB_OWNER_PASSWORD
\if :{?order_owner_password}
\else
    \set order_owner_password ''
\endif
SELECT :'order_owner_password' = '' AS missing_password \gset
\if :missing_password
    DO $$ BEGIN RAISE EXCEPTION 'ORDER_DB_OWNER_PASSWORD must be set to a non-empty password'; END $$;
\endif

\getenv inventory_password INVENTORY_DB_PASSWORD
\if :{?inventory_password}
\else
    \set inventory_password ''
\endif
SELECT :'inventory_password' = '' AS missing_password \gset
\if :missing_password
    DO $$ BEGIN RAISE EXCEPTION 'INVENTORY_DB_PASSWORD must be set to a non-empty password'; END $$;
\endif

\getenv inventory_owner_password INVENTORY_DB_OWNER_PASSWORD
\if :{?inventory_owner_password}
\else
    \set inventory_owner_password ''
\endif
SELECT :'inventory_owner_password' = '' AS missing_password \gset
\if :missing_password
    DO $$ BEGIN RAISE EXCEPTION 'INVENTORY_DB_OWNER_PASSWORD must be set to a non-empty password'; END $$;
\endif

\getenv payment_password PAYMENT_DB_PASSWORD
\if :{?payment_password}
\else
    \set payment_password ''
\endif
SELECT :'payment_password' = '' AS missing_password \gset
\if :missing_password
    DO $$ BEGIN RAISE EXCEPTION 'PAYMENT_DB_PASSWORD must be set to a non-empty password'; END $$;
\endif

\getenv payment_owner_password PAYMENT_DB_OWNER_PASSWORD
\if :{?payment_owner_password}
\else
    \set payment_owner_password ''
\endif
SELECT :'payment_owner_password' = '' AS missing_password \gset
\if :missing_password
    DO $$ BEGIN RAISE EXCEPTION 'PAYMENT_DB_OWNER_PASSWORD must be set to a non-empty password'; END $$;
\endif

-- Nobody but the superuser connects to the maintenance databases.
REVOKE CONNECT, TEMPORARY ON DATABASE postgres FROM PUBLIC;
REVOKE CONNECT, TEMPORARY ON DATABASE template1 FROM PUBLIC;

CREATE ROLE order_svc_owner LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION PASSWORD :'order_owner_password';
CREATE ROLE order_svc LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION PASSWORD :'order_password';
CREATE DATABASE sagaworks_order OWNER order_svc_owner;
REVOKE CONNECT, TEMPORARY ON DATABASE sagaworks_order FROM PUBLIC;
GRANT CONNECT ON DATABASE sagaworks_order TO order_svc;
\connect sagaworks_order
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO order_svc;
ALTER DEFAULT PRIVILEGES FOR ROLE order_svc_owner IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO order_svc;
ALTER DEFAULT PRIVILEGES FOR ROLE order_svc_owner IN SCHEMA public GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO order_svc;
\connect postgres

CREATE ROLE inventory_svc_owner LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION PASSWORD :'inventory_owner_password';
CREATE ROLE inventory_svc LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION PASSWORD :'inventory_password';
CREATE DATABASE sagaworks_inventory OWNER inventory_svc_owner;
REVOKE CONNECT, TEMPORARY ON DATABASE sagaworks_inventory FROM PUBLIC;
GRANT CONNECT ON DATABASE sagaworks_inventory TO inventory_svc;
\connect sagaworks_inventory
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO inventory_svc;
ALTER DEFAULT PRIVILEGES FOR ROLE inventory_svc_owner IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO inventory_svc;
ALTER DEFAULT PRIVILEGES FOR ROLE inventory_svc_owner IN SCHEMA public GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO inventory_svc;
\connect postgres

CREATE ROLE payment_svc_owner LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION PASSWORD :'payment_owner_password';
CREATE ROLE payment_svc LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION PASSWORD :'payment_password';
CREATE DATABASE sagaworks_payment OWNER payment_svc_owner;
REVOKE CONNECT, TEMPORARY ON DATABASE sagaworks_payment FROM PUBLIC;
GRANT CONNECT ON DATABASE sagaworks_payment TO payment_svc;
\connect sagaworks_payment
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO payment_svc;
ALTER DEFAULT PRIVILEGES FOR ROLE payment_svc_owner IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO payment_svc;
ALTER DEFAULT PRIVILEGES FOR ROLE payment_svc_owner IN SCHEMA public GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO payment_svc;
\connect postgres
