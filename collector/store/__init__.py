"""Where everything is kept: connections, the schema and its migrations, partitions, Citus placement and
the embedded PostgreSQL, and the packed tier's format parameters (``packed_params``, which the
schema's block columns are made from; the format is docs/format/packed.md). Imports only config."""
