"""Type stub of the C helper (rbak/format/_speedups.c): its functions are described where they are used."""

from typing import Any

def __getattr__(name: str) -> Any: ...
