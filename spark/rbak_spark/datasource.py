"""``spark.read.format("rbak")``: a backup as a DataFrame, one row per record.

    spark.read.format("rbak").option("backup_id", "b1").load("s3://bucket/backups?...")

Options: ``backup_id`` (or ``archive``), ``prefix``, ``time_window_start`` /
``time_window_end`` (epoch ms or RFC 3339, inclusive, the CLI restore's PITR
rule: rows outside are dropped), ``chain``. The path is an rbak storage URL, opened on
the executors with ``rbak.storage.open_storage``.

``chain`` ("true"): an incremental stream's earlier backups too, as a restore walks them
(``rbak.restore.chain``: every link checked; ``segment_sequence`` then numbers the segments
along the chain, ``segment_key`` says whose they are). ``archive`` NAME: that ``rbak archive``'s
newest generation (open or closed) with its chain, i.e. every record the archive holds.

One partition per segment. Segments are pruned before any is read, using the
segment timestamps (the manifest's copy of the segment header's; the header
itself when the manifest has none): by the time window options and by
filters Spark pushes down on ``backed_up_at`` / ``backed_up_at_ms``
(``spark.sql.python.filterPushdown.enabled`` must be true; ``register`` sets
it) and by ``vhost`` / ``queue`` equality or IN filters. Pushed filters are
handed back to Spark too, so rows are still filtered exactly.

``headers`` is a JSON object string ``{name: value}`` (see
``headers_to_plain``): AMQP field types are flattened (Bytes become base64
strings, Timestamps epoch seconds, Void null, Tables objects, Arrays lists);
the lossless typed form is in the segment itself.
"""

from __future__ import annotations

import base64
import datetime as _dt
import math
from dataclasses import dataclass
from typing import Any, Iterator

import orjson
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from rbak.archive.restore_point import newest_generation
from rbak.config import parse_time_bound
from rbak.errors import ConfigError
from rbak.format.manifest import SegmentMetadata
from rbak.format.reader import read_segment
from rbak.format.record import Array, Bytes, Table, Void
from rbak.format.segment import HEADER_SIZE, read_header
from rbak.repo.catalog import load_manifest
from rbak.restore.chain import expand_chains
from rbak.sealing.crypto import EncryptionInfo, codec_for
from rbak.storage import open_storage

NAME = "rbak"

PROPERTIES_TYPE = (
    "struct<content_type:string,content_encoding:string,delivery_mode:int,priority:int,"
    "correlation_id:string,reply_to:string,expiration:string,message_id:string,timestamp:bigint,"
    "type_field:string,user_id:string,app_id:string,cluster_id:string>"
)

SCHEMA = ", ".join([
    "vhost string",
    "queue string",
    "queue_type string",
    "segment_key string",
    "segment_sequence int",
    "record_index int",
    "delivery_tag bigint",
    "backed_up_at timestamp",
    "backed_up_at_ms bigint",
    "exchange string",
    "routing_key string",
    "redelivered boolean",
    f"properties {PROPERTIES_TYPE}",
    "headers string",
    "body binary",
])

_TS_COLUMNS = {("backed_up_at",), ("backed_up_at_ms",)}


@dataclass(frozen=True)
class SegmentPartition(InputPartition):
    """One segment to read (picklable: plain fields only)."""

    url: str
    key: str
    vhost: str
    queue: str
    queue_type: str
    sequence: int
    first_timestamp: int | None
    last_timestamp: int | None
    start_ms: int | None
    end_ms: int | None
    hard_start_ms: int | None
    hard_end_ms: int | None
    segment: dict | None = None  # the manifest entry (SegmentMetadata.to_json_obj): size, SHA-256, counts
    backup_id: str = ""
    key_id: str | None = None  # the backup's encryption key id (None: not encrypted)
    prefix: str = ""
    dek_fingerprint: str | None = None  # envelope encryption: the data key is unwrapped on the executor


def headers_to_plain(headers) -> dict[str, Any]:
    """Typed AMQP headers as a JSON-ready dict (lossy: see the module docstring)."""
    return {k: _plain(v) for k, v in headers}


def _plain(v: Any) -> Any:
    t = type(v)
    if t is Void:
        return None
    if t is Bytes:
        return base64.b64encode(v.value).decode("ascii")
    if t is Table:
        return {k: _plain(x) for k, x in v.value}
    if t is Array:
        return [_plain(x) for x in v.value]
    val = v.value
    if isinstance(val, float) and not math.isfinite(val):
        return None
    return val


def _to_ms(value: Any, round_up: bool) -> int | None:
    """A pushed-down literal as epoch ms (datetimes: Spark's naive local time or aware)."""
    if isinstance(value, _dt.datetime):
        # A naive value is local wall time; in a DST fold it names two instants: take the looser.
        both = [round(value.replace(fold=f).timestamp() * 1_000_000) for f in (0, 1)]
        us = max(both) if round_up else min(both)
        return -(-us // 1000) if round_up else us // 1000
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return math.ceil(value) if round_up else math.floor(value)
    return None


class RbakReader(DataSourceReader):
    def __init__(self, options: dict[str, str]):
        self.url = options.get("path") or options.get("url") or ""
        if not self.url:
            raise ConfigError('rbak data source: give the storage URL as load("<url>") or option("path", ...)')
        self.backup_id = options.get("backup_id") or ""
        self.archive = options.get("archive") or ""
        if bool(self.backup_id) == bool(self.archive):
            raise ConfigError("rbak data source: option 'backup_id' (a backup, or a generation of an archive) or "
                              "option 'archive' (an archive's newest generation and its chain) is required, not both")
        chain = (options.get("chain") or ("true" if self.archive else "false")).strip().lower()
        if chain not in ("true", "false"):
            raise ConfigError(f"rbak data source: option 'chain' must be true or false, got {chain!r}")
        self.chain = chain == "true"
        self.prefix = options.get("prefix") or ""
        self.hard_start = parse_time_bound(options.get("time_window_start"), "option time_window_start")
        self.hard_end = parse_time_bound(options.get("time_window_end"), "option time_window_end")
        self.start_ms = self.hard_start
        self.end_ms = self.hard_end
        self.vhosts: set[str] | None = None
        self.queues: set[str] | None = None

    # -- planning --------------------------------------------------------

    def _narrow(self, start: int | None = None, end: int | None = None) -> None:
        if start is not None:
            self.start_ms = start if self.start_ms is None else max(self.start_ms, start)
        if end is not None:
            self.end_ms = end if self.end_ms is None else min(self.end_ms, end)

    def _restrict(self, attr: str, values: set[str]) -> None:
        cur = getattr(self, attr)
        setattr(self, attr, values if cur is None else cur & values)

    def pushFilters(self, filters: list[Any]) -> Iterator[Any]:  # noqa: N802 - Spark's DataSourceReader names it
        """Prune by time and by vhost/queue; every filter still goes back to Spark."""
        # Spark 4.1 filter pushdown (4.0 has no filter classes and never calls this)
        from pyspark.sql.datasource import EqualTo, GreaterThan, GreaterThanOrEqual, In, LessThan, LessThanOrEqual

        for f in filters:
            col = getattr(f, "attribute", None)
            if col in _TS_COLUMNS:
                if isinstance(f, (GreaterThan, GreaterThanOrEqual)):
                    self._narrow(start=_to_ms(f.value, round_up=False))
                elif isinstance(f, (LessThan, LessThanOrEqual)):
                    self._narrow(end=_to_ms(f.value, round_up=True))
                elif isinstance(f, EqualTo):
                    self._narrow(_to_ms(f.value, False), _to_ms(f.value, True))
            elif col in (("vhost",), ("queue",)):
                attr = "vhosts" if col == ("vhost",) else "queues"
                if isinstance(f, EqualTo) and isinstance(f.value, str):
                    self._restrict(attr, {f.value})
                elif isinstance(f, In) and all(isinstance(v, str) for v in f.value):
                    self._restrict(attr, set(f.value))
            yield f

    def partitions(self) -> list[InputPartition]:
        with open_storage(self.url) as storage:
            if self.archive:
                self.backup_id = newest_generation(storage, self.archive, self.prefix, "option archive")[0]
            manifest = load_manifest(storage, self.backup_id, self.prefix)
            if self.chain:
                manifest, _ = expand_chains(manifest, lambda bid: load_manifest(storage, bid, self.prefix))
        parts: list[InputPartition] = []
        for q in manifest.queues:
            if self.vhosts is not None and q.vhost not in self.vhosts:
                continue
            if self.queues is not None and q.name not in self.queues:
                continue
            for s in q.segments:
                if s.record_count == 0:
                    continue
                if s.first_timestamp is not None and s.last_timestamp is not None and not _overlaps(
                    s.first_timestamp, s.last_timestamp, self.start_ms, self.end_ms
                ):
                    continue
                bid = q.link_of.get(s.key, manifest.backup_id)  # an earlier link's segment: its backup's key
                enc = q.link_encryption.get(bid) if bid != manifest.backup_id else manifest.encryption
                parts.append(SegmentPartition(
                    self.url, s.key, q.vhost, q.name, q.queue_type, s.sequence,
                    s.first_timestamp, s.last_timestamp, self.start_ms, self.end_ms,
                    self.hard_start, self.hard_end, s.to_json_obj(), bid,
                    enc.key_id if enc else None, self.prefix, enc.dek_fingerprint if enc else None,
                ))
        # Spark wants at least one partition; an empty one reads nothing.
        return parts or [InputPartition(None)]

    # -- reading (executors) ---------------------------------------------

    def read(self, partition) -> Iterator[tuple]:
        if not isinstance(partition, SegmentPartition):
            return

        from .executor import storage_for

        storage = storage_for(partition.url)
        p = partition
        if (p.first_timestamp is None or p.last_timestamp is None) and p.key_id is None:  # header: plaintext only
            header = read_header(storage.get_range(p.key, 0, HEADER_SIZE), p.key)
            if not header.overlaps(p.start_ms, p.end_ms):
                return
        # The one bounded reader: size and SHA-256 against the manifest, CRC, streamed records;
        # an encrypted backup's segments opened with the executor's RBAK_ENCRYPTION_KEYS.
        codec = None
        if p.key_id is not None:
            from .executor import keyring_for

            info = EncryptionInfo(p.key_id, dek_fingerprint=p.dek_fingerprint)
            codec = codec_for(p.backup_id, info, keyring_for(storage, p.url, p.prefix, p.backup_id, info))
        assert p.segment is not None  # partitions() always sets it
        meta = SegmentMetadata.from_json_obj(p.segment, p.key)
        yield from rows_of_segment(p, (r for _, r in read_segment(storage, meta, codec=codec)))


def _overlaps(first: int, last: int, start: int | None, end: int | None) -> bool:
    return not ((start is not None and last < start) or (end is not None and first > end))


_UTC = _dt.timezone.utc
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_UTC)


def rows_of_segment(p: SegmentPartition, records) -> Iterator[tuple]:
    lo, hi = p.hard_start_ms, p.hard_end_ms
    for i, r in enumerate(records):
        ts = r.backed_up_at
        if (lo is not None and ts < lo) or (hi is not None and ts > hi):
            continue
        pr = r.properties
        yield (
            p.vhost, p.queue, p.queue_type, p.key, p.sequence, i, r.delivery_tag,
            _EPOCH + _dt.timedelta(milliseconds=ts), ts,
            r.exchange, r.routing_key, r.redelivered,
            (pr.content_type, pr.content_encoding, pr.delivery_mode, pr.priority, pr.correlation_id,
             pr.reply_to, pr.expiration, pr.message_id, pr.timestamp, pr.type_field, pr.user_id,
             pr.app_id, pr.cluster_id),
            orjson.dumps(headers_to_plain(r.headers)).decode() if r.headers else None,
            r.body,
        )


class RbakDataSource(DataSource):
    """Registered as ``rbak`` (see ``register``)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema) -> DataSourceReader:
        return RbakReader(dict(self.options))


def register(spark) -> None:
    """Register the ``rbak`` format on a session (and turn filter pushdown on)."""
    from .session import SQL_CONF, ship_package

    ship_package(spark)
    for k, v in SQL_CONF.items():
        spark.conf.set(k, v)
    spark.dataSource.register(RbakDataSource)


def read_backup(spark, url: str, backup_id: str | None, prefix: str = "", **options: Any):
    """The DataFrame of a backup (options as the module docstring; ``archive=NAME`` with ``backup_id`` None)."""
    register(spark)
    url = str(url)
    reader = spark.read.format(NAME).option("prefix", prefix or "")
    if backup_id is not None:
        reader = reader.option("backup_id", backup_id)
    for k, v in options.items():
        if v is not None:
            reader = reader.option(k, str(v))
    return reader.load(url)
