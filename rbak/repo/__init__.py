"""The repository: what is stored, found, kept and checked (catalog, retention, immutability, progress, validation, reports)."""
