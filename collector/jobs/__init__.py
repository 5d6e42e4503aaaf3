"""A job's row over its life: its runs (requeues), when it was last seen, its allocation and owner, its
summary once it ends. Imports tiers, store and config."""
