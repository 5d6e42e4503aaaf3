"""What a batch goes through on its way in: the body read and checked, its records turned into rows,
written in a group commit. Imports jobs, tiers, store and config."""
