"""Every read the read API and the dashboard share: jobs, series at a chart's resolution, epochs, the
audit, logs, profiles, findings. Imports jobs, tiers, store and config (never ingest)."""
