"""Offline import: turn a broker's on-disk files into ordinary RBAK backups.

The broker need not run: these readers parse its files directly (read-only).
"""
