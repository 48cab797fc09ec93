"""Writing ``mosquitto.db`` version 6 as Mosquitto 2.0 writes it (tests build real-shaped files with it)."""

from __future__ import annotations

import os
import struct
from pathlib import Path

from ...errors import ImportFormatError
from .chunks import (
    CfgChunk,
    Chunk,
    ChunkType,
    ClientChunk,
    ClientMsgChunk,
    HOST_ORDER,
    MAGIC,
    MsgStoreChunk,
    RetainChunk,
    SubChunk,
    UnknownChunk,
    WRITE_VERSION,
    encode_properties,
    _CLIENT_MSG_TAIL,
    _CLIENT_V6_TAIL,
    _HDR56,
    _MSG_STORE_TAIL,
    _SUB,
    _raw,
)



def _hdr(ctype: ChunkType, length: int) -> bytes:
    return _HDR56.pack(int(ctype), length)


def encode_chunk(chunk: Chunk, byte_order: str = HOST_ORDER) -> bytes:
    u64 = struct.Struct(byte_order + "Q")
    i64 = struct.Struct(byte_order + "q")
    if isinstance(chunk, CfgChunk):
        body = u64.pack(chunk.last_db_id) + bytes([int(chunk.shutdown), chunk.dbid_size]) + bytes(6)
        return _hdr(ChunkType.CFG, len(body)) + body
    if isinstance(chunk, MsgStoreChunk):
        sid = _raw(chunk.source_id) if chunk.source_id else b""
        user = _raw(chunk.source_username) if chunk.source_username else b""
        topic = _raw(chunk.topic)
        props = encode_properties(chunk.properties) if chunk.properties else b""
        fixed = u64.pack(chunk.store_id) + i64.pack(chunk.expiry_time) + _MSG_STORE_TAIL.pack(
            len(chunk.payload), chunk.source_mid, len(sid), len(user), len(topic), chunk.source_port,
            chunk.qos, int(chunk.retain))
        body = fixed + sid + user + topic + chunk.payload + props
        return _hdr(ChunkType.MSG_STORE, len(body)) + body
    if isinstance(chunk, ClientMsgChunk):
        cid = _raw(chunk.client_id)
        props = encode_properties(chunk.properties) if chunk.properties else b""
        rd = (int(chunk.retain) & 0x0F) << 4 | (int(chunk.dup) & 0x0F)
        body = u64.pack(chunk.store_id) + _CLIENT_MSG_TAIL.pack(
            chunk.mid, len(cid), chunk.qos, chunk.state, rd, chunk.direction) + cid + props
        return _hdr(ChunkType.CLIENT_MSG, len(body)) + body
    if isinstance(chunk, RetainChunk):
        body = u64.pack(chunk.store_id)
        return _hdr(ChunkType.RETAIN, len(body)) + body
    if isinstance(chunk, SubChunk):
        cid, topic = _raw(chunk.client_id), _raw(chunk.topic)
        body = _SUB.pack(chunk.identifier, len(cid), len(topic), chunk.qos, chunk.options) + cid + topic
        return _hdr(ChunkType.SUB, len(body)) + body
    if isinstance(chunk, ClientChunk):
        cid = _raw(chunk.client_id)
        user = chunk.username or b""
        body = i64.pack(chunk.session_expiry_time) + _CLIENT_V6_TAIL.pack(
            chunk.session_expiry_interval, chunk.last_mid, len(cid), chunk.listener_port, len(user)) + cid + user
        return _hdr(ChunkType.CLIENT, len(body)) + body
    if isinstance(chunk, UnknownChunk):
        return _HDR56.pack(chunk.chunk_type, len(chunk.data)) + chunk.data
    raise TypeError(f"not a Mosquitto chunk: {chunk!r}")


def order_chunks(chunks: list[Chunk]) -> list[Chunk]:
    """Mosquitto's write order: CFG, MSG_STOREs, each CLIENT then its CLIENT_MSGs, SUBs, RETAINs."""
    cfgs = [c for c in chunks if isinstance(c, CfgChunk)]
    stores = [c for c in chunks if isinstance(c, MsgStoreChunk)]
    clients = [c for c in chunks if isinstance(c, ClientChunk)]
    msgs = [c for c in chunks if isinstance(c, ClientMsgChunk)]
    out: list[Chunk] = [*cfgs[:1], *stores]
    for cl in clients:
        out.append(cl)
        out.extend(m for m in msgs if m.client_id == cl.client_id)
    known = {cl.client_id for cl in clients}
    out.extend(m for m in msgs if m.client_id not in known)
    out.extend(c for c in chunks if isinstance(c, SubChunk))
    out.extend(c for c in chunks if isinstance(c, RetainChunk))
    out.extend(c for c in chunks if isinstance(c, UnknownChunk))
    return out


def encode_db(chunks: list[Chunk], *, byte_order: str = HOST_ORDER, reorder: bool = True) -> bytes:
    """A version 6 file. A CFG chunk is added (last_db_id = highest store_id) if missing."""
    chunks = list(chunks)
    if not any(isinstance(c, CfgChunk) for c in chunks):
        last = max((c.store_id for c in chunks if isinstance(c, MsgStoreChunk)), default=0)
        chunks.insert(0, CfgChunk(last, True))
    if reorder:
        chunks = order_chunks(chunks)
    parts = [MAGIC, struct.pack(">II", 0, WRITE_VERSION)]
    parts += [encode_chunk(c, byte_order) for c in chunks]
    return b"".join(parts)


def write_db(path: str | os.PathLike[str], chunks: list[Chunk], *, byte_order: str = HOST_ORDER,
             overwrite: bool = False) -> int:
    """Write a v6 file atomically (``<path>.new`` then rename, as Mosquitto does); returns its size."""
    p = Path(path)
    if p.exists() and not overwrite:
        raise ImportFormatError(f"{p}: already exists; refusing to overwrite")
    data = encode_db(chunks, byte_order=byte_order)
    tmp = p.with_name(p.name + ".new")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)
    return len(data)
