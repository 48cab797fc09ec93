"""Sealing: encrypting a backup's objects (crypto) and wrapping their data keys with keyring or KMS keys (envelope)."""
