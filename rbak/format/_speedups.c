/* Optional C speedup for the RBAK record codec (pure-Python fallback in batch.py).
 *
 * split_record(raw) recognises the canonical record shape written by rbak and
 * by the Rust tool, {"body":[d,d,...],<rest>} or {"body":null,<rest>}, parses
 * the body's integer array straight into bytes and returns (body, rest) where
 * rest is the record's JSON without its body: b'{' + the fields after it.
 *
 * join_record(body, rest) is the inverse: b'{"body":[...],' + rest[1:] (or
 * "body":null for an empty body), the exact compact JSON serde_json writes.
 * It returns None for anything else (other key order, a malformed or
 * out-of-range body), and the caller falls back to a full JSON parse, which
 * also produces the precise error message.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

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

static PyObject *split_record(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *p = (const unsigned char *)view.buf;
    Py_ssize_t n = view.len;
    PyObject *result = NULL;

    if (n >= 13 && memcmp(p, NUL, 12) == 0 && (p[12] == ',' || p[12] == '}')) {
        PyObject *empty = PyBytes_FromStringAndSize("", 0);
        PyObject *rest = empty ? rest_from(p, n, p[12] == ',' ? 13 : 12) : NULL;
        if (rest) result = Py_BuildValue("(NN)", empty, rest);
        else Py_XDECREF(empty);
        PyBuffer_Release(&view);
        return result;
    }
    if (n < 10 || memcmp(p, OPEN, 9) != 0) goto not_canonical;

    /* The output is at most (n - 9) / 2 + 1 bytes: every value takes >= 1 digit + 1 separator. */
    Py_ssize_t cap = (n - 9) / 2 + 1;
    PyObject *out = PyBytes_FromStringAndSize(NULL, cap);
    if (!out) { PyBuffer_Release(&view); return NULL; }
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
        if (v > 255 || len >= cap) break;
        unsigned char sep = p[j];
        if (sep == ',') { o[len++] = (unsigned char)v; i = j + 1; continue; }
        if (sep == ']') { o[len++] = (unsigned char)v; i = j + 1; goto body_done; }
        break;
    }
    while (i < n && is_ws(p[i])) i++;
    if (i < n && p[i] == ']') {
        i++;
    } else {
        for (;;) {
            while (i < n && is_ws(p[i])) i++;
            if (i >= n || p[i] < '0' || p[i] > '9') { Py_DECREF(out); goto not_canonical; }
            unsigned v = 0; int digits = 0;
            while (i < n && p[i] >= '0' && p[i] <= '9' && digits < 4) { v = v * 10 + (p[i] - '0'); i++; digits++; }
            if (v > 255 || digits > 3 || len >= cap) { Py_DECREF(out); goto not_canonical; }
            o[len++] = (unsigned char)v;
            while (i < n && is_ws(p[i])) i++;
            if (i < n && p[i] == ',') { i++; continue; }
            if (i < n && p[i] == ']') { i++; break; }
            Py_DECREF(out); goto not_canonical;
        }
    }
body_done:
    while (i < n && is_ws(p[i])) i++;
    Py_ssize_t rest;
    if (i < n && p[i] == ',') rest = i + 1;
    else if (i < n && p[i] == '}') rest = i;
    else { Py_DECREF(out); goto not_canonical; }
    if (_PyBytes_Resize(&out, len) < 0) { PyBuffer_Release(&view); return NULL; }
    PyObject *rest_obj = rest_from(p, n, rest);
    PyBuffer_Release(&view);
    if (!rest_obj) { Py_DECREF(out); return NULL; }
    return Py_BuildValue("(NN)", out, rest_obj);

not_canonical:
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

static char DIGITS[256][4];
static unsigned char DIGITS_LEN[256];

static PyObject *join_record(PyObject *self, PyObject *args) {
    Py_buffer body, rest;
    if (!PyArg_ParseTuple(args, "y*y*", &body, &rest)) return NULL;
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
    Py_ssize_t digits = 0;
    for (Py_ssize_t i = 0; i < body.len; i++) digits += DIGITS_LEN[b[i]];
    /* {"body":[ + digits + commas (len-1) + ] + (',' + rest[1:] | '}') */
    Py_ssize_t n = 9 + digits + body.len - 1 + 1 + (only ? 1 : rest.len);
    out = PyBytes_FromStringAndSize(NULL, n);
    if (!out) goto done;
    char *d = PyBytes_AS_STRING(out);
    memcpy(d, "{\"body\":[", 9);
    d += 9;
    /* DIGITS rows are zero-padded to 4: copy 4, advance by the real length.
     * Safe for all but the last value (a comma and another value follow it);
     * the last one is copied exactly so nothing is written past the object. */
    for (Py_ssize_t i = 0; i + 1 < body.len; i++) {
        unsigned char v = b[i];
        memcpy(d, DIGITS[v], 4);
        d += DIGITS_LEN[v];
        *d++ = ',';
    }
    unsigned char last = b[body.len - 1];
    memcpy(d, DIGITS[last], DIGITS_LEN[last]);
    d += DIGITS_LEN[last];
    *d++ = ']';
    if (only) *d = '}';
    else { *d++ = ','; memcpy(d, r + 1, rest.len - 1); }
done:
    PyBuffer_Release(&body);
    PyBuffer_Release(&rest);
    return out;
}

static PyMethodDef methods[] = {
    {"split_record", split_record, METH_O, "Split a canonical record into (body, rest JSON) or None."},
    {"join_record", join_record, METH_VARARGS, "Compact record JSON from a body and the rest's JSON object."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_speedups", NULL, -1, methods};

PyMODINIT_FUNC PyInit__speedups(void) {
    for (int v = 0; v < 256; v++) {
        char tmp[8];
        int len = snprintf(tmp, sizeof tmp, "%d", v);
        memset(DIGITS[v], 0, 4);
        memcpy(DIGITS[v], tmp, len);
        DIGITS_LEN[v] = (unsigned char)len;
    }
    return PyModule_Create(&module);
}
