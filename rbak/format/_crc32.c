/* CRC-32 (the zlib / RBAK segment checksum, reflected polynomial 0xEDB88320) for the C helper.
 *
 * rbak_crc32 gives zlib.crc32's value (slice-by-8 on little-endian machines, a byte at a time
 * elsewhere) without holding the GIL, so append_payload can checksum the payload as it writes it;
 * rbak_crc32_combine (zlib's GF(2) matrix method) then joins the header's CRC with the payload's
 * when the segment is framed. crc32_combine(crc1, crc2, len2) is the Python entry point.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static uint32_t T[8][256];
static int ready;

static void init_tables(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        T[0][i] = c;
    }
    for (int i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++) T[t][i] = (T[t - 1][i] >> 8) ^ T[0][T[t - 1][i] & 0xFF];
    ready = 1;
}

uint32_t rbak_crc32(uint32_t crc, const unsigned char *p, size_t n) {
    if (!ready) init_tables();
    crc = ~crc;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (n >= 8) {
        uint32_t a, b;
        memcpy(&a, p, 4);
        memcpy(&b, p + 4, 4);
        a ^= crc;
        crc = T[7][a & 0xFF] ^ T[6][(a >> 8) & 0xFF] ^ T[5][(a >> 16) & 0xFF] ^ T[4][a >> 24]
            ^ T[3][b & 0xFF] ^ T[2][(b >> 8) & 0xFF] ^ T[1][(b >> 16) & 0xFF] ^ T[0][b >> 24];
        p += 8;
        n -= 8;
    }
#endif
    while (n--) crc = T[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

static uint32_t gf2_times(const uint32_t *mat, uint32_t vec) {
    uint32_t sum = 0;
    for (; vec; vec >>= 1, mat++)
        if (vec & 1) sum ^= *mat;
    return sum;
}

static void gf2_square(uint32_t *square, const uint32_t *mat) {
    for (int n = 0; n < 32; n++) square[n] = gf2_times(mat, mat[n]);
}

/* The CRC of A || B from crc1 = CRC(A), crc2 = CRC(B) and len2 = len(B). */
uint32_t rbak_crc32_combine(uint32_t crc1, uint32_t crc2, int64_t len2) {
    uint32_t even[32], odd[32], row = 1;
    if (len2 <= 0) return crc1;
    odd[0] = 0xEDB88320u; /* the operator for one zero bit */
    for (int n = 1; n < 32; n++) { odd[n] = row; row <<= 1; }
    gf2_square(even, odd); /* two zero bits */
    gf2_square(odd, even); /* four zero bits */
    do { /* apply len2 zero bytes to crc1 */
        gf2_square(even, odd);
        if (len2 & 1) crc1 = gf2_times(even, crc1);
        len2 >>= 1;
        if (!len2) break;
        gf2_square(odd, even);
        if (len2 & 1) crc1 = gf2_times(odd, crc1);
        len2 >>= 1;
    } while (len2);
    return crc1 ^ crc2;
}

PyObject *rbak_crc32_combine_py(PyObject *self, PyObject *args) {
    unsigned long c1, c2;
    long long len2;
    if (!PyArg_ParseTuple(args, "kkL", &c1, &c2, &len2)) return NULL;
    return PyLong_FromUnsignedLong(rbak_crc32_combine((uint32_t)c1, (uint32_t)c2, len2));
}

PyObject *rbak_crc32_py(PyObject *self, PyObject *args) {
    Py_buffer b;
    unsigned long crc = 0;
    if (!PyArg_ParseTuple(args, "y*|k", &b, &crc)) return NULL;
    uint32_t r;
    Py_BEGIN_ALLOW_THREADS
    r = rbak_crc32((uint32_t)crc, b.buf, (size_t)b.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(r);
}
