-- The two roles of the local stack (docs/security.md, "Least privilege"), made by the postgres image's
-- entrypoint at the first start of an empty data volume, in the database POSTGRES_DB names.
-- The owner owns the database (and so, on PostgreSQL 15 and later, its schema public) and
-- runs `fulfilment migrate`, which gives the runtime role its privileges; the worker and the
-- relay connect as the runtime role. The passwords are public, like the stack's others.
CREATE ROLE fulfilment_owner LOGIN PASSWORD 'fulfilment-owner';
CREATE ROLE fulfilment_runtime LOGIN PASSWORD 'fulfilment-runtime';
ALTER DATABASE fulfilment OWNER TO fulfilment_owner;
REVOKE ALL ON DATABASE fulfilment FROM PUBLIC;
GRANT CONNECT ON DATABASE fulfilment TO fulfilment_runtime;
