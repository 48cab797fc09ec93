/* Optional C fast path of rbak/offline/rabbitmq/erlang_terms.py (Erlang external term format).
 *
 * erl_decode(data: bytes-like, pos: int) -> (term, end) | None decodes one bare term
 * (no version byte) at pos into exactly the values the pure-Python decoder
 * builds (Atom, bytes, int, float, tuple, list, ImproperList, dict, BitBinary,
 * Opaque). It never raises for bad input: anything it does not handle the
 * same way (a truncation, an unknown tag, an undecodable atom, an unhashable
 * map key, a big bignum, an old text float, nesting past the limit) returns
 * None, and the Python decoder redoes the term and gives the precise error
 * with its offset. So both paths accept the same terms with the same result.
 * erl_configure(Atom, ImproperList, BitBinary, Opaque, latin1_atoms, utf8_atoms)
 * gives it erlang_terms' classes and atom caches once, at import.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define ERL_MAX_DEPTH 200 /* deeper terms go to Python, which decodes or rejects them (never C alone) */
#define ATOM_CACHE_MAX 100000

static PyObject *AtomT, *ImproperT, *BitBinT, *OpaqueT, *Latin1Cache, *Utf8Cache;

typedef struct {
    const unsigned char *d;
    Py_ssize_t n;
} Src;

/* All decoders: a new reference, or NULL. NULL with no Python error set means "not handled here"
 * (the caller falls back to Python); NULL with an error set is a real failure (memory). */
static PyObject *term(Src *s, Py_ssize_t *pp, int depth);

static uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* The atoms met last, by a hash of their bytes: a Ra log repeats a few dozen atoms in every entry
 * (record names, 'undefined', the node name), so a hit costs a memcmp instead of a bytes key and a
 * dict lookup. The same Atom objects as the dict caches hold (the value is the same either way). */
#define RECENT_ATOMS 256
#define RECENT_ATOM_MAX 48
typedef struct {
    PyObject *atom;
    unsigned char len, latin1;
    unsigned char raw[RECENT_ATOM_MAX];
} RecentAtom;
static RecentAtom Recent[RECENT_ATOMS];

static unsigned recent_slot(const unsigned char *b, Py_ssize_t len, int latin1) {
    uint32_t h = 2166136261u ^ (uint32_t)latin1;
    for (Py_ssize_t i = 0; i < len; i++) h = (h ^ b[i]) * 16777619u;
    return (h ^ (h >> 16)) & (RECENT_ATOMS - 1);
}

static void forget_recent(void) {
    for (int i = 0; i < RECENT_ATOMS; i++) Py_CLEAR(Recent[i].atom);
}

static PyObject *dict_atom(const unsigned char *b, Py_ssize_t len, int latin1);

static PyObject *atom(const unsigned char *b, Py_ssize_t len, int latin1) {
    if (len > RECENT_ATOM_MAX) return dict_atom(b, len, latin1);
    RecentAtom *r = &Recent[recent_slot(b, len, latin1)];
    if (r->atom && r->len == len && r->latin1 == latin1 && memcmp(r->raw, b, (size_t)len) == 0) {
        Py_INCREF(r->atom);
        return r->atom;
    }
    PyObject *a = dict_atom(b, len, latin1);
    if (a) {
        Py_INCREF(a);
        Py_XSETREF(r->atom, a);
        r->len = (unsigned char)len;
        r->latin1 = (unsigned char)latin1;
        memcpy(r->raw, b, (size_t)len);
    }
    return a;
}

static PyObject *dict_atom(const unsigned char *b, Py_ssize_t len, int latin1) {
    PyObject *cache = latin1 ? Latin1Cache : Utf8Cache;
    PyObject *key = PyBytes_FromStringAndSize((const char *)b, len);
    if (!key) return NULL;
    PyObject *a = PyDict_GetItemWithError(cache, key);
    if (a) {
        Py_DECREF(key);
        Py_INCREF(a);
        return a;
    }
    if (PyErr_Occurred()) { Py_DECREF(key); return NULL; }
    PyObject *name = latin1 ? PyUnicode_DecodeLatin1((const char *)b, len, NULL)
                            : PyUnicode_DecodeUTF8((const char *)b, len, NULL);
    if (!name) {
        Py_DECREF(key);
        if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) PyErr_Clear(); /* Python reports it */
        return NULL;
    }
    a = PyObject_CallOneArg(AtomT, name);
    Py_DECREF(name);
    if (a && PyDict_GET_SIZE(cache) < ATOM_CACHE_MAX && PyDict_SetItem(cache, key, a) < 0) Py_CLEAR(a);
    Py_DECREF(key);
    return a;
}

/* count consecutive terms into a new tuple (as_list=0) or list (as_list=1). */
static PyObject *items(Src *s, Py_ssize_t *pp, Py_ssize_t count, int depth, int as_list) {
    if (count > s->n - *pp) return NULL; /* each term takes >= 1 byte: truncated */
    PyObject *out = as_list ? PyList_New(count) : PyTuple_New(count);
    if (!out) return NULL;
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *x = term(s, pp, depth);
        if (!x) { Py_DECREF(out); return NULL; }
        if (as_list) PyList_SET_ITEM(out, k, x); else PyTuple_SET_ITEM(out, k, x);
    }
    return out;
}

/* The last pid/port/reference decoded: an enqueuer's pid repeats in each of its commands, and an
 * Opaque is immutable, so an equal one (tag, node, bytes) is the same value shared. */
#define LAST_OPAQUE_MAX 32
static PyObject *LastOpaque, *LastNode;
static int LastTag;
static Py_ssize_t LastLen;
static unsigned char LastRaw[LAST_OPAQUE_MAX];

static PyObject *opaque(Src *s, Py_ssize_t *pp, int tag, int depth) {
    Py_ssize_t p = *pp, q, end;
    PyObject *node;
    if (tag == 90 || tag == 114) { /* NEWER_/NEW_REFERENCE_EXT: id count u16, node, creation, ids */
        if (p + 2 > s->n) return NULL;
        Py_ssize_t ln = ((Py_ssize_t)s->d[p] << 8) | s->d[p + 1];
        q = p + 2;
        if (!(node = term(s, &q, depth + 1))) return NULL;
        end = q + (tag == 90 ? 4 : 1) + 4 * ln;
    } else {
        int extra = tag == 88 ? 12 : tag == 103 ? 9 : tag == 89 ? 8 : tag == 102 ? 5 : 12; /* 120: V4_PORT */
        q = p;
        if (!(node = term(s, &q, depth + 1))) return NULL;
        end = q + extra;
    }
    if (end > s->n) { Py_DECREF(node); return NULL; }
    Py_ssize_t ln = end - q;
    if (LastOpaque && tag == LastTag && node == LastNode && ln == LastLen && memcmp(LastRaw, s->d + q, (size_t)ln) == 0) {
        Py_DECREF(node);
        Py_INCREF(LastOpaque);
        *pp = end;
        return LastOpaque;
    }
    PyObject *raw = PyBytes_FromStringAndSize((const char *)s->d + q, ln);
    PyObject *r = raw ? PyObject_CallFunction(OpaqueT, "iOO", tag, node, raw) : NULL;
    Py_XDECREF(raw);
    if (r && ln <= LAST_OPAQUE_MAX) {
        Py_INCREF(r);
        Py_XSETREF(LastOpaque, r);
        Py_XSETREF(LastNode, node); /* takes this reference */
        LastTag = tag;
        LastLen = ln;
        memcpy(LastRaw, s->d + q, (size_t)ln);
    } else {
        Py_DECREF(node);
    }
    if (r) *pp = end;
    return r;
}

static PyObject *term(Src *s, Py_ssize_t *pp, int depth) {
    Py_ssize_t p = *pp, n = s->n;
    const unsigned char *d = s->d;
    if (depth > ERL_MAX_DEPTH || p >= n) return NULL;
    int tag = d[p++];
    PyObject *r = NULL;
    switch (tag) {
    case 109: { /* BINARY_EXT */
        if (p + 4 > n) return NULL;
        Py_ssize_t ln = be32(d + p);
        if (ln > n - p - 4) return NULL;
        r = PyBytes_FromStringAndSize((const char *)d + p + 4, ln);
        p += 4 + ln;
        break;
    }
    case 97: /* SMALL_INTEGER_EXT */
        if (p >= n) return NULL;
        r = PyLong_FromLong(d[p]);
        p += 1;
        break;
    case 98: /* INTEGER_EXT */
        if (p + 4 > n) return NULL;
        r = PyLong_FromLong((long)(int32_t)be32(d + p));
        p += 4;
        break;
    case 100: case 118: case 115: case 119: { /* atoms: ATOM_EXT, ATOM_UTF8_EXT, SMALL_ATOM_EXT, SMALL_ATOM_UTF8_EXT */
        int small = tag == 115 || tag == 119;
        Py_ssize_t hl = small ? 1 : 2;
        if (p + hl > n) return NULL;
        Py_ssize_t ln = small ? d[p] : (((Py_ssize_t)d[p] << 8) | d[p + 1]);
        if (p + hl + ln > n) return NULL;
        r = atom(d + p + hl, ln, tag == 100 || tag == 115);
        p += hl + ln;
        break;
    }
    case 104: case 105: { /* SMALL_TUPLE_EXT, LARGE_TUPLE_EXT */
        Py_ssize_t arity;
        if (tag == 104) {
            if (p >= n) return NULL;
            arity = d[p++];
        } else {
            if (p + 4 > n) return NULL;
            arity = be32(d + p);
            p += 4;
        }
        r = items(s, &p, arity, depth + 1, 0);
        break;
    }
    case 106: /* NIL_EXT */
        r = PyList_New(0);
        break;
    case 108: { /* LIST_EXT */
        if (p + 4 > n) return NULL;
        Py_ssize_t ln = be32(d + p);
        p += 4;
        PyObject *lst = items(s, &p, ln, depth + 1, 1);
        if (!lst) return NULL;
        if (p < n && d[p] == 106 && depth + 1 <= ERL_MAX_DEPTH) { /* proper list */
            p += 1;
            r = lst;
            break;
        }
        PyObject *tail = term(s, &p, depth + 1);
        if (!tail) { Py_DECREF(lst); return NULL; }
        if (PyList_CheckExact(tail) && PyList_GET_SIZE(tail) == 0) { /* [] tail (a STRING_EXT "" too) */
            Py_DECREF(tail);
            r = lst;
            break;
        }
        r = PyObject_CallFunctionObjArgs(ImproperT, lst, tail, NULL);
        Py_DECREF(lst);
        Py_DECREF(tail);
        break;
    }
    case 107: { /* STRING_EXT: a list of small integers */
        if (p + 2 > n) return NULL;
        Py_ssize_t ln = ((Py_ssize_t)d[p] << 8) | d[p + 1];
        if (p + 2 + ln > n) return NULL;
        r = PyList_New(ln);
        if (!r) return NULL;
        for (Py_ssize_t k = 0; k < ln; k++) {
            PyObject *v = PyLong_FromLong(d[p + 2 + k]);
            if (!v) { Py_DECREF(r); return NULL; }
            PyList_SET_ITEM(r, k, v);
        }
        p += 2 + ln;
        break;
    }
    case 116: { /* MAP_EXT */
        if (p + 4 > n) return NULL;
        Py_ssize_t arity = be32(d + p);
        p += 4;
        if (arity > (n - p) / 2) return NULL;
        r = PyDict_New();
        if (!r) return NULL;
        for (Py_ssize_t k = 0; k < arity; k++) {
            PyObject *key = term(s, &p, depth + 1);
            PyObject *val = key ? term(s, &p, depth + 1) : NULL;
            int rc = val ? PyDict_SetItem(r, key, val) : -1;
            Py_XDECREF(key);
            Py_XDECREF(val);
            if (rc < 0) {
                if (val && PyErr_ExceptionMatches(PyExc_TypeError)) PyErr_Clear(); /* unhashable key: Python */
                Py_DECREF(r);
                return NULL;
            }
        }
        break;
    }
    case 70: { /* NEW_FLOAT_EXT */
        if (p + 8 > n) return NULL;
        uint64_t bits = ((uint64_t)be32(d + p) << 32) | be32(d + p + 4);
        double x;
        memcpy(&x, &bits, 8);
        r = PyFloat_FromDouble(x);
        p += 8;
        break;
    }
    case 110: case 111: { /* SMALL_BIG_EXT, LARGE_BIG_EXT: up to 8 bytes here */
        Py_ssize_t ln;
        if (tag == 110) {
            if (p >= n) return NULL;
            ln = d[p++];
        } else {
            if (p + 4 > n) return NULL;
            ln = be32(d + p);
            p += 4;
        }
        if (ln > 8 || p + ln + 1 > n) return NULL;
        int sign = d[p];
        uint64_t v = 0;
        for (Py_ssize_t k = ln; k > 0; k--) v = (v << 8) | d[p + k];
        PyObject *u = PyLong_FromUnsignedLongLong(v);
        if (u && sign) {
            r = PyNumber_Negative(u);
            Py_DECREF(u);
        } else {
            r = u;
        }
        p += 1 + ln;
        break;
    }
    case 77: { /* BIT_BINARY_EXT */
        if (p + 5 > n) return NULL;
        Py_ssize_t ln = be32(d + p);
        int bits = d[p + 4];
        if (ln > n - p - 5) return NULL;
        PyObject *b = PyBytes_FromStringAndSize((const char *)d + p + 5, ln);
        r = b ? PyObject_CallFunction(BitBinT, "Oi", b, bits) : NULL;
        Py_XDECREF(b);
        p += 5 + ln;
        break;
    }
    case 88: case 103: case 89: case 102: case 120: case 90: case 114:
        r = opaque(s, &p, tag, depth);
        break;
    default: /* FLOAT_EXT text, funs, exports, anything unknown: the Python decoder's business */
        return NULL;
    }
    if (r) *pp = p;
    return r;
}

PyObject *rbak_erl_decode(PyObject *self, PyObject *args) {
    PyObject *data;
    Py_ssize_t pos;
    if (!PyArg_ParseTuple(args, "On", &data, &pos)) return NULL;
    if (!AtomT) {
        PyErr_SetString(PyExc_RuntimeError, "erl_decode: erl_configure was not called");
        return NULL;
    }
    Py_buffer view; /* bytes, or a memoryview of a log file's bytes (no copy of the entry first) */
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) return NULL;
    Src s = {(const unsigned char *)view.buf, view.len};
    PyObject *t = pos < 0 ? NULL : term(&s, &pos, 0);
    PyBuffer_Release(&view);
    if (!t) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    PyObject *end = PyLong_FromSsize_t(pos);
    if (!end) { Py_DECREF(t); return NULL; }
    PyObject *r = PyTuple_Pack(2, t, end);
    Py_DECREF(t);
    Py_DECREF(end);
    return r;
}

PyObject *rbak_erl_configure(PyObject *self, PyObject *args) {
    PyObject *a, *il, *bb, *op, *c1, *c2;
    if (!PyArg_ParseTuple(args, "OOOOO!O!", &a, &il, &bb, &op, &PyDict_Type, &c1, &PyDict_Type, &c2)) return NULL;
    Py_INCREF(a); Py_XSETREF(AtomT, a);
    Py_INCREF(il); Py_XSETREF(ImproperT, il);
    Py_INCREF(bb); Py_XSETREF(BitBinT, bb);
    Py_INCREF(op); Py_XSETREF(OpaqueT, op);
    Py_INCREF(c1); Py_XSETREF(Latin1Cache, c1);
    Py_INCREF(c2); Py_XSETREF(Utf8Cache, c2);
    forget_recent(); /* atoms and opaques of the classes configured before */
    Py_CLEAR(LastOpaque);
    Py_CLEAR(LastNode);
    Py_RETURN_NONE;
}
