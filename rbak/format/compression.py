"""The three payload codecs of the RBAK format and their file extensions."""

from __future__ import annotations

import enum
import io
import threading

import lz4.frame
import zstandard

from ..errors import CompressionError, ConfigError


class Compression(enum.IntEnum):
    NONE = 0
    ZSTD = 1
    LZ4 = 2

    @property
    def extension(self) -> str:
        """Suffix of segment and definitions files, dot included ('' for none)."""
        return _EXTENSIONS[self]

    @property
    def config_name(self) -> str:
        return _NAMES[self]

    @classmethod
    def parse(cls, value: "str | int | Compression", where: str = "backup.compression") -> "Compression":
        if isinstance(value, Compression):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                return cls(value)
            except ValueError:
                pass
        elif isinstance(value, str) and value.lower() in _BY_NAME:
            return _BY_NAME[value.lower()]
        raise ConfigError(f"{where}: unknown compression {value!r}; expected one of zstd, lz4, none")


_EXTENSIONS = {Compression.NONE: "", Compression.ZSTD: ".zst", Compression.LZ4: ".lz4"}
_NAMES = {Compression.NONE: "none", Compression.ZSTD: "zstd", Compression.LZ4: "lz4"}
_BY_NAME = {"none": Compression.NONE, "zstd": Compression.ZSTD, "lz4": Compression.LZ4}

DEFAULT_ZSTD_LEVEL = 3

_local = threading.local()


def _zstd_compressor(level: int) -> zstandard.ZstdCompressor:
    cache = getattr(_local, "cctx", None)
    if cache is None:
        cache = _local.cctx = {}
    c = cache.get(level)
    if c is None:
        c = cache[level] = zstandard.ZstdCompressor(level=level)
    return c


def _zstd_decompressor() -> zstandard.ZstdDecompressor:
    d = getattr(_local, "dctx", None)
    if d is None:
        d = _local.dctx = zstandard.ZstdDecompressor()
    return d


def check_level(compression: Compression, level: int | None, where: str = "backup.compression_level") -> int:
    if compression is Compression.ZSTD:
        lvl = DEFAULT_ZSTD_LEVEL if level is None else level
        if isinstance(lvl, bool) or not isinstance(lvl, int) or not 1 <= lvl <= 22:
            raise ConfigError(f"{where}: zstd level must be an integer from 1 to 22, got {level!r}")
        return lvl
    return 0


def compress(data: bytes | memoryview, compression: Compression, level: int | None = None) -> bytes:
    if compression is Compression.ZSTD:
        return _zstd_compressor(check_level(compression, level)).compress(data)
    if compression is Compression.LZ4:
        return lz4.frame.compress(data)
    return bytes(data)


DEFAULT_MAX_OUTPUT = 256 * 1024 * 1024
"""What a whole-buffer ``decompress`` may produce (definitions documents, small payloads); segments are
read by ``rbak.format.reader``, bounded by what their manifest and header declare."""


def decompress(data: bytes | memoryview, compression: Compression, max_output: int = DEFAULT_MAX_OUTPUT) -> bytes:
    """Decompress a payload as a stream, refusing to produce more than ``max_output`` bytes.

    Raises CompressionError (the caller adds the key). Never trusts a frame's
    declared content size (a frame may claim a terabyte).
    """
    if compression is Compression.NONE:
        return bytes(data)
    try:
        if compression is Compression.ZSTD:
            reader = _zstd_decompressor().stream_reader(data, read_across_frames=True)
        elif compression is Compression.LZ4:
            reader = lz4.frame.LZ4FrameFile(io.BytesIO(data), mode="rb")
        else:  # pragma: no cover - the enum has three members
            raise CompressionError(f"unknown compression {compression!r}")
        parts, total = [], 0
        with reader:
            while True:
                chunk = reader.read(min(1 << 20, max_output - total + 1))
                if not chunk:
                    break
                total += len(chunk)
                if total > max_output:
                    raise CompressionError(f"{compression.config_name} payload expands past {max_output} bytes; "
                                           f"refusing to decompress further")
                parts.append(chunk)
        return b"".join(parts)
    except (zstandard.ZstdError, RuntimeError, ValueError, EOFError, OSError) as e:
        raise CompressionError(f"{compression.config_name} payload does not decompress: {e}") from e
