-- One PostgreSQL server, one database + one login role per service, no cross access.
--
-- Run once by the official postgres image on an empty data directory
-- (mounted into /docker-entrypoint-initdb.d/), as the superuser, through psql:
-- the passwords come from the environment (ORDER_DB_PASSWORD, INVENTORY_DB_PASSWORD,
-- PAYMENT_DB_PASSWORD) via \getenv, so none is written here.
--
-- Each role owns its database (so it can run its own migrations in the `public`
-- schema) and nothing else: CONNECT is revoked from PUBLIC on every database, so
-- order_svc cannot even open sagaworks_inventory. The roles are plain logins:
-- no superuser, no CREATEDB, no CREATEROLE.

\set ON_ERROR_STOP on

\getenv order_password ORDER_DB_PASSWORD
\getenv inventory_password INVENTORY_DB_PASSWORD
\getenv payment_password PAYMENT_DB_PASSWORD

\if :{?order_password}
\else
    \set order_password ''
\endif
SELECT :'order_password' = '' AS missing_password \gset
\if :missing_password
    DO $$ BEGIN RAISE EXCEPTION 'ORDER_DB_PASSWORD must be set to a non-empty password'; END $$;
\endif

\if :{?inventory_password}
\else
    \set inventory_password ''
\endif
SELECT :'inventory_password' = '' AS missing_password \gset
\if :missing_password
    DO $$ BEGIN RAISE EXCEPTION 'INVENTORY_DB_PASSWORD must be set to a non-empty password'; END $$;
\endif

\if :{?payment_password}
\else
    \set payment_password ''
\endif
SELECT :'payment_password' = '' AS missing_password \gset
\if :missing_password
    DO $$ BEGIN RAISE EXCEPTION 'PAYMENT_DB_PASSWORD must be set to a non-empty password'; END $$;
\endif

-- Nobody but the superuser connects to the maintenance databases.
REVOKE CONNECT, TEMPORARY ON DATABASE postgres FROM PUBLIC;
REVOKE CONNECT, TEMPORARY ON DATABASE template1 FROM PUBLIC;

CREATE ROLE order_svc LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION PASSWORD :'order_password';
CREATE DATABASE sagaworks_order OWNER order_svc;
REVOKE CONNECT, TEMPORARY ON DATABASE sagaworks_order FROM PUBLIC;

CREATE ROLE inventory_svc LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION PASSWORD :'inventory_password';
CREATE DATABASE sagaworks_inventory OWNER inventory_svc;
REVOKE CONNECT, TEMPORARY ON DATABASE sagaworks_inventory FROM PUBLIC;

CREATE ROLE payment_svc LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION PASSWORD :'payment_password';
CREATE DATABASE sagaworks_payment OWNER payment_svc;
REVOKE CONNECT, TEMPORARY ON DATABASE sagaworks_payment FROM PUBLIC;
