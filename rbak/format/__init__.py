"""The RBAK on-disk format: records, segments, manifest, compression."""

from .compression import Compression
from .manifest import BackupManifest, DefinitionsBackup, QueueBackup, SegmentMetadata
from .record import (
    Array, BackupProperties, BackupRecord, Bool, Bytes, Double, Float, HeaderValue, Long,
    LongString, Short, ShortString, Table, Timestamp, Void, decode_record, encode_record,
)
from .segment import Segment, SegmentHeader, decode_segment, encode_segment, read_header, verify_frame
from .segment_writer import SegmentWriter

__all__ = [
    "Compression", "BackupManifest", "DefinitionsBackup", "QueueBackup", "SegmentMetadata",
    "Array", "BackupProperties", "BackupRecord", "Bool", "Bytes", "Double", "Float", "HeaderValue",
    "Long", "LongString", "Short", "ShortString", "Table", "Timestamp", "Void",
    "decode_record", "encode_record", "Segment", "SegmentHeader", "SegmentWriter",
    "decode_segment", "encode_segment", "read_header", "verify_frame",
]
