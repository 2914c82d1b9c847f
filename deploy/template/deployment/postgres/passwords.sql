\getenv {{name}}_password {{NAME}}_DB_PASSWORD
\if :{?{{name}}_password}
\else
    \set {{name}}_password ''
\endif
SELECT :'{{name}}_password' = '' AS missing_password \gset
\if :missing_password
    DO $$ BEGIN RAISE EXCEPTION '{{NAME}}_DB_PASSWORD must be set to a non-empty password'; END $$;
\endif

\getenv {{name}}_owner_password {{NAME}}_DB_OWNER_PASSWORD
\if :{?{{name}}_owner_password}
\else
    \set {{name}}_owner_password ''
\endif
SELECT :'{{name}}_owner_password' = '' AS missing_password \gset
\if :missing_password
    DO $$ BEGIN RAISE EXCEPTION '{{NAME}}_DB_OWNER_PASSWORD must be set to a non-empty password'; END $$;
\endif

