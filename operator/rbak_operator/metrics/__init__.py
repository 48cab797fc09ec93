"""Prometheus metrics of the operator: run counters and per-resource gauges."""
