/* Optional C fast path of rbak/format/amqp10.py (AMQP 1.0 type system decoder).
 *
 * amqp_value(data, pos, end) -> (Value, end) | None decodes one value at pos
 * (bounded by end) into exactly the Value objects the pure-Python _Decoder
 * builds (same type names, same Python values, the shared constants for the
 * zero-width codes). Every check the Python decoder makes is made here too,
 * and any failure (or nesting past AMQP_MAX_DEPTH) returns None without an
 * error: the Python decoder then redoes the value and raises its precise
 * Amqp10Error with the offset. So both accept the same bytes with the same
 * result. amqp_configure(Value, {code: constant Value}) is called once, at import.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define AMQP_MAX_DEPTH 100 /* below amqp10.MAX_DEPTH and Python's stack: deeper values go to Python */

static PyTypeObject *ValueT;
static PyObject *TypeSlot, *ValueSlot; /* member descriptors of Value.type / Value.value */
static PyObject *Constants[256];
enum {
    T_UBYTE, T_BYTE, T_UINT, T_ULONG, T_INT, T_LONG, T_USHORT, T_SHORT, T_FLOAT, T_DOUBLE, T_TIMESTAMP,
    T_BINARY, T_UTF8, T_SYMBOL, T_BOOLEAN, T_CHAR, T_UUID, T_DEC32, T_DEC64, T_DEC128, T_LIST, T_MAP,
    T_ARRAY, T_DESCRIBED, N_TYPES
};
static const char *TYPE_NAMES[N_TYPES] = {
    "ubyte", "byte", "uint", "ulong", "int", "long", "ushort", "short", "float", "double", "timestamp",
    "binary", "utf8", "symbol", "boolean", "char", "uuid", "decimal32", "decimal64", "decimal128", "list", "map",
    "array", "described",
};
static PyObject *TypeName[N_TYPES];

typedef struct {
    const unsigned char *d;
} Src;

/* A new Value(type, value); steals ``v``. */
static PyObject *mk(int t, PyObject *v) {
    if (!v) return NULL;
    PyObject *o = ValueT->tp_alloc(ValueT, 0);
    if (!o) { Py_DECREF(v); return NULL; }
    if (Py_TYPE(TypeSlot)->tp_descr_set(TypeSlot, o, TypeName[t]) < 0
        || Py_TYPE(ValueSlot)->tp_descr_set(ValueSlot, o, v) < 0) {
        Py_DECREF(v);
        Py_DECREF(o);
        return NULL;
    }
    Py_DECREF(v);
    return o;
}

static uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static uint64_t be64(const unsigned char *p) { return ((uint64_t)be32(p) << 32) | be32(p + 4); }

static PyObject *bytes_at(Src *s, Py_ssize_t p, Py_ssize_t n) {
    return PyBytes_FromStringAndSize((const char *)s->d + p, n);
}

static PyObject *value(Src *s, Py_ssize_t pos, Py_ssize_t end, int depth, Py_ssize_t *out);

/* NULL without an error: not decodable here (Python decides); NULL with one: a real failure. */
static PyObject *compound(Src *s, int code, Py_ssize_t p, Py_ssize_t end, int depth, Py_ssize_t *out);

static PyObject *primitive(Src *s, int code, Py_ssize_t p, Py_ssize_t end, int depth, Py_ssize_t *out) {
    const unsigned char *d = s->d;
    if (depth > AMQP_MAX_DEPTH) return NULL;
    if (Constants[code]) {
        *out = p;
        Py_INCREF(Constants[code]);
        return Constants[code];
    }
    int w = 0, t = -1;
    PyObject *v = NULL;
    switch (code) {
    case 0x50: w = 1; t = T_UBYTE; break;
    case 0x51: w = 1; t = T_BYTE; break;
    case 0x52: w = 1; t = T_UINT; break;
    case 0x53: w = 1; t = T_ULONG; break;
    case 0x54: w = 1; t = T_INT; break;
    case 0x55: w = 1; t = T_LONG; break;
    case 0x60: w = 2; t = T_USHORT; break;
    case 0x61: w = 2; t = T_SHORT; break;
    case 0x70: w = 4; t = T_UINT; break;
    case 0x71: w = 4; t = T_INT; break;
    case 0x72: w = 4; t = T_FLOAT; break;
    case 0x80: w = 8; t = T_ULONG; break;
    case 0x81: w = 8; t = T_LONG; break;
    case 0x82: w = 8; t = T_DOUBLE; break;
    case 0x83: w = 8; t = T_TIMESTAMP; break;
    }
    if (t >= 0) { /* fixed width numbers */
        if (p + w > end) return NULL;
        const unsigned char *b = d + p;
        switch (code) {
        case 0x50: case 0x52: case 0x53: v = PyLong_FromLong(b[0]); break;
        case 0x51: case 0x54: case 0x55: v = PyLong_FromLong((signed char)b[0]); break;
        case 0x60: v = PyLong_FromLong((b[0] << 8) | b[1]); break;
        case 0x61: v = PyLong_FromLong((int16_t)((b[0] << 8) | b[1])); break;
        case 0x70: v = PyLong_FromUnsignedLong(be32(b)); break;
        case 0x71: v = PyLong_FromLong((int32_t)be32(b)); break;
        case 0x72: { uint32_t u = be32(b); float f; memcpy(&f, &u, 4); v = PyFloat_FromDouble(f); break; }
        case 0x80: v = PyLong_FromUnsignedLongLong(be64(b)); break;
        case 0x81: case 0x83: v = PyLong_FromLongLong((int64_t)be64(b)); break;
        case 0x82: { uint64_t u = be64(b); double x; memcpy(&x, &u, 8); v = PyFloat_FromDouble(x); break; }
        }
        *out = p + w;
        return mk(t, v);
    }
    switch (code) {
    case 0xA0: case 0xA1: case 0xA3: case 0xB0: case 0xB1: case 0xB3: { /* binary, utf8 (raw), symbol */
        int lw = code >= 0xB0 ? 4 : 1;
        if (p + lw > end) return NULL;
        Py_ssize_t ln = lw == 1 ? d[p] : (Py_ssize_t)be32(d + p);
        p += lw;
        if (ln > end - p) return NULL;
        t = (code & 0x0F) == 0 ? T_BINARY : (code & 0x0F) == 1 ? T_UTF8 : T_SYMBOL;
        *out = p + ln;
        return mk(t, bytes_at(s, p, ln));
    }
    case 0x56: /* boolean */
        if (p + 1 > end || d[p] > 1) return NULL;
        *out = p + 1;
        return mk(T_BOOLEAN, PyBool_FromLong(d[p]));
    case 0x73: { /* char */
        if (p + 4 > end) return NULL;
        uint32_t cp = be32(d + p);
        if (cp > 0x10FFFF) return NULL;
        *out = p + 4;
        return mk(T_CHAR, PyUnicode_FromOrdinal((int)cp));
    }
    case 0x98: /* uuid */
        if (p + 16 > end) return NULL;
        *out = p + 16;
        return mk(T_UUID, bytes_at(s, p, 16));
    case 0x74: case 0x84: case 0x94: {
        w = code == 0x74 ? 4 : code == 0x84 ? 8 : 16;
        if (p + w > end) return NULL;
        *out = p + w;
        return mk(code == 0x74 ? T_DEC32 : code == 0x84 ? T_DEC64 : T_DEC128, bytes_at(s, p, w));
    }
    case 0xC0: case 0xC1: case 0xD0: case 0xD1: case 0xE0: case 0xF0:
        return compound(s, code, p, end, depth, out);
    }
    return NULL; /* unknown format code */
}

static PyObject *compound(Src *s, int code, Py_ssize_t p, Py_ssize_t end, int depth, Py_ssize_t *out) {
    const unsigned char *d = s->d;
    int w = (code == 0xC0 || code == 0xC1 || code == 0xE0) ? 1 : 4;
    int kind = (code == 0xC0 || code == 0xD0) ? T_LIST : (code == 0xC1 || code == 0xD1) ? T_MAP : T_ARRAY;
    if (p + 2 * w > end) return NULL;
    Py_ssize_t size = w == 1 ? d[p] : (Py_ssize_t)be32(d + p);
    Py_ssize_t count = w == 1 ? d[p + 1] : (Py_ssize_t)be32(d + p + 4);
    if (size < w) return NULL;
    if (size > end - p - w) return NULL;
    Py_ssize_t body_end = p + w + size, q = p + 2 * w;
    if (count > body_end - q && !(kind == T_ARRAY)) return NULL; /* each element takes >= 1 byte */
    if (kind == T_ARRAY && count == 0 && q == body_end) {
        *out = body_end;
        return mk(T_ARRAY, PyTuple_New(0));
    }
    PyObject *items = NULL, *desc = NULL;
    int ccode = 0;
    if (kind == T_ARRAY) {
        if (q + 1 > body_end) return NULL;
        if (d[q] == 0x00) {
            if (!(desc = value(s, q + 1, body_end, depth + 1, &q))) return NULL;
            if (q + 1 > body_end) { Py_DECREF(desc); return NULL; }
        }
        ccode = d[q++];
        /* zero-width elements may outnumber the bytes; others take >= 1 byte each */
        /* amqp10.MAX_ZERO_WIDTH_ELEMENTS bounds the zero-width ones (Python raises past it) */
        if (ccode == 0x00 || (!Constants[ccode] && count > body_end - q) || count > (Py_ssize_t)1 << 20) {
            Py_XDECREF(desc);
            return NULL;
        }
    }
    items = PyTuple_New(count);
    if (!items) { Py_XDECREF(desc); return NULL; }
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *item;
        if (kind == T_ARRAY) {
            if (Constants[ccode]) {
                item = Constants[ccode];
                Py_INCREF(item);
            } else {
                if (q >= body_end) goto fail;
                item = primitive(s, ccode, q, body_end, depth + 1, &q);
            }
            if (item && desc) {
                PyObject *pair = PyTuple_Pack(2, desc, item);
                Py_DECREF(item);
                item = mk(T_DESCRIBED, pair);
            }
        } else {
            if (q >= body_end) goto fail;
            item = value(s, q, body_end, depth + 1, &q);
        }
        if (!item) goto fail;
        PyTuple_SET_ITEM(items, k, item);
    }
    if (q != body_end) goto fail;
    Py_XDECREF(desc);
    *out = body_end;
    if (kind == T_MAP) {
        if (count % 2) { Py_DECREF(items); return NULL; }
        PyObject *pairs = PyTuple_New(count / 2);
        if (!pairs) { Py_DECREF(items); return NULL; }
        for (Py_ssize_t k = 0; k < count / 2; k++) {
            PyObject *pair = PyTuple_Pack(2, PyTuple_GET_ITEM(items, 2 * k), PyTuple_GET_ITEM(items, 2 * k + 1));
            if (!pair) { Py_DECREF(pairs); Py_DECREF(items); return NULL; }
            PyTuple_SET_ITEM(pairs, k, pair);
        }
        Py_DECREF(items);
        return mk(T_MAP, pairs);
    }
    return mk(kind, items);
fail:
    Py_XDECREF(desc);
    Py_DECREF(items);
    return NULL;
}

static PyObject *value(Src *s, Py_ssize_t pos, Py_ssize_t end, int depth, Py_ssize_t *out) {
    if (depth > AMQP_MAX_DEPTH || pos >= end) return NULL;
    int code = s->d[pos];
    if (code == 0x00) { /* described: descriptor, then the value */
        Py_ssize_t p;
        PyObject *desc = value(s, pos + 1, end, depth + 1, &p);
        if (!desc) return NULL;
        if (((PyObject *)Py_TYPE(desc)) == (PyObject *)ValueT) {
            PyObject *t = Py_TYPE(TypeSlot)->tp_descr_get(TypeSlot, desc, (PyObject *)ValueT);
            int described = t == TypeName[T_DESCRIBED];
            Py_XDECREF(t);
            if (described) { Py_DECREF(desc); return NULL; }
        }
        PyObject *v = value(s, p, end, depth + 1, &p);
        if (!v) { Py_DECREF(desc); return NULL; }
        PyObject *pair = PyTuple_Pack(2, desc, v);
        Py_DECREF(desc);
        Py_DECREF(v);
        *out = p;
        return mk(T_DESCRIBED, pair);
    }
    return primitive(s, code, pos + 1, end, depth, out);
}

PyObject *rbak_amqp_value(PyObject *self, PyObject *args) {
    PyObject *data;
    Py_ssize_t pos, end;
    if (!PyArg_ParseTuple(args, "Onn", &data, &pos, &end)) return NULL;
    if (!ValueT) {
        PyErr_SetString(PyExc_RuntimeError, "amqp_value: amqp_configure was not called");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *r = NULL;
    if (pos >= 0 && end <= view.len && pos <= end) {
        Src s = {(const unsigned char *)view.buf};
        Py_ssize_t q = pos;
        PyObject *v = value(&s, pos, end, 0, &q);
        if (v) {
            r = Py_BuildValue("(Nn)", v, q);
        }
    }
    PyBuffer_Release(&view);
    if (!r && !PyErr_Occurred()) Py_RETURN_NONE;
    return r;
}

PyObject *rbak_amqp_configure(PyObject *self, PyObject *args) {
    PyObject *cls, *consts;
    if (!PyArg_ParseTuple(args, "O!O!", &PyType_Type, &cls, &PyDict_Type, &consts)) return NULL;
    PyObject *ts = PyObject_GetAttrString(cls, "type"), *vs = PyObject_GetAttrString(cls, "value");
    if (!ts || !vs || !Py_TYPE(ts)->tp_descr_set || !Py_TYPE(vs)->tp_descr_set || !Py_TYPE(ts)->tp_descr_get) {
        Py_XDECREF(ts);
        Py_XDECREF(vs);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "amqp_configure: Value needs type/value slots");
        return NULL;
    }
    for (int t = 0; t < N_TYPES; t++) {
        if (!TypeName[t] && !(TypeName[t] = PyUnicode_InternFromString(TYPE_NAMES[t]))) return NULL;
    }
    PyObject *k, *v;
    Py_ssize_t i = 0;
    while (PyDict_Next(consts, &i, &k, &v)) {
        long code = PyLong_AsLong(k);
        if (code < 0 || code > 255) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "amqp_configure: codes are bytes");
            return NULL;
        }
        Py_INCREF(v);
        Py_XSETREF(Constants[code], v);
    }
    Py_XSETREF(TypeSlot, ts);
    Py_XSETREF(ValueSlot, vs);
    Py_INCREF(cls);
    Py_XSETREF(ValueT, (PyTypeObject *)cls);
    Py_RETURN_NONE;
}
