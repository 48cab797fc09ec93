"""The CLI subcommands, one module each; rbak.cli imports them by name."""
