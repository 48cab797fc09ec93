/* CRC-32 (the zlib / RBAK segment checksum, reflected polynomial 0xEDB88320) for the C helper.
 *
 * rbak_crc32 gives zlib.crc32's value (carry-less multiplication folding on x86-64 CPUs with
 * PCLMULQDQ, about 5x zlib's speed; slice-by-8 on other little-endian machines, a byte at a time
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

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_CLMUL_PATH 1
/* Carry-less multiplication folding (Gopal et al., "Fast CRC Computation for Generic Polynomials
 * Using PCLMULQDQ Instruction", Intel 2009), bit-reflected for this polynomial: four 128-bit lanes
 * are folded 64 bytes at a time, then into one lane, then Barrett-reduced to 32 bits. The constants
 * are the paper's for CRC-32 (x^k mod P for the fold distances, mu and P for the reduction);
 * tests/format/test_segment_buffer.py checks the result against zlib.crc32. ``crc`` and the result
 * are the raw (not inverted) register; n >= 64 and a multiple of 16. */
__attribute__((target("pclmul,sse2")))
static uint32_t crc32_clmul(uint32_t crc, const unsigned char *p, size_t n) {
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    const __m128i k5 = _mm_set_epi64x(0, 0x0163cd6124LL);
    const __m128i poly = _mm_set_epi64x(0x01f7011641LL, 0x01db710641LL); /* mu (high), P' (low) */
    const __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
    __m128i x1 = _mm_loadu_si128((const __m128i *)p), x2 = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 32)), x4 = _mm_loadu_si128((const __m128i *)(p + 48));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
    p += 64;
    n -= 64;
    while (n >= 64) {
        __m128i h1 = _mm_clmulepi64_si128(x1, k1k2, 0x11), h2 = _mm_clmulepi64_si128(x2, k1k2, 0x11);
        __m128i h3 = _mm_clmulepi64_si128(x3, k1k2, 0x11), h4 = _mm_clmulepi64_si128(x4, k1k2, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k1k2, 0x00), h1), _mm_loadu_si128((const __m128i *)p));
        x2 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x2, k1k2, 0x00), h2), _mm_loadu_si128((const __m128i *)(p + 16)));
        x3 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x3, k1k2, 0x00), h3), _mm_loadu_si128((const __m128i *)(p + 32)));
        x4 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x4, k1k2, 0x00), h4), _mm_loadu_si128((const __m128i *)(p + 48)));
        p += 64;
        n -= 64;
    }
    /* four lanes into one */
    x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x00), _mm_clmulepi64_si128(x1, k3k4, 0x11)), x2);
    x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x00), _mm_clmulepi64_si128(x1, k3k4, 0x11)), x3);
    x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x00), _mm_clmulepi64_si128(x1, k3k4, 0x11)), x4);
    while (n >= 16) {
        x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x00), _mm_clmulepi64_si128(x1, k3k4, 0x11)),
                           _mm_loadu_si128((const __m128i *)p));
        p += 16;
        n -= 16;
    }
    /* 128 -> 64 bits (32 zero bits appended), then 64 -> 32 + Barrett reduction */
    x1 = _mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x10), _mm_srli_si128(x1, 8));
    x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, mask32), k5, 0x00), _mm_srli_si128(x1, 4));
    __m128i t = _mm_clmulepi64_si128(_mm_and_si128(x1, mask32), poly, 0x10);
    t = _mm_clmulepi64_si128(_mm_and_si128(t, mask32), poly, 0x00);
    x1 = _mm_xor_si128(x1, t);
    return (uint32_t)_mm_cvtsi128_si32(_mm_srli_si128(x1, 4));
}

static int clmul_ok = -1;
#endif

uint32_t rbak_crc32(uint32_t crc, const unsigned char *p, size_t n) {
    if (!ready) init_tables();
    crc = ~crc;
#ifdef HAVE_CLMUL_PATH
    if (n >= 64) {
        if (clmul_ok < 0) {
            __builtin_cpu_init();
            clmul_ok = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse2");
        }
        if (clmul_ok) {
            size_t m = n & ~(size_t)15;
            crc = crc32_clmul(crc, p, m);
            p += m;
            n -= m;
        }
    }
#endif
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
