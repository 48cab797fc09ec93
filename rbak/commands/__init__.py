"""The CLI subcommands, one module each; rbak.cli imports them by name.

Every ``rbak`` start imports all of them to build the parser, so each imports its engine (backup, archive,
drill, doctor, offline, the Management API client, rich's tables) inside the function that runs it: with
those on top, building the parser took 6.3-7.3 s instead of 2.8-3.7 s on the loaded CI machine (measured
with ``rbak.cli.build_parser()`` then importing them, three runs). Those imports carry ``noqa: PLC0415``.
"""
