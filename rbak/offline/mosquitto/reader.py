"""Reading ``mosquitto.db`` (versions 2-6) into typed chunks; damage is an error naming file and offset,
or with ``skip_damaged`` a ``DamagedRegion`` and a resync at the next chunk."""

from __future__ import annotations

import mmap
import os
import stat
import struct

from ...errors import ImportFormatError
from .chunks import (
    CfgChunk,
    Chunk,
    ChunkType,
    ClientChunk,
    ClientMsgChunk,
    DBID_SIZE,
    DamagedRegion,
    DbHeader,
    HEADER_SIZE,
    HOST_ORDER,
    MAGIC,
    MQTT_MAX_PAYLOAD,
    MosquittoDb,
    MqttProperties,
    MsgStoreChunk,
    NO_PROPERTIES,
    PROPERTY_TYPES,
    PropType,
    PropValue,
    RetainChunk,
    SUPPORTED_VERSIONS,
    SubChunk,
    UnknownChunk,
    _CLIENT_MSG_TAIL,
    _CLIENT_V5_TAIL,
    _CLIENT_V6_TAIL,
    _HDR234,
    _HDR56,
    _MSG_STORE_TAIL,
    _SUB,
    _text,
)



class _Damage(Exception):
    """Internal: a chunk could not be decoded; carries the offset."""

    def __init__(self, offset: int, reason: str):
        self.offset = offset
        self.reason = reason


def _name(b: bytes, pos: int, what: str) -> str:
    """A client id or topic: it names a queue or a routing key, so it must be UTF-8 (MQTT requires it)."""
    try:
        return bytes(b).decode("utf-8")
    except UnicodeDecodeError as e:
        raise _Damage(pos + e.start, f"{what} is not valid UTF-8 (byte {bytes(b)[e.start]:#04x} at {e.start} "
                                     f"of {len(b)}): {bytes(b)[:64]!r}") from None


class _Cur:
    __slots__ = ("buf", "pos", "end", "u64")

    def __init__(self, buf: bytes | mmap.mmap, pos: int, end: int, byte_order: str):
        self.buf = buf
        self.pos = pos
        self.end = end
        self.u64 = struct.Struct(byte_order + "Q")

    def take(self, n: int, what: str) -> bytes:
        if self.pos + n > self.end:
            raise _Damage(self.pos, f"truncated {what}: needs {n} bytes, {max(self.end - self.pos, 0)} left")
        v = self.buf[self.pos:self.pos + n]
        self.pos += n
        return v

    def unpack(self, st: struct.Struct, what: str) -> tuple:
        return st.unpack(self.take(st.size, what))

    def u8(self, what: str) -> int:
        return self.take(1, what)[0]

    def u16(self, what: str) -> int:
        return int.from_bytes(self.take(2, what), "big")

    def u32(self, what: str) -> int:
        return int.from_bytes(self.take(4, what), "big")

    def hu64(self, what: str) -> int:
        return self.u64.unpack(self.take(8, what))[0]

    def string(self, n: int, what: str) -> str:
        return _text(bytes(self.take(n, what)))

    def lstring(self, what: str) -> str:
        return self.string(self.u16(what + " length"), what)

    def name(self, n: int, what: str) -> str:
        at = self.pos
        return _name(self.take(n, what), at, what)

    def lname(self, what: str) -> str:
        return self.name(self.u16(what + " length"), what)

    def varint(self, what: str) -> int:
        n, mult = 0, 1
        for _ in range(4):
            b = self.u8(what)
            n += (b & 0x7F) * mult
            if not b & 0x80:
                return n
            mult *= 128
        raise _Damage(self.pos, f"malformed variable byte integer in {what}")




def _parse_properties(c: _Cur, end: int) -> MqttProperties:
    total = c.varint("property block length")
    if c.pos + total != end:
        raise _Damage(c.pos, f"property block length {total} does not fill the chunk ({end - c.pos} bytes left)")
    items: list[tuple[int, PropValue]] = []
    while c.pos < end:
        ident_at = c.pos
        ident = c.varint("property identifier")
        t = PROPERTY_TYPES.get(ident)
        if t is None:
            raise _Damage(ident_at, f"unknown MQTT property identifier {ident}")
        if t is PropType.BYTE:
            v: PropValue = c.u8("byte property")
        elif t is PropType.U16:
            v = c.u16("two-byte property")
        elif t is PropType.U32:
            v = c.u32("four-byte property")
        elif t is PropType.VARINT:
            v = c.varint("varint property")
        elif t is PropType.STRING:
            v = c.lstring("string property")
        elif t is PropType.BINARY:
            v = bytes(c.take(c.u16("binary property length"), "binary property"))
        else:
            v = (c.lstring("user property name"), c.lstring("user property value"))
        items.append((ident, v))
    return MqttProperties(tuple(items))


class _Reader:
    def __init__(self, path: str, buf: bytes | mmap.mmap, byte_order: str, skip_damaged: bool):
        self.path = path
        self.buf = buf
        self.size = len(buf)
        self.byte_order = byte_order
        self.skip_damaged = skip_damaged
        self.qq = struct.Struct(byte_order + "Qq")
        self.q = struct.Struct(byte_order + "Q")

    def fail(self, offset: int, reason: str) -> ImportFormatError:
        return ImportFormatError(f"{self.path}: byte offset {offset}: {reason}")

    def read(self) -> MosquittoDb:
        buf = self.buf
        if self.size == 0:
            raise self.fail(0, "file is empty: not a Mosquitto persistence file")
        if self.size < 15 or bytes(buf[:15]) != MAGIC:
            raise self.fail(0, "not a Mosquitto persistence file (bad magic; expected 00 B5 00 'mosquitto db')")
        if self.size < HEADER_SIZE:
            raise self.fail(15, f"truncated file header ({self.size} of {HEADER_SIZE} bytes)")
        crc, version = struct.unpack_from(">II", buf, 15)
        if version not in SUPPORTED_VERSIONS:
            raise self.fail(19, f"unsupported database version {version} (supported: 2-6)")
        db = MosquittoDb(self.path, DbHeader(version, crc), self.size)
        pos = HEADER_SIZE
        v56 = version >= 5
        hdr = _HDR56 if v56 else _HDR234
        while pos < self.size:
            if pos + hdr.size > self.size:
                reason = f"truncated chunk header ({self.size - pos} of {hdr.size} bytes)"
                if not self.skip_damaged:
                    raise self.fail(pos, reason)
                db.damaged.append(DamagedRegion(pos, self.size - pos, None, reason))
                break
            ctype, length = hdr.unpack_from(buf, pos)
            body = pos + hdr.size
            try:
                chunk, nxt = self.chunk(ctype, length, body, version)
            except _Damage as d:
                reason = f"{_type_name(ctype)} chunk at offset {pos}: {d.reason}"
                if not self.skip_damaged:
                    raise self.fail(d.offset, reason) from None
                if length and body + length <= self.size and ctype in _KNOWN:
                    db.damaged.append(DamagedRegion(pos, hdr.size + length, ctype, f"{reason} (byte offset {d.offset})"))
                    pos = body + length
                    continue
                db.damaged.append(DamagedRegion(pos, None, ctype, f"{reason} (byte offset {d.offset}); rest of file unreadable"))
                break
            if isinstance(chunk, CfgChunk):
                db.cfg = chunk
            db.chunks.append(chunk)
            pos = nxt
        return db

    def chunk(self, ctype: int, length: int, body: int, version: int) -> tuple[Chunk, int]:
        order = self.byte_order
        v56 = version >= 5
        if ctype not in _KNOWN:
            if ctype == 0:  # no Mosquitto writes it: zeroed or junk data (else a run of zeros is millions of chunks)
                raise _Damage(body - (8 if v56 else 6), "chunk type 0 is not a Mosquitto chunk (zeroed or junk data)")
            if body + length > self.size:
                raise _Damage(body, f"chunk length {length} runs past the end of the file ({self.size - body} bytes left)")
            return UnknownChunk(ctype, bytes(self.buf[body:body + length]), body - (8 if v56 else 6)), body + length
        off = body - (8 if v56 else 6)
        # Bodies of MSG_STORE/CLIENT_MSG (v5/v6) are bounded by the length;
        # the others, as in Mosquitto, by the file only.
        bounded = v56 and ctype in (ChunkType.MSG_STORE, ChunkType.CLIENT_MSG)
        if bounded and body + length > self.size:
            raise _Damage(body, f"chunk length {length} runs past the end of the file ({self.size - body} bytes left)")
        if bounded:  # the hot chunks of a big file: fixed parts by unpack_from, no cursor
            if ctype == ChunkType.MSG_STORE:
                return self.msg_store_v56(body, length, off)
            return self.client_msg_v56(body, length, off)
        c = _Cur(self.buf, body, self.size, order)
        if ctype == ChunkType.CFG:
            if v56:
                last = c.hu64("CFG last_db_id")
                shutdown = c.u8("CFG shutdown")
                dbid_size = c.u8("CFG dbid_size")
                c.take(6, "CFG struct padding")
            else:
                shutdown = c.u8("CFG shutdown")
                dbid_size = c.u8("CFG dbid_size")
                last = c.hu64("CFG last_db_id")
            if dbid_size != DBID_SIZE:
                raise _Damage(off, f"CFG dbid_size is {dbid_size}, expected {DBID_SIZE}")
            return CfgChunk(last, bool(shutdown), dbid_size, off), c.pos
        if ctype == ChunkType.MSG_STORE:
            return self.msg_store_v234(c, version, off)
        if ctype == ChunkType.CLIENT_MSG:  # v2-v4
            client_id = c.lname("CLIENT_MSG client id")
            store_id = c.hu64("CLIENT_MSG store_id")
            mid = c.u16("CLIENT_MSG mid")
            qos = c.u8("CLIENT_MSG qos")
            retain = c.u8("CLIENT_MSG retain")
            direction = c.u8("CLIENT_MSG direction")
            state = c.u8("CLIENT_MSG state")
            dup = c.u8("CLIENT_MSG dup")
            _check_qos(qos, c.pos, "CLIENT_MSG")
            return ClientMsgChunk(store_id, client_id, mid, qos, state, direction, bool(retain & 0x0F),
                                  bool(dup), NO_PROPERTIES, off), c.pos
        if ctype == ChunkType.RETAIN:
            return RetainChunk(c.hu64("RETAIN store_id"), off), c.pos
        if ctype == ChunkType.SUB:
            if v56:
                identifier, id_len, topic_len, qos, options = c.unpack(_SUB, "SUB fields")
                client_id = c.name(id_len, "SUB client id")
                topic = c.name(topic_len, "SUB topic")
            else:
                identifier, options = 0, 0
                client_id = c.lname("SUB client id")
                topic = c.lname("SUB topic")
                qos = c.u8("SUB qos")
            return SubChunk(client_id, topic, qos, identifier, options, off), c.pos
        # CLIENT
        if version == 6:
            sexp = c.unpack(struct.Struct(order + "q"), "CLIENT session_expiry_time")[0]
            interval, last_mid, id_len, port, ulen = c.unpack(_CLIENT_V6_TAIL, "CLIENT fields")
            client_id = c.name(id_len, "CLIENT client id")
            username = bytes(c.take(ulen, "CLIENT username")) if ulen else None
            disc = None
        elif version == 5:
            sexp = c.unpack(struct.Struct(order + "q"), "CLIENT session_expiry_time")[0]
            interval, last_mid, id_len = c.unpack(_CLIENT_V5_TAIL, "CLIENT fields")
            client_id = c.name(id_len, "CLIENT client id")
            port, username, disc = 0, None, None
        else:
            client_id = c.lname("CLIENT client id")
            last_mid = c.u16("CLIENT last_mid")
            disc = c.unpack(struct.Struct(order + "q"), "CLIENT disconnect time")[0] if version != 2 else None
            sexp, interval, port, username = 0, 0, 0, None
        if not client_id:
            raise _Damage(off, "CLIENT chunk with an empty client id")
        return ClientChunk(client_id, last_mid, sexp, interval, port, username, disc, off), c.pos

    def msg_store_v56(self, body: int, length: int, off: int) -> tuple[Chunk, int]:
        buf, end = self.buf, body + length  # end <= file size: checked by the caller
        if length < 32:
            raise _Damage(body, f"MSG_STORE chunk length {length} is smaller than its fixed part (32 bytes)")
        store_id, expiry = self.qq.unpack_from(buf, body)
        payloadlen, source_mid, id_len, user_len, topic_len, port, qos, retain = _MSG_STORE_TAIL.unpack_from(
            buf, body + 16)
        if payloadlen > MQTT_MAX_PAYLOAD:
            raise _Damage(body + 16, f"MSG_STORE payload length {payloadlen} exceeds the MQTT maximum")
        need = 32 + id_len + user_len + topic_len + payloadlen
        if need > length:
            raise _Damage(body, f"MSG_STORE chunk length {length} is smaller than its fields ({need} bytes)")
        if qos > 2:
            raise _Damage(body + 30, f"MSG_STORE QoS {qos} is not 0, 1 or 2")
        p = body + 32
        source_id = _text(buf[p:p + id_len]) if id_len else None
        p += id_len
        username = _text(buf[p:p + user_len]) if user_len else None
        p += user_len
        if not topic_len:
            raise _Damage(off, "MSG_STORE with an empty topic")
        topic = _name(buf[p:p + topic_len], p, "MSG_STORE topic")
        p += topic_len
        payload = buf[p:p + payloadlen]
        p += payloadlen
        props = _parse_properties(_Cur(buf, p, end, self.byte_order), end) if p < end else NO_PROPERTIES
        return MsgStoreChunk(store_id, topic, payload, qos, bool(retain), expiry, source_mid, source_id,
                             username, port, props, off), end

    def client_msg_v56(self, body: int, length: int, off: int) -> tuple[Chunk, int]:
        buf, end = self.buf, body + length
        if length < 16:
            raise _Damage(body, f"CLIENT_MSG chunk length {length} is smaller than its fixed part (16 bytes)")
        (store_id,) = self.q.unpack_from(buf, body)
        mid, id_len, qos, state, rd, direction = _CLIENT_MSG_TAIL.unpack_from(buf, body + 8)
        if 16 + id_len > length:
            raise _Damage(body, f"CLIENT_MSG chunk length {length} is smaller than its fields ({16 + id_len} bytes)")
        if qos > 2:
            raise _Damage(body + 12, f"CLIENT_MSG QoS {qos} is not 0, 1 or 2")
        p = body + 16
        client_id = _name(buf[p:p + id_len], p, "CLIENT_MSG client id")
        p += id_len
        props = _parse_properties(_Cur(buf, p, end, self.byte_order), end) if p < end else NO_PROPERTIES
        return ClientMsgChunk(store_id, client_id, mid, qos, state, direction, bool((rd & 0xF0) >> 4 & 0x0F),
                              bool(rd & 0x0F), props, off), end

    def msg_store_v234(self, c: _Cur, version: int, off: int) -> tuple[Chunk, int]:
        store_id = c.hu64("MSG_STORE store_id")
        source_id = c.lstring("MSG_STORE source id") or None
        username, port = None, 0
        if version == 4:
            username = c.lstring("MSG_STORE source username") or None
            port = c.u16("MSG_STORE source port")
        source_mid = c.u16("MSG_STORE source mid")
        c.u16("MSG_STORE mid")
        topic = c.lname("MSG_STORE topic")
        qos = c.u8("MSG_STORE qos")
        retain = c.u8("MSG_STORE retain")
        payloadlen = c.u32("MSG_STORE payload length")
        if payloadlen > MQTT_MAX_PAYLOAD:
            raise _Damage(c.pos - 4, f"MSG_STORE payload length {payloadlen} exceeds the MQTT maximum")
        payload = bytes(c.take(payloadlen, "MSG_STORE payload"))
        expiry, props = 0, NO_PROPERTIES
        _check_qos(qos, c.pos, "MSG_STORE")
        if not topic:
            raise _Damage(off, "MSG_STORE with an empty topic")
        return MsgStoreChunk(store_id, topic, payload, qos, bool(retain), expiry, source_mid, source_id,
                             username, port, props, off), c.pos


_KNOWN = frozenset(int(t) for t in ChunkType)


def _check_qos(qos: int, pos: int, what: str) -> None:
    if qos > 2:
        raise _Damage(pos, f"{what} QoS {qos} is not 0, 1 or 2")


def _type_name(ctype: int) -> str:
    try:
        return ChunkType(ctype).name
    except ValueError:
        return f"type-{ctype}"


def parse_db(data: bytes | memoryview, path: str = "<mosquitto.db>", *, skip_damaged: bool = False,
             byte_order: str = HOST_ORDER) -> MosquittoDb:
    """Decode a whole ``mosquitto.db`` image (errors name ``path`` and the byte offset)."""
    return _Reader(path, data if isinstance(data, bytes) else bytes(data), byte_order, skip_damaged).read()


def read_db(path: str | os.PathLike[str], *, skip_damaged: bool = False, byte_order: str = HOST_ORDER) -> MosquittoDb:
    """Read a persistence file (opened read-only; Mosquitto holds it all in memory too)."""
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            head = f.read(len(MAGIC))
            if head != MAGIC:  # before anything else: /dev/zero or a huge junk file is never read whole
                return parse_db(head, p, skip_damaged=skip_damaged, byte_order=byte_order)
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ImportFormatError(f"{p}: not a regular file; copy the persistence file out first")
            if os.fstat(f.fileno()).st_size == 0:
                return parse_db(b"", p, skip_damaged=skip_damaged, byte_order=byte_order)
            # Mapped, not read: pages come from the page cache as chunks are decoded (no second copy).
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return _Reader(p, data, byte_order, skip_damaged).read()
    except OSError as e:
        raise ImportFormatError(f"{p}: cannot read: {e.strerror or e}") from None
