"""The operator's own machinery beside kopf: per-object loops, tasks, wake-up flags, thread pools, the clock, the leader Lease."""
