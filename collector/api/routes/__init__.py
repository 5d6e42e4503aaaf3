"""One module per group of HTTP routes: each turns a request into calls of the rooms below (ingest,
query, jobs) and their answers into HTTP, and holds no SQL of its own."""
