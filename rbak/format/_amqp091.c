/* scan_deliveries: complete Basic.Deliver messages of one channel, parsed straight off an AMQP 0-9-1
 * byte stream (rbak/broker/fast_consume.py; pure-Python twin: rbak/format/amqp091_frames.py).
 *
 * pika decodes every frame into objects, slices its frame buffer once per frame (quadratic in the bytes
 * one socket read brings) and dispatches each delivery through three layers of callbacks: 22-25 us of
 * the reading thread per 1 KiB message (issue 20). A backup needs, per message, only the delivery tag,
 * the redelivered bit, exchange, routing key, the raw property bytes (decoded by rbak, memoised) and the
 * body. Anything that is not the start of a complete delivery on the channel is left to pika, in order.
 *
 * scan_deliveries(buf, pos, channel) -> (end, deliveries, status)
 *   deliveries: [(delivery_tag, redelivered, exchange, routing_key, raw_properties, body), ...]
 *   status: 0 the frame at `end` is not a Basic.Deliver of `channel` (or `end` is the end of buf);
 *           1 the bytes at `end` are not yet a complete frame, or a delivery of `channel` starts there
 *             and is not yet complete (read more);
 *           2 a delivery of `channel` starts at `end` and a frame that does not belong to it follows
 *             (RabbitMQ writes a delivery's frames together, so this is malformed input)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define FRAME_METHOD 1
#define FRAME_HEADER 2
#define FRAME_BODY 3
#define FRAME_END 0xCE
#define BASIC_CLASS 60
#define BASIC_DELIVER 60

enum { ST_OTHER = 0, ST_INCOMPLETE = 1, ST_BROKEN = 2 };

static inline uint16_t be16(const unsigned char *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static inline uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint64_t be64(const unsigned char *p) { return ((uint64_t)be32(p) << 32) | be32(p + 4); }

/* A short string as str; bytes when it is not UTF-8 (what pika's decode_short_string gives). The
 * previous message's object is reused when the bytes are the same: a queue's messages mostly share them. */
static PyObject *short_str(const unsigned char *p, Py_ssize_t n, PyObject **last) {
    if (*last) {
        Py_ssize_t ln;
        const char *lp;
        if (PyUnicode_Check(*last)) {
            lp = PyUnicode_AsUTF8AndSize(*last, &ln);
        } else {
            lp = PyBytes_AS_STRING(*last);
            ln = PyBytes_GET_SIZE(*last);
        }
        if (lp && ln == n && memcmp(lp, p, (size_t)n) == 0) {
            Py_INCREF(*last);
            return *last;
        }
        if (!lp) PyErr_Clear();
    }
    PyObject *s = PyUnicode_DecodeUTF8((const char *)p, n, NULL);
    if (!s) {
        PyErr_Clear();
        s = PyBytes_FromStringAndSize((const char *)p, n);
        if (!s) return NULL;
    }
    Py_INCREF(s);
    Py_XSETREF(*last, s);
    return s;
}

static PyObject *same_bytes(const unsigned char *p, Py_ssize_t n, PyObject **last) {
    if (*last && PyBytes_GET_SIZE(*last) == n && memcmp(PyBytes_AS_STRING(*last), p, (size_t)n) == 0) {
        Py_INCREF(*last);
        return *last;
    }
    PyObject *b = PyBytes_FromStringAndSize((const char *)p, n);
    if (!b) return NULL;
    Py_INCREF(b);
    Py_XSETREF(*last, b);
    return b;
}

/* One frame at p (n bytes available): 0 and its type/channel/payload, 1 if incomplete, 2 if broken. */
static int frame_at(const unsigned char *p, Py_ssize_t n, int *type, unsigned *chan, const unsigned char **payload,
                    Py_ssize_t *size) {
    if (n < 7) return ST_INCOMPLETE;
    uint32_t sz = be32(p + 3);
    if ((Py_ssize_t)sz > n - 8) return ST_INCOMPLETE;
    if (p[7 + sz] != FRAME_END) return ST_BROKEN;
    *type = p[0];
    *chan = be16(p + 1);
    *payload = p + 7;
    *size = (Py_ssize_t)sz;
    return 0;
}

PyObject *rbak_scan_deliveries(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos;
    unsigned int channel;
    if (!PyArg_ParseTuple(args, "y*nI", &view, &pos, &channel)) return NULL;
    const unsigned char *buf = (const unsigned char *)view.buf;
    Py_ssize_t len = view.len;
    PyObject *out = PyList_New(0);
    PyObject *last_ex = NULL, *last_rk = NULL, *last_props = NULL;
    int status = ST_OTHER;
    if (!out) goto fail;
    if (pos < 0 || pos > len) {
        PyErr_SetString(PyExc_ValueError, "pos outside the buffer");
        goto fail;
    }
    while (pos < len) {
        int type;
        unsigned ch;
        const unsigned char *pl;
        Py_ssize_t psz;
        int st = frame_at(buf + pos, len - pos, &type, &ch, &pl, &psz);
        if (st == ST_INCOMPLETE) { status = ST_INCOMPLETE; break; } /* any frame: wait for more bytes */
        /* a broken frame at the head is not ours to judge: pika's decoder reports it */
        if (st == ST_BROKEN || type != FRAME_METHOD || ch != channel || psz < 4 || be16(pl) != BASIC_CLASS ||
            be16(pl + 2) != BASIC_DELIVER) {
            status = ST_OTHER;
            break;
        }
        /* Basic.Deliver: consumer-tag shortstr, delivery-tag longlong, redelivered octet, exchange, routing-key */
        const unsigned char *m = pl + 4, *mend = pl + psz;
        if (m + 1 > mend || m + 1 + m[0] > mend) { status = ST_BROKEN; break; }
        m += 1 + m[0];
        if (m + 10 > mend) { status = ST_BROKEN; break; }
        uint64_t tag = be64(m);
        int redelivered = m[8] & 1;
        m += 9;
        const unsigned char *ex = m + 1;
        Py_ssize_t exn = m[0];
        if (ex + exn + 1 > mend) { status = ST_BROKEN; break; }
        m = ex + exn;
        const unsigned char *rk = m + 1;
        Py_ssize_t rkn = m[0];
        if (rk + rkn > mend) { status = ST_BROKEN; break; }

        Py_ssize_t q = pos + 8 + psz; /* the content header */
        int htype;
        unsigned hch;
        const unsigned char *hp;
        Py_ssize_t hsz;
        st = frame_at(buf + q, len - q, &htype, &hch, &hp, &hsz);
        if (st == ST_INCOMPLETE) { status = ST_INCOMPLETE; break; }
        if (st == ST_BROKEN || htype != FRAME_HEADER || hch != channel || hsz < 14 || be16(hp) != BASIC_CLASS) {
            status = ST_BROKEN;
            break;
        }
        uint64_t body_size = be64(hp + 4);
        q += 8 + hsz;
        /* the body frames: their total must be exactly body_size */
        Py_ssize_t scan = q;
        uint64_t got = 0;
        int nframes = 0;
        const unsigned char *single = NULL;
        while (got < body_size) {
            int bt;
            unsigned bch;
            const unsigned char *bp;
            Py_ssize_t bsz;
            st = frame_at(buf + scan, len - scan, &bt, &bch, &bp, &bsz);
            if (st != 0) break;
            if (bt != FRAME_BODY || bch != channel || got + (uint64_t)bsz > body_size) { st = ST_BROKEN; break; }
            if (nframes++ == 0) single = bp;
            got += (uint64_t)bsz;
            scan += 8 + bsz;
        }
        if (got < body_size) {
            status = st == ST_BROKEN ? ST_BROKEN : ST_INCOMPLETE;
            break;
        }
        if (body_size > (uint64_t)PY_SSIZE_T_MAX) { status = ST_BROKEN; break; }
        PyObject *body;
        if (nframes <= 1) {
            body = PyBytes_FromStringAndSize(body_size ? (const char *)single : "", (Py_ssize_t)body_size);
        } else {
            body = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)body_size);
            if (body) {
                char *dst = PyBytes_AS_STRING(body);
                Py_ssize_t r = q;
                while (r < scan) {
                    Py_ssize_t bsz = (Py_ssize_t)be32(buf + r + 3);
                    memcpy(dst, buf + r + 7, (size_t)bsz);
                    dst += bsz;
                    r += 8 + bsz;
                }
            }
        }
        if (!body) goto fail;
        PyObject *t = PyTuple_New(6);
        if (!t) { Py_DECREF(body); goto fail; }
        PyTuple_SET_ITEM(t, 5, body);
        PyObject *v;
        if (!(v = PyLong_FromUnsignedLongLong(tag))) { Py_DECREF(t); goto fail; }
        PyTuple_SET_ITEM(t, 0, v);
        v = redelivered ? Py_True : Py_False;
        Py_INCREF(v);
        PyTuple_SET_ITEM(t, 1, v);
        if (!(v = short_str(ex, exn, &last_ex))) { Py_DECREF(t); goto fail; }
        PyTuple_SET_ITEM(t, 2, v);
        if (!(v = short_str(rk, rkn, &last_rk))) { Py_DECREF(t); goto fail; }
        PyTuple_SET_ITEM(t, 3, v);
        if (!(v = same_bytes(hp + 12, hsz - 12, &last_props))) { Py_DECREF(t); goto fail; }
        PyTuple_SET_ITEM(t, 4, v);
        int rc = PyList_Append(out, t);
        Py_DECREF(t);
        if (rc < 0) goto fail;
        pos = scan;
    }
    Py_XDECREF(last_ex);
    Py_XDECREF(last_rk);
    Py_XDECREF(last_props);
    PyBuffer_Release(&view);
    PyObject *res = Py_BuildValue("(nNi)", pos, out, status);
    return res;
fail:
    Py_XDECREF(out);
    Py_XDECREF(last_ex);
    Py_XDECREF(last_rk);
    Py_XDECREF(last_props);
    PyBuffer_Release(&view);
    return NULL;
}
