"""Mosquitto's persistence file as an RBAK backup: ``chunks`` (the layout), ``reader``, ``writer``,
``mapping`` (MQTT messages and sessions as RabbitMQ's MQTT plugin would hold them) and ``importer``."""

from .chunks import (
    MAGIC,
    CfgChunk,
    ChunkType,
    ClientChunk,
    ClientMsgChunk,
    DamagedRegion,
    Direction,
    MosquittoDb,
    MqttProperties,
    MsgState,
    MsgStoreChunk,
    RetainChunk,
    SubChunk,
    UnknownChunk,
)
from .importer import MosquittoImportOptions, MosquittoImportSummary, import_mosquitto_db
from .reader import parse_db, read_db
from .writer import encode_chunk, encode_db, write_db

__all__ = [
    "MAGIC", "CfgChunk", "ChunkType", "ClientChunk", "ClientMsgChunk", "DamagedRegion", "Direction", "MosquittoDb",
    "MosquittoImportOptions", "MosquittoImportSummary", "MqttProperties", "MsgState", "MsgStoreChunk", "RetainChunk", "SubChunk",
    "UnknownChunk", "encode_chunk", "encode_db", "import_mosquitto_db", "parse_db", "read_db", "write_db",
]
