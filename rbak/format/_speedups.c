/* Optional C speedup for the RBAK record codec (pure-Python fallback in batch.py).
 *
 * split_record(raw) recognises the canonical record shape written by rbak and
 * by the Rust tool, {"body":[d,d,...],<rest>} or {"body":null,<rest>}, parses
 * the body's integer array straight into bytes and returns (body, rest_start):
 * raw[rest_start:] is the record without its body, to be prefixed with '{'.
 * It returns None for anything else (other key order, a malformed or
 * out-of-range body), and the caller falls back to a full JSON parse, which
 * also produces the precise error message.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static const char OPEN[] = "{\"body\":[";
static const char NUL[] = "{\"body\":null";

static int is_ws(unsigned char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

static PyObject *split_record(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *p = (const unsigned char *)view.buf;
    Py_ssize_t n = view.len;
    PyObject *result = NULL;

    if (n >= 13 && memcmp(p, NUL, 12) == 0 && (p[12] == ',' || p[12] == '}')) {
        PyObject *empty = PyBytes_FromStringAndSize("", 0);
        if (empty) result = Py_BuildValue("(Nn)", empty, (Py_ssize_t)(p[12] == ',' ? 13 : 12));
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
    while (i < n && is_ws(p[i])) i++;
    Py_ssize_t rest;
    if (i < n && p[i] == ',') rest = i + 1;
    else if (i < n && p[i] == '}') rest = i;
    else { Py_DECREF(out); goto not_canonical; }
    if (_PyBytes_Resize(&out, len) < 0) { PyBuffer_Release(&view); return NULL; }
    PyBuffer_Release(&view);
    return Py_BuildValue("(Nn)", out, rest);

not_canonical:
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"split_record", split_record, METH_O, "Split a canonical record into (body bytes, rest offset) or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_speedups", NULL, -1, methods};

PyMODINIT_FUNC PyInit__speedups(void) { return PyModule_Create(&module); }
