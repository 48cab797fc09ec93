/* Optional C speedup for the RBAK record codec (pure-Python fallback in batch.py).
 *
 * Every function here handles the canonical record shape, exactly what rbak
 * and the Rust tool write ({"body":[..] or null,"properties":{13 keys in
 * spec order},"headers":[..],...} compact), and hands anything else back to
 * the orjson path (None), which stays the reference and gives the precise
 * error. The tests check both paths produce the same bytes and records.
 *
 * split_record(raw) -> (body, rest JSON) | None
 * join_record(body, rest) -> record JSON (bodies >= 64 KiB without the GIL)
 * encode_record(record) -> JSON | None, encode_many(records) -> [JSON | None]
 * encode_payload(records) -> payload bytes | None
 * decode_many(raws) -> [BackupRecord | None]
 * decode_payload(payload) -> ([BackupRecord | raw JSON], fallback indices) | None
 * configure(...) gives the decoder record.py's classes once, at import.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

/* _crc32.c: CRC-32 as zlib computes it, and combining two CRCs. */
uint32_t rbak_crc32(uint32_t crc, const unsigned char *p, size_t n);
PyObject *rbak_crc32_py(PyObject *self, PyObject *args);
PyObject *rbak_crc32_combine_py(PyObject *self, PyObject *args);

static const char OPEN[] = "{\"body\":[";
static const char NUL[] = "{\"body\":null";

static PyObject *rest_from(const unsigned char *p, Py_ssize_t n, Py_ssize_t start) {
    /* b'{' + p[start:n] */
    PyObject *r = PyBytes_FromStringAndSize(NULL, n - start + 1);
    if (!r) return NULL;
    char *d = PyBytes_AS_STRING(r);
    d[0] = '{';
    memcpy(d + 1, p + start, n - start);
    return r;
}

static int is_ws(unsigned char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

/* Parses the body part of a canonical record starting at p[0].
 * Returns the index where the rest begins (just after the ',' following the
 * body, or at the closing '}'), storing the body bytes in *body; -2 when the
 * record is not canonical (no exception set), -1 on a Python error. */
static Py_ssize_t parse_body(const unsigned char *p, Py_ssize_t n, PyObject **body) {
    *body = NULL;
    if (n >= 13 && memcmp(p, NUL, 12) == 0 && (p[12] == ',' || p[12] == '}')) {
        *body = PyBytes_FromStringAndSize("", 0);
        if (!*body) return -1;
        return p[12] == ',' ? 13 : 12;
    }
    if (n < 10 || memcmp(p, OPEN, 9) != 0) return -2;

    /* The output is at most (n - 9) / 2 + 1 bytes: every value takes >= 1 digit + 1 separator. */
    Py_ssize_t cap = (n - 9) / 2 + 1;
    PyObject *out = PyBytes_FromStringAndSize(NULL, cap);
    if (!out) return -1;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    Py_ssize_t len = 0, i = 9;
    /* Fast loop for the compact form ("1,22,255]"); anything else (spaces,
     * more digits, a bad character) drops to the general loop below. */
    while (i + 4 <= n) {
        unsigned c0 = p[i] - '0';
        if (c0 > 9) break;
        unsigned v = c0, c = p[i + 1] - '0';
        Py_ssize_t j = i + 1;
        if (c <= 9) {
            v = v * 10 + c; c = p[i + 2] - '0'; j = i + 2;
            if (c <= 9) { v = v * 10 + c; j = i + 3; if ((unsigned)(p[j] - '0') <= 9) break; }
        }
        if (v > 255 || len >= cap || (c0 == 0 && j > i + 1)) break;  /* too big, full, or a leading zero */
        unsigned char sep = p[j];
        if (sep == ',') { o[len++] = (unsigned char)v; i = j + 1; continue; }
        if (sep == ']') { o[len++] = (unsigned char)v; i = j + 1; goto body_done; }
        break;
    }
    while (i < n && is_ws(p[i])) i++;
    if (len == 0 && i < n && p[i] == ']') {  /* [] only: after a value, ']' must follow it, not a comma */
        i++;
    } else {
        for (;;) {
            while (i < n && is_ws(p[i])) i++;
            if (i >= n || p[i] < '0' || p[i] > '9') goto not_canonical;
            unsigned v = 0; int digits = 0;
            int leading_zero = p[i] == '0' && i + 1 < n && p[i + 1] >= '0' && p[i + 1] <= '9';  /* not JSON */
            while (i < n && p[i] >= '0' && p[i] <= '9' && digits < 4) { v = v * 10 + (p[i] - '0'); i++; digits++; }
            if (v > 255 || digits > 3 || len >= cap || leading_zero) goto not_canonical;
            o[len++] = (unsigned char)v;
            while (i < n && is_ws(p[i])) i++;
            if (i < n && p[i] == ',') { i++; continue; }
            if (i < n && p[i] == ']') { i++; break; }
            goto not_canonical;
        }
    }
body_done:
    while (i < n && is_ws(p[i])) i++;
    Py_ssize_t rest;
    if (i < n && p[i] == ',') rest = i + 1;
    else if (i < n && p[i] == '}') rest = i;
    else goto not_canonical;
    if (_PyBytes_Resize(&out, len) < 0) return -1;
    *body = out;
    return rest;

not_canonical:
    Py_DECREF(out);
    return -2;
}

static PyObject *split_record(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *p = (const unsigned char *)view.buf;
    Py_ssize_t n = view.len;
    PyObject *body, *result = NULL;
    Py_ssize_t rest = parse_body(p, n, &body);
    if (rest == -2) {
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    if (rest >= 0) {
        PyObject *rest_obj = rest_from(p, n, rest);
        if (rest_obj) result = Py_BuildValue("(NN)", body, rest_obj);
        else Py_DECREF(body);
    }
    PyBuffer_Release(&view);
    return result;
}

/* Each byte value's digits followed by a comma ("7," "42," "255,"), zero
 * padded to 4 bytes, and how many of those bytes are real. */
static uint32_t DIGITS_COMMA[256];
static unsigned char DIGITS_COMMA_LEN[256];

/* Bodies at least this big are converted without the GIL (when immutable). */
#define NOGIL_BODY_BYTES (64 * 1024)

/* The same for every pair of byte values ("7,42," ...), padded to 8 bytes:
 * half the loop iterations (512 KiB, built on first use). */
static uint64_t *PAIR_COMMA;
static unsigned char *PAIR_COMMA_LEN;

static int build_pairs(void) {
    PAIR_COMMA = PyMem_RawMalloc(65536 * sizeof(uint64_t));
    PAIR_COMMA_LEN = PyMem_RawMalloc(65536);
    if (!PAIR_COMMA || !PAIR_COMMA_LEN) return -1;
    for (int v = 0; v < 65536; v++) {
        /* index = the two bytes as they lie in memory, read little or big endian alike */
        unsigned char two[2];
        uint16_t idx = (uint16_t)v;
        memcpy(two, &idx, 2);
        char tmp[8] = {0};
        unsigned l0 = DIGITS_COMMA_LEN[two[0]], l1 = DIGITS_COMMA_LEN[two[1]];
        memcpy(tmp, &DIGITS_COMMA[two[0]], l0);
        memcpy(tmp + l0, &DIGITS_COMMA[two[1]], l1);
        memcpy(&PAIR_COMMA[v], tmp, 8);
        PAIR_COMMA_LEN[v] = (unsigned char)(l0 + l1);
    }
    return 0;
}

static char *write_digits(char *d, const unsigned char *b, Py_ssize_t len) {
    /* Copy 8 (or 4), advance by the real length: the spill is overwritten by
     * the next value; the caller allocated 8 spare bytes at the end. */
    Py_ssize_t i = 0;
    for (; i + 2 <= len; i += 2) {
        uint16_t idx;
        memcpy(&idx, b + i, 2);
        memcpy(d, &PAIR_COMMA[idx], 8);
        d += PAIR_COMMA_LEN[idx];
    }
    for (; i < len; i++) {
        unsigned char v = b[i];
        memcpy(d, &DIGITS_COMMA[v], 4);
        d += DIGITS_COMMA_LEN[v];
    }
    return d;
}

static PyObject *join_record(PyObject *self, PyObject *args) {
    PyObject *body_obj, *rest_obj;
    Py_buffer body, rest;
    if (!PyArg_ParseTuple(args, "OO", &body_obj, &rest_obj)) return NULL;
    if (PyObject_GetBuffer(body_obj, &body, PyBUF_SIMPLE) < 0) return NULL;
    if (PyObject_GetBuffer(rest_obj, &rest, PyBUF_SIMPLE) < 0) { PyBuffer_Release(&body); return NULL; }
    PyObject *out = NULL;
    const unsigned char *b = (const unsigned char *)body.buf;
    const char *r = (const char *)rest.buf;
    if (rest.len < 2 || r[0] != '{') {
        PyErr_SetString(PyExc_ValueError, "rest must be a JSON object");
        goto done;
    }
    int only = (rest.len == 2);  /* rest is "{}": the body is the only field */
    if (body.len == 0) {
        static const char nul[] = "{\"body\":null";
        Py_ssize_t n = 12 + (only ? 1 : 1 + rest.len - 1);
        out = PyBytes_FromStringAndSize(NULL, n);
        if (!out) goto done;
        char *d = PyBytes_AS_STRING(out);
        memcpy(d, nul, 12);
        if (only) d[12] = '}';
        else { d[12] = ','; memcpy(d + 13, r + 1, rest.len - 1); }
        goto done;
    }
    /* A bytes body cannot change under us, so big ones are converted with
     * the GIL released (the importer overlaps this with decoding). */
    int nogil = body.len >= NOGIL_BODY_BYTES && PyBytes_CheckExact(body_obj);
    Py_ssize_t chars = 0;  /* digits and commas */
    if (nogil) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < body.len; i++) chars += DIGITS_COMMA_LEN[b[i]];
        Py_END_ALLOW_THREADS
    } else {
        for (Py_ssize_t i = 0; i < body.len; i++) chars += DIGITS_COMMA_LEN[b[i]];
    }
    /* {"body":[ + digits and commas (the last comma becomes ']') + (',' + rest[1:] | '}') */
    Py_ssize_t n = 9 + chars + (only ? 1 : rest.len);
    out = PyBytes_FromStringAndSize(NULL, n + 8);  /* + the last copy's spill */
    if (!out) goto done;
    char *d = PyBytes_AS_STRING(out);
    memcpy(d, "{\"body\":[", 9);
    if (nogil) {
        Py_BEGIN_ALLOW_THREADS
        d = write_digits(d + 9, b, body.len);
        Py_END_ALLOW_THREADS
    } else {
        d = write_digits(d + 9, b, body.len);
    }
    d[-1] = ']';
    if (only) *d = '}';
    else { *d++ = ','; memcpy(d, r + 1, rest.len - 1); }
    if (_PyBytes_Resize(&out, n) < 0) out = NULL;  /* shrinks in place */
done:
    PyBuffer_Release(&body);
    PyBuffer_Release(&rest);
    return out;
}

/* ------------------------------------------------------------------------
 * decode_many(raws): whole records of the canonical shape, straight to the
 * BackupRecord objects of record.py.
 *
 * The canonical shape is exactly what rbak and the Rust tool write: the
 * spec's key order, compact, property and scalar header values only. Parsing
 * it here and filling the slots dataclasses directly (no __init__ call, no
 * intermediate dict) is what lets decoding keep up with zstd. Every other
 * record (another key order, whitespace, floats, Bytes/Table/Array headers,
 * invalid JSON) gives None in its place, and batch.py decodes it with the
 * lenient orjson path, which also produces the precise error message.
 * ---------------------------------------------------------------------- */

#define N_PROPS 13
#define N_REC 10
#define N_TAGS 6

static PyTypeObject *RecordT, *PropsT;
static PyObject *RecordSlots[N_REC], *PropsSlots[N_PROPS];
static PyTypeObject *TagT[N_TAGS];
static PyObject *TagValue[N_TAGS];
static PyObject *EmptyTuple;
static int configured = 0;

/* Same order as record.py's _SCALAR_VARIANTS; each followed by '":'. */
static const char *TAGS[N_TAGS] = {"LongString", "ShortString", "Long", "Short", "Bool", "Timestamp"};

static const char *PROP_KEYS[N_PROPS] = {
    "{\"content_type\":", ",\"content_encoding\":", ",\"delivery_mode\":", ",\"priority\":",
    ",\"correlation_id\":", ",\"reply_to\":", ",\"expiration\":", ",\"message_id\":",
    ",\"timestamp\":", ",\"type_field\":", ",\"user_id\":", ",\"app_id\":", ",\"cluster_id\":",
};
/* The record's fields after "headers", each preceded by its key. */
static const char *TAIL_KEYS[7] = {
    ",\"exchange\":", ",\"routing_key\":", ",\"delivery_tag\":", ",\"redelivered\":",
    ",\"backed_up_at\":", ",\"source_queue\":", ",\"source_vhost\":",
};

typedef struct {
    const unsigned char *p;
    Py_ssize_t i, n;
    int fallback; /* set when the input is not canonical (no exception) */
} Parser;

static int lit(Parser *s, const char *l) {
    size_t len = strlen(l);
    if ((size_t)(s->n - s->i) < len || memcmp(s->p + s->i, l, len) != 0) return 0;
    s->i += len;
    return 1;
}

#define NOT_CANONICAL(s) do { (s)->fallback = 1; return NULL; } while (0)

static int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static long hex4(Parser *s) {
    if (s->n - s->i < 4) return -1;
    long v = 0;
    for (int k = 0; k < 4; k++) {
        int h = hexval(s->p[s->i + k]);
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    s->i += 4;
    return v;
}

static PyObject *utf8_str(Parser *s, const char *b, Py_ssize_t len) {
    PyObject *r = PyUnicode_DecodeUTF8(b, len, NULL);
    if (!r && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        PyErr_Clear(); /* let orjson name the bad record */
        s->fallback = 1;
    }
    return r;
}

/* Short ASCII strings recur in nearly every record of a queue (exchange,
 * routing key, queue, vhost, content type, header names): a small
 * direct-mapped cache hands out the same immutable str instead of building
 * a new one each time. */
#define STR_CACHE_SIZE 1024
#define STR_CACHE_MAX_LEN 48
static PyObject *str_cache[STR_CACHE_SIZE];

static PyObject *ascii_str(const unsigned char *b, Py_ssize_t len) {
    if (len > STR_CACHE_MAX_LEN) return PyUnicode_DecodeASCII((const char *)b, len, NULL);
    uint32_t h = 2166136261u;
    for (Py_ssize_t k = 0; k < len; k++) h = (h ^ b[k]) * 16777619u;
    PyObject **slot = &str_cache[(h ^ (uint32_t)len) & (STR_CACHE_SIZE - 1)];
    PyObject *str = *slot;
    if (str && PyUnicode_GET_LENGTH(str) == len && memcmp(PyUnicode_DATA(str), b, len) == 0) {
        Py_INCREF(str);
        return str;
    }
    str = PyUnicode_New(len, 127);
    if (!str) return NULL;
    memcpy(PyUnicode_DATA(str), b, len);
    Py_INCREF(str);
    Py_XSETREF(*slot, str);
    return str;
}

/* A JSON string at p[i] == '"'. */
static PyObject *parse_string(Parser *s) {
    const unsigned char *p = s->p;
    Py_ssize_t start = ++s->i, i = start, n = s->n;
    unsigned char high = 0;
    while (i < n && p[i] != '"' && p[i] != '\\' && p[i] >= 0x20) high |= p[i++];
    if (i >= n || p[i] < 0x20) NOT_CANONICAL(s);
    if (p[i] == '"') {
        s->i = i + 1;
        if (!(high & 0x80)) return ascii_str(p + start, i - start);
        return utf8_str(s, (const char *)p + start, i - start);
    }
    /* Escapes: unescape into UTF-8 (never longer than the input). */
    char *buf = PyMem_Malloc(n - start + 1);
    if (!buf) return PyErr_NoMemory();
    Py_ssize_t o = i - start;
    memcpy(buf, p + start, o);
    s->i = i;
    for (;;) {
        if (s->i >= n) goto bad;
        unsigned char c = p[s->i];
        if (c == '"') { s->i++; break; }
        if (c < 0x20) goto bad;
        if (c != '\\') { buf[o++] = (char)c; s->i++; continue; }
        if (++s->i >= n) goto bad;
        c = p[s->i++];
        switch (c) {
        case '"': buf[o++] = '"'; break;
        case '\\': buf[o++] = '\\'; break;
        case '/': buf[o++] = '/'; break;
        case 'b': buf[o++] = '\b'; break;
        case 'f': buf[o++] = '\f'; break;
        case 'n': buf[o++] = '\n'; break;
        case 'r': buf[o++] = '\r'; break;
        case 't': buf[o++] = '\t'; break;
        case 'u': {
            long cp = hex4(s);
            if (cp < 0) goto bad;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (s->n - s->i < 6 || p[s->i] != '\\' || p[s->i + 1] != 'u') goto bad;
                s->i += 2;
                long lo = hex4(s);
                if (lo < 0xDC00 || lo > 0xDFFF) goto bad;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                goto bad; /* a lone surrogate: the lenient path decides */
            }
            if (cp < 0x80) buf[o++] = (char)cp;
            else if (cp < 0x800) { buf[o++] = (char)(0xC0 | (cp >> 6)); buf[o++] = (char)(0x80 | (cp & 0x3F)); }
            else if (cp < 0x10000) {
                buf[o++] = (char)(0xE0 | (cp >> 12)); buf[o++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                buf[o++] = (char)(0x80 | (cp & 0x3F));
            } else {
                buf[o++] = (char)(0xF0 | (cp >> 18)); buf[o++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                buf[o++] = (char)(0x80 | ((cp >> 6) & 0x3F)); buf[o++] = (char)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default: goto bad;
        }
    }
    {
        PyObject *r = utf8_str(s, buf, o);
        PyMem_Free(buf);
        return r;
    }
bad:
    PyMem_Free(buf);
    NOT_CANONICAL(s);
}

/* A JSON integer that orjson would give as a Python int (i64 or u64). */
static PyObject *parse_int(Parser *s) {
    const unsigned char *p = s->p;
    Py_ssize_t i = s->i, n = s->n;
    int neg = 0;
    if (p[i] == '-') { neg = 1; i++; }
    if (i >= n || p[i] < '0' || p[i] > '9') NOT_CANONICAL(s);
    if (p[i] == '0' && i + 1 < n && p[i + 1] >= '0' && p[i + 1] <= '9') NOT_CANONICAL(s);
    unsigned long long v = 0;
    int digits = 0;
    while (i < n && p[i] >= '0' && p[i] <= '9') {
        unsigned d = p[i] - '0';
        if (v > (ULLONG_MAX - d) / 10) NOT_CANONICAL(s);
        v = v * 10 + d;
        i++;
        digits++;
    }
    if (i < n && (p[i] == '.' || p[i] == 'e' || p[i] == 'E')) NOT_CANONICAL(s); /* a float */
    s->i = i;
    if (neg) {
        if (v > (unsigned long long)LLONG_MAX + 1) NOT_CANONICAL(s);
        return PyLong_FromLongLong(v == (unsigned long long)LLONG_MAX + 1 ? LLONG_MIN : -(long long)v);
    }
    return PyLong_FromUnsignedLongLong(v);
}

/* null, true, false, a string or an integer; anything else is not canonical. */
static PyObject *parse_scalar(Parser *s) {
    if (s->i >= s->n) NOT_CANONICAL(s);
    unsigned char c = s->p[s->i];
    if (c == '"') return parse_string(s);
    if (c == '-' || (c >= '0' && c <= '9')) return parse_int(s);
    if (lit(s, "null")) Py_RETURN_NONE;
    if (lit(s, "true")) Py_RETURN_TRUE;
    if (lit(s, "false")) Py_RETURN_FALSE;
    NOT_CANONICAL(s);
}

/* A slots-dataclass instance with its fields set through their member
 * descriptors, as __init__ would (record.py's classes have no other logic).
 * Steals the references in vals. */
static PyObject *build(PyTypeObject *t, PyObject **slots, PyObject **vals, int n) {
    PyObject *o = t->tp_alloc(t, 0);
    for (int k = 0; k < n; k++) {
        if (o && Py_TYPE(slots[k])->tp_descr_set(slots[k], o, vals[k]) < 0) Py_CLEAR(o);
        Py_DECREF(vals[k]);
    }
    return o;
}

static PyObject *parse_properties(Parser *s) {
    PyObject *vals[N_PROPS];
    if (lit(s, "null") || lit(s, "{}")) {
        for (int k = 0; k < N_PROPS; k++) { vals[k] = Py_None; Py_INCREF(Py_None); }
        return build(PropsT, PropsSlots, vals, N_PROPS);
    }
    for (int k = 0; k < N_PROPS; k++) {
        PyObject *v = lit(s, PROP_KEYS[k]) ? parse_scalar(s) : (s->fallback = 1, NULL);
        if (!v) { while (k--) Py_DECREF(vals[k]); return NULL; }
        vals[k] = v;
    }
    if (!lit(s, "}")) { s->fallback = 1; for (int k = 0; k < N_PROPS; k++) Py_DECREF(vals[k]); return NULL; }
    return build(PropsT, PropsSlots, vals, N_PROPS);
}

/* ["key",{"Tag":scalar}] */
static PyObject *parse_header(Parser *s) {
    if (!lit(s, "[\"")) NOT_CANONICAL(s);
    s->i--; /* back to the key's opening quote */
    PyObject *key = parse_string(s);
    if (!key) return NULL;
    int tag = -1;
    if (lit(s, ",{\"")) {
        for (int k = 0; k < N_TAGS; k++) {
            Py_ssize_t save = s->i;
            if (lit(s, TAGS[k]) && lit(s, "\":")) { tag = k; break; }
            s->i = save;
        }
    }
    if (tag < 0) { Py_DECREF(key); NOT_CANONICAL(s); }
    PyObject *v = parse_scalar(s);
    if (!v) { Py_DECREF(key); return NULL; }
    if (!lit(s, "}]")) { Py_DECREF(key); Py_DECREF(v); NOT_CANONICAL(s); }
    PyObject *variant = build(TagT[tag], &TagValue[tag], &v, 1);
    if (!variant) { Py_DECREF(key); return NULL; }
    PyObject *pair = PyTuple_New(2);
    if (!pair) { Py_DECREF(key); Py_DECREF(variant); return NULL; }
    PyTuple_SET_ITEM(pair, 0, key);
    PyTuple_SET_ITEM(pair, 1, variant);
    return pair;
}

static PyObject *parse_headers(Parser *s) {
    if (lit(s, "null") || lit(s, "[]")) { Py_INCREF(EmptyTuple); return EmptyTuple; }
    if (!lit(s, "[")) NOT_CANONICAL(s);
    PyObject *list = PyList_New(0);
    if (!list) return NULL;
    for (;;) {
        PyObject *h = parse_header(s);
        if (!h || PyList_Append(list, h) < 0) { Py_XDECREF(h); Py_DECREF(list); return NULL; }
        Py_DECREF(h);
        if (lit(s, ",")) continue;
        if (lit(s, "]")) break;
        Py_DECREF(list);
        NOT_CANONICAL(s);
    }
    PyObject *t = PyList_AsTuple(list);
    Py_DECREF(list);
    return t;
}

/* One record, or Py_None (new reference) when it is not canonical. */
static PyObject *decode_one(const unsigned char *buf, Py_ssize_t len) {
    Parser s = {buf, 0, len, 0};
    PyObject *vals[N_REC] = {NULL};
    int k = 0;
    Py_ssize_t rest = parse_body(s.p, s.n, &vals[0]);
    if (rest < 0) { s.fallback = rest == -2; goto fail; }
    k = 1;
    s.i = rest;
    if (!lit(&s, "\"properties\":")) { s.fallback = 1; goto fail; }
    if (!(vals[k] = parse_properties(&s))) goto fail;
    k++;
    if (!lit(&s, ",\"headers\":")) { s.fallback = 1; goto fail; }
    if (!(vals[k] = parse_headers(&s))) goto fail;
    k++;
    for (int t = 0; t < 7; t++, k++) {
        if (!lit(&s, TAIL_KEYS[t])) { s.fallback = 1; goto fail; }
        if (!(vals[k] = parse_scalar(&s))) goto fail;
        if (vals[k] == Py_None) { k++; s.fallback = 1; goto fail; } /* the lenient path defaults it */
    }
    if (!lit(&s, "}") || s.i != s.n) { s.fallback = 1; goto fail; }
    return build(RecordT, RecordSlots, vals, N_REC);

fail:
    while (k-- > 0) Py_XDECREF(vals[k]);
    if (s.fallback && !PyErr_Occurred()) Py_RETURN_NONE;
    return NULL;
}

static int check_configured(void) {
    if (!configured) PyErr_SetString(PyExc_RuntimeError, "_speedups.configure() was not called");
    return configured;
}

/* [fn(x) for x in seq], for the *_many entry points. */
static PyObject *map_sequence(PyObject *seq, PyObject *(*fn)(PyObject *), const char *what) {
    if (!check_configured()) return NULL;
    PyObject *fast = PySequence_Fast(seq, what);
    if (!fast) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    PyObject *out = PyList_New(n);
    if (!out) { Py_DECREF(fast); return NULL; }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *r = fn(PySequence_Fast_GET_ITEM(fast, k));
        if (!r) { Py_DECREF(out); Py_DECREF(fast); return NULL; }
        PyList_SET_ITEM(out, k, r);
    }
    Py_DECREF(fast);
    return out;
}

static PyObject *decode_item(PyObject *raw) {
    Py_buffer view;
    if (PyObject_GetBuffer(raw, &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *r = decode_one((const unsigned char *)view.buf, view.len);
    PyBuffer_Release(&view);
    return r;
}

/* decode_many(raws) -> list: each record built, or None where not canonical. */
static PyObject *decode_many(PyObject *self, PyObject *seq) {
    return map_sequence(seq, decode_item, "decode_many takes a sequence of records");
}

/* decode_payload(payload) -> (records, fallback_indices) or None.
 *
 * A whole decompressed payload ([u32 LE length][JSON] per record). Where a
 * record is not canonical, its raw JSON (bytes) stands in the list and its
 * index is in fallback_indices, for the lenient path. None when the framing
 * itself is broken: the caller's Python loop then names the byte offset. */
static PyObject *decode_payload(PyObject *self, PyObject *arg) {
    if (!check_configured()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *p = (const unsigned char *)view.buf;
    Py_ssize_t n = view.len, pos = 0;
    PyObject *out = PyList_New(0), *fallbacks = PyList_New(0), *result = NULL;
    if (!out || !fallbacks) goto done;
    while (pos < n) {
        if (n - pos < 4) goto broken;
        Py_ssize_t len = (Py_ssize_t)p[pos] | (Py_ssize_t)p[pos + 1] << 8 | (Py_ssize_t)p[pos + 2] << 16
                         | (Py_ssize_t)p[pos + 3] << 24;
        pos += 4;
        if (len > n - pos) goto broken;
        PyObject *r = decode_one(p + pos, len);
        if (!r) goto done;
        if (r == Py_None) {
            Py_DECREF(r);
            PyObject *idx = PyLong_FromSsize_t(PyList_GET_SIZE(out));
            r = PyBytes_FromStringAndSize((const char *)p + pos, len);
            if (!idx || !r || PyList_Append(fallbacks, idx) < 0) { Py_XDECREF(idx); Py_XDECREF(r); goto done; }
            Py_DECREF(idx);
        }
        if (PyList_Append(out, r) < 0) { Py_DECREF(r); goto done; }
        Py_DECREF(r);
        pos += len;
    }
    result = PyTuple_Pack(2, out, fallbacks);
    goto done;
broken:
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&view);
    Py_XDECREF(out);
    Py_XDECREF(fallbacks);
    return result;
}

/* ------------------------------------------------------------------------
 * encode_many(records): each record's compact JSON, exactly as orjson writes
 * record.py's dicts (and serde_json the Rust structs), built straight from
 * the slots without the intermediate dicts. A record with anything else than
 * None/bool/int/str values or a non-scalar header variant (Bytes, Float,
 * Double, Void, Table, Array) gives None, and batch.py encodes it with
 * orjson, which also raises the precise error for unencodable values.
 * ---------------------------------------------------------------------- */

typedef struct {
    PyObject *bytes; /* the output being built; NULL after an error */
    char *d;         /* write position */
    char *end;       /* end of the allocation */
    int fallback;
} Out;

static int out_reserve(Out *o, Py_ssize_t more) {
    if (o->end - o->d >= more) return 0;
    char *base = PyBytes_AS_STRING(o->bytes);
    Py_ssize_t used = o->d - base, cap = o->end - base;
    Py_ssize_t want = cap * 2 > used + more ? cap * 2 : used + more + 256;
    if (_PyBytes_Resize(&o->bytes, want) < 0) return -1;
    base = PyBytes_AS_STRING(o->bytes);
    o->d = base + used;
    o->end = base + want;
    return 0;
}

static int out_raw(Out *o, const char *s, Py_ssize_t n) {
    if (out_reserve(o, n) < 0) return -1;
    memcpy(o->d, s, n);
    o->d += n;
    return 0;
}

#define OUT_LIT(o, s) out_raw((o), (s), (Py_ssize_t)(sizeof(s) - 1))

static const char HEX[] = "0123456789abcdef";

static int out_str(Out *o, PyObject *str) {
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(str, &n);
    if (!s) { /* lone surrogates: orjson names the problem */
        PyErr_Clear();
        o->fallback = 1;
        return -1;
    }
    if (out_reserve(o, 2 + 6 * n) < 0) return -1;
    char *d = o->d;
    *d++ = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') { *d++ = (char)c; continue; }
        *d++ = '\\';
        switch (c) {
        case '"': *d++ = '"'; break;
        case '\\': *d++ = '\\'; break;
        case '\b': *d++ = 'b'; break;
        case '\f': *d++ = 'f'; break;
        case '\n': *d++ = 'n'; break;
        case '\r': *d++ = 'r'; break;
        case '\t': *d++ = 't'; break;
        default: *d++ = 'u'; *d++ = '0'; *d++ = '0'; *d++ = HEX[c >> 4]; *d++ = HEX[c & 15];
        }
    }
    *d++ = '"';
    o->d = d;
    return 0;
}

/* None, bool, int (i64/u64) or str; anything else sets fallback. */
static int out_scalar(Out *o, PyObject *v) {
    if (v == Py_None) return OUT_LIT(o, "null");
    if (v == Py_True) return OUT_LIT(o, "true");
    if (v == Py_False) return OUT_LIT(o, "false");
    if (PyUnicode_CheckExact(v)) return out_str(o, v);
    if (PyLong_CheckExact(v)) {
        char tmp[24];
        int overflow = 0, len;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow > 0) {
            unsigned long long u = PyLong_AsUnsignedLongLong(v);
            if (u == (unsigned long long)-1 && PyErr_Occurred()) { PyErr_Clear(); o->fallback = 1; return -1; }
            len = snprintf(tmp, sizeof tmp, "%llu", u);
        } else if (overflow < 0) {
            o->fallback = 1;
            return -1;
        } else {
            len = snprintf(tmp, sizeof tmp, "%lld", x);
        }
        return out_raw(o, tmp, len);
    }
    o->fallback = 1;
    return -1;
}

static PyObject *slot(PyObject *descr, PyObject *obj) {
    return Py_TYPE(descr)->tp_descr_get(descr, obj, (PyObject *)Py_TYPE(obj));
}

static const char *REC_KEYS[N_REC] = {
    NULL, ",\"properties\":", ",\"headers\":", ",\"exchange\":", ",\"routing_key\":", ",\"delivery_tag\":",
    ",\"redelivered\":", ",\"backed_up_at\":", ",\"source_queue\":", ",\"source_vhost\":",
};

static int out_properties(Out *o, PyObject *props) {
    if (Py_TYPE(props) != PropsT) { o->fallback = 1; return -1; }
    for (int k = 0; k < N_PROPS; k++) {
        const char *key = PROP_KEYS[k];
        if (out_raw(o, key, strlen(key)) < 0) return -1;
        PyObject *v = slot(PropsSlots[k], props);
        if (!v) return -1;
        int rc = out_scalar(o, v);
        Py_DECREF(v);
        if (rc < 0) return -1;
    }
    return OUT_LIT(o, "}");
}

static int out_headers(Out *o, PyObject *headers) {
    PyObject *fast = PySequence_Fast(headers, "headers");
    if (!fast) { PyErr_Clear(); o->fallback = 1; return -1; }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    int rc = OUT_LIT(o, "[");
    for (Py_ssize_t k = 0; rc == 0 && k < n; k++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(fast, k);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyUnicode_CheckExact(PyTuple_GET_ITEM(pair, 0))) {
            o->fallback = 1; rc = -1; break;
        }
        PyObject *hv = PyTuple_GET_ITEM(pair, 1);
        int tag = -1;
        for (int t = 0; t < N_TAGS; t++) if (Py_TYPE(hv) == TagT[t]) { tag = t; break; }
        if (tag < 0) { o->fallback = 1; rc = -1; break; }
        if ((k && OUT_LIT(o, ",") < 0) || OUT_LIT(o, "[") < 0 || out_str(o, PyTuple_GET_ITEM(pair, 0)) < 0
            || OUT_LIT(o, ",{\"") < 0 || out_raw(o, TAGS[tag], strlen(TAGS[tag])) < 0 || OUT_LIT(o, "\":") < 0) {
            rc = -1; break;
        }
        PyObject *v = slot(TagValue[tag], hv);
        if (!v) { rc = -1; break; }
        rc = out_scalar(o, v);
        Py_DECREF(v);
        if (rc == 0) rc = OUT_LIT(o, "}]");
    }
    Py_DECREF(fast);
    return rc < 0 ? -1 : OUT_LIT(o, "]");
}

/* Everything of a record's JSON after its body ("properties" on, with the closing brace). */
static int encode_rest_into(Out *o, PyObject *rec) {
    for (int k = 1; k < N_REC; k++) {
        if (out_raw(o, REC_KEYS[k], strlen(REC_KEYS[k])) < 0) return -1;
        PyObject *v = slot(RecordSlots[k], rec);
        if (!v) return -1;
        int rc = k == 1 ? out_properties(o, v) : k == 2 ? out_headers(o, v) : out_scalar(o, v);
        Py_DECREF(v);
        if (rc < 0) return -1;
    }
    return OUT_LIT(o, "}");
}

/* Appends one record's JSON to o; -1 with o->fallback set when orjson must
 * do it, -1 with an exception on a Python error. */
static int encode_into(Out *o, PyObject *rec) {
    if (Py_TYPE(rec) != RecordT) { o->fallback = 1; return -1; }
    PyObject *body = slot(RecordSlots[0], rec);
    if (!body) return -1;
    if (!PyBytes_CheckExact(body)) { Py_DECREF(body); o->fallback = 1; return -1; }
    Py_ssize_t blen = PyBytes_GET_SIZE(body);
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(body);
    Py_ssize_t chars = 0;
    for (Py_ssize_t i = 0; i < blen; i++) chars += DIGITS_COMMA_LEN[b[i]];
    /* the body, write_digits' 8-byte spill and room for a typical rest */
    if (out_reserve(o, 16 + chars + 8 + 768) < 0) { Py_DECREF(body); return -1; }
    if (blen) {
        memcpy(o->d, "{\"body\":[", 9);
        o->d = write_digits(o->d + 9, b, blen);
        o->d[-1] = ']';
    } else {
        memcpy(o->d, "{\"body\":null", 12);
        o->d += 12;
    }
    Py_DECREF(body);
    return encode_rest_into(o, rec);
}

static int out_open(Out *o, Py_ssize_t cap) {
    o->bytes = PyBytes_FromStringAndSize(NULL, cap);
    if (!o->bytes) return -1;
    o->d = PyBytes_AS_STRING(o->bytes);
    o->end = o->d + cap;
    o->fallback = 0;
    return 0;
}

/* The finished bytes (shrunk to size); Py_None when o->fallback was set. */
static PyObject *out_close(Out *o, int rc) {
    if (rc < 0) {
        Py_CLEAR(o->bytes);
        if (o->fallback && !PyErr_Occurred()) Py_RETURN_NONE;
        return NULL;
    }
    if (_PyBytes_Resize(&o->bytes, o->d - PyBytes_AS_STRING(o->bytes)) < 0) return NULL;
    return o->bytes;
}

/* One record's JSON, or Py_None (new reference) when it needs orjson. */
static PyObject *encode_one(PyObject *rec) {
    Out o;
    if (out_open(&o, 4096) < 0) return NULL;
    return out_close(&o, encode_into(&o, rec));
}

static PyObject *encode_many(PyObject *self, PyObject *seq) {
    return map_sequence(seq, encode_one, "encode_many takes a sequence of records");
}

static PyObject *encode_record(PyObject *self, PyObject *rec) {
    return check_configured() ? encode_one(rec) : NULL;
}

/* encode_payload(records) -> bytes | None: the whole uncompressed segment
 * payload ([u32 LE length][JSON] per record) in one buffer, no per-record
 * objects; None when any record needs orjson (the caller's batch path). */
static PyObject *encode_payload(PyObject *self, PyObject *seq) {
    if (!check_configured()) return NULL;
    PyObject *fast = PySequence_Fast(seq, "encode_payload takes a sequence of records");
    if (!fast) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    Out o;
    if (out_open(&o, 64 * 1024) < 0) { Py_DECREF(fast); return NULL; }
    int rc = 0;
    for (Py_ssize_t k = 0; rc == 0 && k < n; k++) {
        if ((rc = out_reserve(&o, 4)) < 0) break;
        Py_ssize_t at = o.d - PyBytes_AS_STRING(o.bytes);
        o.d += 4;
        if ((rc = encode_into(&o, PySequence_Fast_GET_ITEM(fast, k))) < 0) break;
        char *base = PyBytes_AS_STRING(o.bytes);
        Py_ssize_t len = o.d - base - at - 4;
        if (len > 0xFFFFFFFFLL) { PyErr_SetString(PyExc_OverflowError, "record larger than 4 GiB"); rc = -1; break; }
        uint32_t le = (uint32_t)len;
        unsigned char *lp = (unsigned char *)base + at;
        lp[0] = le & 0xFF; lp[1] = (le >> 8) & 0xFF; lp[2] = (le >> 16) & 0xFF; lp[3] = le >> 24;
    }
    Py_DECREF(fast);
    return out_close(&o, rc);
}

/* append_payload(buf, end, records, start, limit[, crc[, want_crc]]) -> (next, new_end, crc)
 *
 * Appends [u32 LE length][record JSON] for records[start:] to the bytearray
 * ``buf`` at ``end`` (a SegmentBuffer's payload), the same bytes as
 * encode_record, stopping after the record that takes the end to ``limit`` or
 * past it (the writer's rotation rule) and before any record orjson must
 * encode (``next`` is then that record; ``next == start`` hands it back).
 * The small parts of each record are encoded with the GIL; the bodies'
 * digits, most of the bytes, are counted and then written with it released,
 * all records at once (so a writer thread overlaps with the decoding thread). ``buf`` grows
 * as needed (8 spare bytes past the new end) and cannot be resized by anyone
 * while the GIL is released (this call holds a buffer export). ``crc`` is
 * continued over the bytes written (zlib.crc32(written, crc)), unless
 * ``want_crc`` is false (a compressed segment's CRC covers the compressed
 * bytes: the payload's would be thrown away); ``crc`` then comes back as is.
 */
typedef struct {
    PyObject *body; /* bytes, borrowed from the record via a new reference */
    PyObject *rest; /* bytes: the JSON after the body (,"properties":...}) */
    Py_ssize_t chars; /* digits and commas of the body */
} Piece;

static PyObject *append_payload(PyObject *self, PyObject *args) {
    PyObject *buf, *seq;
    Py_ssize_t end, start, limit;
    unsigned long crc_in = 0;
    int want_crc = 1;
    if (!PyArg_ParseTuple(args, "O!nOnn|kp", &PyByteArray_Type, &buf, &end, &seq, &start, &limit, &crc_in,
                          &want_crc))
        return NULL;
    uint32_t crc = (uint32_t)crc_in;
    if (!check_configured()) return NULL;
    PyObject *fast = PySequence_Fast(seq, "append_payload takes a sequence of records");
    if (!fast) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (start < 0 || start > n || end < 0 || end > PyByteArray_GET_SIZE(buf)) {
        Py_DECREF(fast);
        PyErr_SetString(PyExc_ValueError, "append_payload: start or end out of range");
        return NULL;
    }
    Piece *pc = PyMem_Calloc(n - start + 1, sizeof(Piece));
    if (!pc) { Py_DECREF(fast); return PyErr_NoMemory(); }
    /* 1. with the GIL: each candidate's body and the JSON after it, until a record orjson must
     * encode or until a LOWER bound of the end (every body byte at least "0,") reaches the limit:
     * the record that really takes the end there is then among the candidates. The buffer is
     * grown to an UPPER bound of their end (every byte at most "255,"), so the GIL-free part
     * below can count and write without coming back for it. */
    Py_ssize_t k = start, np = 0, low_end = end, high_end = end;
    PyObject *result = NULL;
    int failed = 0;
    while (k < n && low_end < limit) {
        PyObject *rec = PySequence_Fast_GET_ITEM(fast, k);
        if (Py_TYPE(rec) != RecordT) break;
        PyObject *body = slot(RecordSlots[0], rec);
        if (!body) { failed = 1; break; }
        if (!PyBytes_CheckExact(body)) { Py_DECREF(body); break; }
        Out o;
        if (out_open(&o, 512) < 0) { Py_DECREF(body); failed = 1; break; }
        PyObject *rest = out_close(&o, encode_rest_into(&o, rec));
        if (!rest) { Py_DECREF(body); failed = 1; break; }
        if (rest == Py_None) { Py_DECREF(rest); Py_DECREF(body); break; } /* orjson's record */
        Py_ssize_t blen = PyBytes_GET_SIZE(body), rlen = PyBytes_GET_SIZE(rest);
        if ((blen ? 9 + 2 * blen : 12) + rlen > 0xFFFFFFFFLL) { /* even at its shortest */
            Py_DECREF(rest); Py_DECREF(body);
            PyErr_SetString(PyExc_OverflowError, "record larger than 4 GiB");
            failed = 1;
            break;
        }
        pc[np].body = body;
        pc[np].rest = rest;
        np++;
        low_end += 4 + (blen ? 9 + 2 * blen : 12) + rlen;
        high_end += 4 + (blen ? 9 + 4 * blen : 12) + rlen;
        k++;
    }
    if (!failed && np > 0) {
        Py_ssize_t need = high_end + 8; /* write_digits' spill */
        if (PyByteArray_GET_SIZE(buf) < need && PyByteArray_Resize(buf, need) < 0) failed = 1;
    }
    /* 2. without the GIL (the bodies are immutable bytes we hold references to): per record, its
     * digits counted, then written (first touch of fresh segment memory included), while the end
     * is below the limit, so the last one is the record that takes it there (the rotation rule). */
    Py_ssize_t used = 0, new_end = end;
    int too_big = 0;
    if (!failed && np > 0) {
        Py_buffer view;
        if (PyObject_GetBuffer(buf, &view, PyBUF_WRITABLE) < 0) {
            failed = 1;
        } else {
            char *d = (char *)view.buf + end;
            Py_BEGIN_ALLOW_THREADS
            while (used < np && new_end < limit) {
                Py_ssize_t blen = PyBytes_GET_SIZE(pc[used].body), rlen = PyBytes_GET_SIZE(pc[used].rest), chars = 0;
                const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(pc[used].body);
                for (Py_ssize_t i = 0; i < blen; i++) chars += DIGITS_COMMA_LEN[b[i]];
                Py_ssize_t json = (blen ? 9 + chars : 12) + rlen;
                if (json > 0xFFFFFFFFLL) { too_big = 1; break; }
                uint32_t le = (uint32_t)json;
                unsigned char *lp = (unsigned char *)d;
                lp[0] = le & 0xFF; lp[1] = (le >> 8) & 0xFF; lp[2] = (le >> 16) & 0xFF; lp[3] = le >> 24;
                d += 4;
                if (blen) {
                    memcpy(d, "{\"body\":[", 9);
                    d = write_digits(d + 9, b, blen);
                    d[-1] = ']';
                } else {
                    memcpy(d, "{\"body\":null", 12);
                    d += 12;
                }
                memcpy(d, PyBytes_AS_STRING(pc[used].rest), rlen); /* ,"properties":...} */
                d += rlen;
                new_end += 4 + json;
                used++;
            }
            if (want_crc) crc = rbak_crc32(crc, (const unsigned char *)view.buf + end, (size_t)(new_end - end));
            Py_END_ALLOW_THREADS
            PyBuffer_Release(&view);
            if (too_big && used == 0) {
                PyErr_SetString(PyExc_OverflowError, "record larger than 4 GiB");
                failed = 1;
            }
        }
        k = start + used;
    }
    if (!failed) result = Py_BuildValue("nnk", k, new_end, (unsigned long)crc);
    for (Py_ssize_t j = 0; j < np; j++) {
        Py_XDECREF(pc[j].body);
        Py_XDECREF(pc[j].rest);
    }
    PyMem_Free(pc);
    Py_DECREF(fast);
    return result;
}

/* reserve(buf, n[, touch]): grow the bytearray ``buf`` to at least ``n`` bytes without writing them
 * (the new bytes are undefined: the caller writes them before they are read), or with ``touch``
 * zero them with the GIL released, which maps their pages on this thread (page faults cost about
 * as much as writing the bytes: an idle thread can take them off the writer's path). A segment streamed to
 * its file while it is built needs its whole size up front: a bytearray cannot grow while a
 * writer thread holds a view of it, and zero-filling 128 MiB would touch every page first. */
static PyObject *reserve(PyObject *self, PyObject *args) {
    PyObject *buf;
    Py_ssize_t n;
    int touch = 0;
    if (!PyArg_ParseTuple(args, "O!n|p", &PyByteArray_Type, &buf, &n, &touch)) return NULL;
    Py_ssize_t had = PyByteArray_GET_SIZE(buf);
    if (had >= n) Py_RETURN_NONE;
    if (PyByteArray_Resize(buf, n) < 0) return NULL;
    if (touch) { /* map the new pages now (GIL released; the view keeps the buffer from moving) */
        Py_buffer view;
        if (PyObject_GetBuffer(buf, &view, PyBUF_WRITABLE) < 0) return NULL;
        Py_BEGIN_ALLOW_THREADS
        memset((char *)view.buf + had, 0, (size_t)(n - had));
        Py_END_ALLOW_THREADS
        PyBuffer_Release(&view);
    }
    Py_RETURN_NONE;
}

static int take_slots(PyObject *cls, PyObject *names, PyObject **dst, Py_ssize_t want) {
    if (!PyType_Check(cls) || !PyTuple_Check(names) || PyTuple_GET_SIZE(names) != want) {
        PyErr_SetString(PyExc_TypeError, "configure: a class and a tuple of its field names");
        return -1;
    }
    for (Py_ssize_t k = 0; k < want; k++) {
        PyObject *d = PyObject_GetAttr(cls, PyTuple_GET_ITEM(names, k));
        if (!d) return -1;
        if (Py_TYPE(d)->tp_descr_set == NULL) {
            Py_DECREF(d);
            PyErr_Format(PyExc_TypeError, "configure: %R.%U is not a slot", cls, PyTuple_GET_ITEM(names, k));
            return -1;
        }
        Py_XSETREF(dst[k], d);
    }
    return 0;
}

/* configure(Record, record_fields, Properties, property_fields, (Tag classes...)) */
static PyObject *configure(PyObject *self, PyObject *args) {
    PyObject *rec, *rec_names, *props, *prop_names, *tags;
    if (!PyArg_ParseTuple(args, "OO!OO!O!", &rec, &PyTuple_Type, &rec_names, &props, &PyTuple_Type, &prop_names,
                          &PyTuple_Type, &tags))
        return NULL;
    if (PyTuple_GET_SIZE(tags) != N_TAGS) {
        PyErr_SetString(PyExc_TypeError, "configure: one class per scalar header tag");
        return NULL;
    }
    if (take_slots(rec, rec_names, RecordSlots, N_REC) < 0 || take_slots(props, prop_names, PropsSlots, N_PROPS) < 0)
        return NULL;
    PyObject *value = PyUnicode_InternFromString("value");
    if (!value) return NULL;
    PyObject *one = PyTuple_Pack(1, value);
    Py_DECREF(value);
    if (!one) return NULL;
    for (int k = 0; k < N_TAGS; k++) {
        PyObject *cls = PyTuple_GET_ITEM(tags, k);
        if (take_slots(cls, one, &TagValue[k], 1) < 0) { Py_DECREF(one); return NULL; }
        Py_INCREF(cls);
        Py_XSETREF(TagT[k], (PyTypeObject *)cls);
    }
    Py_DECREF(one);
    Py_INCREF(rec); Py_XSETREF(RecordT, (PyTypeObject *)rec);
    Py_INCREF(props); Py_XSETREF(PropsT, (PyTypeObject *)props);
    if (!EmptyTuple && !(EmptyTuple = PyTuple_New(0))) return NULL;
    configured = 1;
    Py_RETURN_NONE;
}

/* _erlterm.c: the Erlang term decoder's fast path (rbak/offline/rabbitmq/erlang_terms.py). */
PyObject *rbak_erl_decode(PyObject *self, PyObject *args);
PyObject *rbak_erl_configure(PyObject *self, PyObject *args);
/* _amqp10.c: the AMQP 1.0 value decoder's fast path (rbak/format/amqp10.py). */
PyObject *rbak_amqp_value(PyObject *self, PyObject *args);
PyObject *rbak_amqp_configure(PyObject *self, PyObject *args);
/* _amqp091.c: Basic.Deliver messages parsed off an AMQP 0-9-1 byte stream (rbak/broker/fast_consume.py). */
PyObject *rbak_scan_deliveries(PyObject *self, PyObject *args);

static PyMethodDef methods[] = {
    {"split_record", split_record, METH_O, "Split a canonical record into (body, rest JSON) or None."},
    {"join_record", join_record, METH_VARARGS, "Compact record JSON from a body and the rest's JSON object."},
    {"decode_many", decode_many, METH_O, "Records of the canonical shape, None for any other (see batch.py)."},
    {"decode_payload", decode_payload, METH_O, "A whole payload's records: (records, fallback indices) or None."},
    {"encode_payload", encode_payload, METH_O, "A whole segment payload, or None when a record needs orjson."},
    {"encode_record", encode_record, METH_O, "One record's JSON, None when orjson must do it."},
    {"encode_many", encode_many, METH_O, "Each record's JSON, None where orjson must do it (see batch.py)."},
    {"configure", configure, METH_VARARGS, "Give the decoder record.py's classes and field names."},
    {"append_payload", append_payload, METH_VARARGS, "Records' [length][JSON] appended to a segment buffer (see C)."},
    {"reserve", reserve, METH_VARARGS, "Grow a bytearray to n bytes without writing them (see C)."},
    {"erl_decode", rbak_erl_decode, METH_VARARGS, "(term, end) of the bare Erlang term at pos, or None (see _erlterm.c)."},
    {"amqp_value", rbak_amqp_value, METH_VARARGS, "(Value, end) of the AMQP 1.0 value at pos, or None (see _amqp10.c)."},
    {"amqp_configure", rbak_amqp_configure, METH_VARARGS, "Give amqp_value amqp10's Value class and constants."},
    {"scan_deliveries", rbak_scan_deliveries, METH_VARARGS, "(end, deliveries, status) of one channel (see _amqp091.c)."},
    {"crc32", rbak_crc32_py, METH_VARARGS, "zlib.crc32's value (the GIL released)."},
    {"crc32_combine", rbak_crc32_combine_py, METH_VARARGS, "CRC-32 of A || B from CRC(A), CRC(B), len(B)."},
    {"erl_configure", rbak_erl_configure, METH_VARARGS, "Give erl_decode erlang_terms' classes and atom caches."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_speedups", NULL, -1, methods};

PyMODINIT_FUNC PyInit__speedups(void) {
    for (int v = 0; v < 256; v++) {
        char tmp[8] = {0};
        int len = snprintf(tmp, sizeof tmp, "%d,", v);
        memcpy(&DIGITS_COMMA[v], tmp, 4);
        DIGITS_COMMA_LEN[v] = (unsigned char)len;
    }
    if (build_pairs() < 0) return PyErr_NoMemory();
    return PyModule_Create(&module);
}
