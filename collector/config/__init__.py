"""The collector's settings: one object, a section per room (health, alerts, reconcile, tiers), loaded once at start.

The bottom room: every other room may read it; it imports no other room."""
