"""Continuous stream archiving (``rbak archive``): followers per stream, generations of backups, ticks."""
