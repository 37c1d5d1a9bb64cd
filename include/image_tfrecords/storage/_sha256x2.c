/* SHA-256 of two streams at once, on OpenSSL's own SHA256_CTX (the states storage/sha256_states.py saves and
 * resumes): a base shard and the new shard spliced from it, or two base shards, hashed in one pass.
 *
 * OpenSSL's SHA-NI code hashes one stream at about 1.8 GB/s a core here (AMD EPYC), bound by the latency of the
 * SHA round instruction; two independent streams interleaved fill the gaps: about 3.3 GB/s a core for the two.
 * update2(ctx_a, data_a, ctx_b, data_b) hashes data_a into ctx_a and data_b into ctx_b (writable buffers of
 * OpenSSL's SHA256_CTX layout, 112 bytes), exactly as SHA256_Update would (the whole blocks of both interleaved,
 * the rest one at a time), without the GIL; update(ctx, data) is one stream. available() says whether this CPU
 * has the SHA extensions (x86-64 only): where it has not, or the self-check in sha256_states.py fails, Python
 * hashes each stream with OpenSSL instead.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    uint32_t h[8];
    uint32_t Nl, Nh;
    unsigned char data[64];
    uint32_t num, md_len;
} Ctx; /* OpenSSL's SHA256_CTX */

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_SHA_NI 1

static const uint32_t K[64] = {
0x428a2f98,0x71374491,0xb5c0fbcf,0xe9b5dba5,0x3956c25b,0x59f111f1,0x923f82a4,0xab1c5ed5,0xd807aa98,0x12835b01,0x243185be,0x550c7dc3,0x72be5d74,0x80deb1fe,0x9bdc06a7,0xc19bf174,
0xe49b69c1,0xefbe4786,0x0fc19dc6,0x240ca1cc,0x2de92c6f,0x4a7484aa,0x5cb0a9dc,0x76f988da,0x983e5152,0xa831c66d,0xb00327c8,0xbf597fc7,0xc6e00bf3,0xd5a79147,0x06ca6351,0x14292967,
0x27b70a85,0x2e1b2138,0x4d2c6dfc,0x53380d13,0x650a7354,0x766a0abb,0x81c2c92e,0x92722c85,0xa2bfe8a1,0xa81a664b,0xc24b8b70,0xc76c51a3,0xd192e819,0xd6990624,0xf40e3585,0x106aa070,
0x19a4c116,0x1e376c08,0x2748774c,0x34b0bcb5,0x391c0cb3,0x4ed8aa4a,0x5b9cca4f,0x682e6ff3,0x748f82ee,0x78a5636f,0x84c87814,0x8cc70208,0x90befffa,0xa4506ceb,0xbef9a3f7,0xc67178f2};
#define T static __attribute__((target("sha,sse4.1,ssse3")))
T inline void load_state(const uint32_t s[8], __m128i *s0, __m128i *s1) {
  __m128i tmp = _mm_loadu_si128((const __m128i*)&s[0]), b = _mm_loadu_si128((const __m128i*)&s[4]);
  tmp = _mm_shuffle_epi32(tmp, 0xB1); b = _mm_shuffle_epi32(b, 0x1B);
  *s0 = _mm_alignr_epi8(tmp, b, 8); *s1 = _mm_blend_epi16(b, tmp, 0xF0);
}
T inline void store_state(uint32_t s[8], __m128i s0, __m128i s1) {
  __m128i tmp = _mm_shuffle_epi32(s0, 0x1B); s1 = _mm_shuffle_epi32(s1, 0xB1);
  s0 = _mm_blend_epi16(tmp, s1, 0xF0); s1 = _mm_alignr_epi8(s1, tmp, 8);
  _mm_storeu_si128((__m128i*)&s[0], s0); _mm_storeu_si128((__m128i*)&s[4], s1);
}
#define ROUNDS(S0, S1, M, g) do { __m128i msg_ = _mm_add_epi32(M, _mm_loadu_si128((const __m128i*)&K[4*(g)])); \
  S1 = _mm_sha256rnds2_epu32(S1, S0, msg_); msg_ = _mm_shuffle_epi32(msg_, 0x0E); S0 = _mm_sha256rnds2_epu32(S0, S1, msg_); } while (0)
#define SCHED(m, g) m[(g)&3] = _mm_sha256msg2_epu32(_mm_add_epi32(_mm_sha256msg1_epu32(m[(g)&3], m[((g)+1)&3]), _mm_alignr_epi8(m[((g)+3)&3], m[((g)+2)&3], 4)), m[((g)+3)&3])
T void sha256_1(uint32_t st[8], const uint8_t *p, size_t blocks) {
  const __m128i MASK = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
  __m128i s0, s1; load_state(st, &s0, &s1);
  while (blocks--) {
    __m128i a0 = s0, a1 = s1, m[4];
    for (int i = 0; i < 4; i++) m[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i*)(p + 16*i)), MASK);
    #pragma GCC unroll 16
    for (int g = 0; g < 16; g++) { ROUNDS(s0, s1, m[g&3], g); if (g < 12) SCHED(m, g); }
    s0 = _mm_add_epi32(s0, a0); s1 = _mm_add_epi32(s1, a1); p += 64;
  }
  store_state(st, s0, s1);
}
T void sha256_2(uint32_t sa[8], const uint8_t *pa, uint32_t sb[8], const uint8_t *pb, size_t blocks) {
  const __m128i MASK = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
  __m128i x0, x1, y0, y1; load_state(sa, &x0, &x1); load_state(sb, &y0, &y1);
  while (blocks--) {
    __m128i a0 = x0, a1 = x1, b0 = y0, b1 = y1, m[4], n[4];
    for (int i = 0; i < 4; i++) { m[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i*)(pa + 16*i)), MASK);
      n[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i*)(pb + 16*i)), MASK); }
    #pragma GCC unroll 16
    for (int g = 0; g < 16; g++) { ROUNDS(x0, x1, m[g&3], g); ROUNDS(y0, y1, n[g&3], g); if (g < 12) { SCHED(m, g); SCHED(n, g); } }
    x0 = _mm_add_epi32(x0, a0); x1 = _mm_add_epi32(x1, a1); y0 = _mm_add_epi32(y0, b0); y1 = _mm_add_epi32(y1, b1); pa += 64; pb += 64;
  }
  store_state(sa, x0, x1); store_state(sb, y0, y1);
}

static int cpu_has_sha(void) {
    unsigned int a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 9)) || !(c & (1u << 19))) return 0; /* SSSE3, SSE4.1 */
    if (__get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    return (b >> 29) & 1; /* SHA */
}
#else
#define HAVE_SHA_NI 0
static int cpu_has_sha(void) { return 0; }
static void sha256_1(uint32_t st[8], const uint8_t *p, size_t blocks) { (void)st, (void)p, (void)blocks; }
static void sha256_2(uint32_t sa[8], const uint8_t *pa, uint32_t sb[8], const uint8_t *pb, size_t blocks) {
    (void)sa, (void)pa, (void)sb, (void)pb, (void)blocks;
}
#endif

static void add_length(Ctx *c, size_t n) {
    uint32_t low = c->Nl + ((uint32_t)n << 3);
    if (low < c->Nl) c->Nh++;
    c->Nh += (uint32_t)((uint64_t)n >> 29);
    c->Nl = low;
}

/* Take the bytes that complete a partial block (hashing it when full); the whole blocks are left in *p, *n. */
static int head_bytes(Ctx *c, const uint8_t **p, size_t *n) {
    add_length(c, *n);
    if (!c->num) return 0;
    size_t take = 64 - c->num < *n ? 64 - c->num : *n;
    memcpy(c->data + c->num, *p, take);
    c->num += (uint32_t)take;
    *p += take;
    *n -= take;
    if (c->num < 64) return 1; /* all taken */
    sha256_1(c->h, c->data, 1);
    c->num = 0;
    memset(c->data, 0, 64); /* as OpenSSL does: the same states, byte for byte */
    return 0;
}

static void tail_bytes(Ctx *c, const uint8_t *p, size_t n) {
    sha256_1(c->h, p, n / 64);
    memcpy(c->data, p + (n & ~(size_t)63), n & 63);
    c->num = (uint32_t)(n & 63);
}

static void update_one(Ctx *c, const uint8_t *p, size_t n) {
    if (!head_bytes(c, &p, &n)) tail_bytes(c, p, n);
}

static void update_two(Ctx *a, const uint8_t *pa, size_t na, Ctx *b, const uint8_t *pb, size_t nb) {
    int done_a = head_bytes(a, &pa, &na), done_b = head_bytes(b, &pb, &nb);
    if (done_a) na = 0;
    if (done_b) nb = 0;
    size_t both = na / 64 < nb / 64 ? na / 64 : nb / 64;
    sha256_2(a->h, pa, b->h, pb, both);
    pa += both * 64, na -= both * 64, pb += both * 64, nb -= both * 64;
    if (!done_a) tail_bytes(a, pa, na);
    if (!done_b) tail_bytes(b, pb, nb);
}

static int ctx_buffer(PyObject *obj, Py_buffer *view) {
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE) < 0) return -1;
    if (view->len != (Py_ssize_t)sizeof(Ctx)) {
        PyErr_Format(PyExc_ValueError, "a SHA256_CTX is %zu bytes, not %zd", sizeof(Ctx), view->len);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* Whether this CPU has the SHA extensions, asked once: CPUID leaves a virtual machine for its hypervisor on each
   call (a call per update cost about 1% of a night's CPU). */
static int has_sha(void) {
    static int known = -1;
    if (known < 0) known = HAVE_SHA_NI && cpu_has_sha();
    return known;
}

static int usable(void) {
    if (!has_sha()) {
        PyErr_SetString(PyExc_RuntimeError, "this CPU has no SHA extensions");
        return 0;
    }
    return 1;
}

static PyObject *update(PyObject *self, PyObject *args) {
    PyObject *ctx_obj, *data_obj;
    Py_buffer ctx, data;
    (void)self;
    if (!PyArg_ParseTuple(args, "OO", &ctx_obj, &data_obj) || !usable()) return NULL;
    if (ctx_buffer(ctx_obj, &ctx) < 0) return NULL;
    if (PyObject_GetBuffer(data_obj, &data, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&ctx);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    update_one((Ctx *)ctx.buf, data.buf, (size_t)data.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    PyBuffer_Release(&ctx);
    Py_RETURN_NONE;
}

static PyObject *update2(PyObject *self, PyObject *args) {
    PyObject *objs[4];
    Py_buffer ctx_a, data_a, ctx_b, data_b;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOO", &objs[0], &objs[1], &objs[2], &objs[3]) || !usable()) return NULL;
    if (ctx_buffer(objs[0], &ctx_a) < 0) return NULL;
    if (PyObject_GetBuffer(objs[1], &data_a, PyBUF_SIMPLE) < 0) goto fail_a;
    if (ctx_buffer(objs[2], &ctx_b) < 0) goto fail_data_a;
    if (PyObject_GetBuffer(objs[3], &data_b, PyBUF_SIMPLE) < 0) goto fail_b;
    if (ctx_a.buf == ctx_b.buf) {
        PyErr_SetString(PyExc_ValueError, "the two streams need two states");
        PyBuffer_Release(&data_b);
        goto fail_b;
    }
    Py_BEGIN_ALLOW_THREADS
    update_two((Ctx *)ctx_a.buf, data_a.buf, (size_t)data_a.len, (Ctx *)ctx_b.buf, data_b.buf, (size_t)data_b.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data_b);
    PyBuffer_Release(&ctx_b);
    PyBuffer_Release(&data_a);
    PyBuffer_Release(&ctx_a);
    Py_RETURN_NONE;
fail_b:
    PyBuffer_Release(&ctx_b);
fail_data_a:
    PyBuffer_Release(&data_a);
fail_a:
    PyBuffer_Release(&ctx_a);
    return NULL;
}

static PyObject *available(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyBool_FromLong(has_sha());
}

static PyMethodDef methods[] = {
    {"update", update, METH_VARARGS, "update(ctx, data): SHA256_Update of one stream."},
    {"update2", update2, METH_VARARGS, "update2(ctx_a, data_a, ctx_b, data_b): two streams, interleaved."},
    {"available", available, METH_NOARGS, "Whether this CPU has the SHA extensions this module uses."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_sha256x2", .m_doc = "SHA-256 of two streams at once.", .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__sha256x2(void) { return PyModule_Create(&module); }
