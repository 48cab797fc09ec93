"""Primitives below the format: sizes as people read them, the log filter, definitions documents."""
