"""Where everything is kept: connections, the schema and its migrations, partitions, Citus placement and
the embedded PostgreSQL. Imports only config."""
