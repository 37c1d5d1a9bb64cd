/* The sums a thumbnail's perceptual hash and quality signals are made of, in one call of C.
 *
 * The answers are exact, so they are the same on every CPU and compiler and the same as
 * image_tfrecords.images.thumbnail's numpy fallback (tests compare the two): integers throughout, or doubles
 * that only ever hold whole numbers under 2^53, where no order of summation rounds anything. The grey level
 * of a pixel is 1000 x its ITU-R 601 luma: 299 R + 587 G + 114 B (0-255000), exactly.
 *
 *     sums(pixels, width, height, kind, dct) -> (s1, s2, d1, d2, spread, bits)
 *
 * pixels: width x height pixels, row by row: kind 1, one byte of grey each (scaled by 1000 here); kind 3,
 * three bytes R, G, B; kind 4, a native int32 grey level of 0-255000 (16-bit grey, scaled by the caller).
 * At most 256 pixels a side (the caller reduces larger images). dct: 8 x 32 native int64, the DCT's rows in
 * fixed point, each at most 2^11 (made by the Python module). s1, s2: the sum of the grey levels and of
 * their squares; d1, d2: the same of the 4-neighbour Laplacian (4 g - up - down - left - right) over the
 * inner pixels (0 when width or height < 3); spread: the sum of |R-G| + |G-B| + |B-R| (0 unless kind 3);
 * bits: the 63-bit pHash (thumbnail.py says how it is made).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SIDE 32
#define LOW 8
#define MAX_SIDE 256 /* the caller reduces larger images */
#define CHUNK 256   /* pixels split into planes at a time */
#define SPAN (MAX_SIDE / SIDE + 2) /* the most pixels one of SIDE cells spans along a side */

/* The pixel loops vectorise far better with AVX2; GCC builds both and picks at load time (ifunc). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define VECTOR_CLONES
#endif

typedef struct {
    int64_t s1, s2, d1, d2, spread;
} Moments;

/* The overlap, in 1/SIDE pixel units, of cell `cell` of SIDE over `n` pixels with pixel `p`: cell i spans
 * [i n, (i + 1) n) and pixel p [SIDE p, SIDE p + SIDE) in those units. */
static int32_t overlap(int64_t cell, int64_t p, int64_t n) {
    int64_t lo = cell * n > SIDE * p ? cell * n : SIDE * p;
    int64_t hi = (cell + 1) * n < SIDE * p + SIDE ? (cell + 1) * n : SIDE * p + SIDE;
    return hi > lo ? (int32_t)(hi - lo) : 0;
}

/* Grey levels (x 1000) of the pixels, and the spread's sum. */
VECTOR_CLONES static int64_t grey_levels(const uint8_t *restrict bytes, Py_ssize_t n, int kind, int32_t *restrict grey) {
    int64_t spread = 0;
    if (kind == 3) {
        /* R, G, B apart first, a chunk at a time: the loop over interleaved bytes does not vectorise, the
         * one over the planes does */
        uint8_t red[CHUNK], green[CHUNK], blue[CHUNK];
        int32_t part = 0; /* at most 510 a pixel, 65536 pixels */
        for (Py_ssize_t start = 0; start < n; start += CHUNK) {
            Py_ssize_t count = n - start < CHUNK ? n - start : CHUNK;
            const uint8_t *rgb = bytes + 3 * start;
            for (Py_ssize_t i = 0; i < count; i++) {
                red[i] = rgb[3 * i];
                green[i] = rgb[3 * i + 1];
                blue[i] = rgb[3 * i + 2];
            }
            int32_t *out = grey + start;
            for (Py_ssize_t i = 0; i < count; i++) {
                int32_t r = red[i], g = green[i], b = blue[i];
                out[i] = 299 * r + 587 * g + 114 * b;
                part += abs(r - g) + abs(g - b) + abs(b - r);
            }
        }
        spread = part;
    } else if (kind == 1) {
        for (Py_ssize_t i = 0; i < n; i++)
            grey[i] = 1000 * (int32_t)bytes[i];
    } else {
        for (Py_ssize_t i = 0; i < n; i++) {
            int32_t v;
            memcpy(&v, bytes + 4 * i, sizeof(v)); /* a buffer need not be aligned */
            grey[i] = v < 0 ? 0 : v > 255000 ? 255000 : v;
        }
    }
    return spread;
}

/* The sums of the grey levels and of the Laplacian, and of their squares (at most 65536 x 1020000^2 < 2^63). */
VECTOR_CLONES static void moments(const int32_t *restrict grey, Py_ssize_t width, Py_ssize_t height, Moments *m) {
    int64_t s1 = 0, s2 = 0, d1 = 0, d2 = 0;
    for (Py_ssize_t i = 0; i < width * height; i++) {
        s1 += grey[i];
        s2 += (int64_t)grey[i] * grey[i];
    }
    for (Py_ssize_t y = 1; y + 1 < height; y++) {
        const int32_t *row = grey + y * width, *up = row - width, *down = row + width;
        for (Py_ssize_t x = 1; x + 1 < width; x++) {
            int32_t d = 4 * row[x] - up[x] - down[x] - row[x - 1] - row[x + 1];
            d1 += d;
            d2 += (int64_t)d * d;
        }
    }
    m->s1 = s1;
    m->s2 = s2;
    m->d1 = d1;
    m->d2 = d2;
}

/* The grey levels' sums over SIDE x SIDE cells (exact: a cell's sum is at most 255000 x 65536 < 2^34). Down
 * first, whole rows at a time (a cell's column sum is at most 255000 x 256 < 2^31), then across
 * the SIDE rows left. */
VECTOR_CLONES static void cell_sums(const int32_t *restrict grey, Py_ssize_t width, Py_ssize_t height,
                                    int32_t *restrict strip, double *restrict cells) {
    memset(strip, 0, SIDE * width * sizeof(int32_t));
    for (int64_t cell = 0; cell < SIDE; cell++) {
        int32_t *out = strip + cell * width;
        for (int64_t p = cell * height / SIDE; p <= ((cell + 1) * height - 1) / SIDE; p++) {
            const int32_t *row = grey + p * width;
            int32_t w = overlap(cell, p, height);
            for (Py_ssize_t x = 0; x < width; x++)
                out[x] += w * row[x];
        }
    }
    int32_t first[SIDE], count[SIDE], weight[SIDE][SPAN]; /* cell j: pixels first[j] .. first[j] + count[j] - 1 */
    for (int64_t j = 0; j < SIDE; j++) {
        first[j] = (int32_t)(j * width / SIDE);
        count[j] = (int32_t)(((j + 1) * width - 1) / SIDE - first[j] + 1);
        for (int32_t k = 0; k < count[j]; k++)
            weight[j][k] = overlap(j, first[j] + k, width);
    }
    for (int64_t i = 0; i < SIDE; i++) {
        const int32_t *row = strip + i * width;
        for (int64_t j = 0; j < SIDE; j++) {
            const int32_t *pixels = row + first[j];
            int64_t total = 0;
            for (int32_t k = 0; k < count[j]; k++)
                total += (int64_t)weight[j][k] * pixels[k];
            cells[i * SIDE + j] = (double)total;
        }
    }
}

static int compare_int64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The hash's 63 bits from the cells' sums (scaled down by 2^floor(log2(n)), rounding down, so that every
 * mean is under 2^19 and a DCT product of 32 terms under 2^35, the next under 2^51). */
VECTOR_CLONES static uint64_t hash_bits(double *cells, Py_ssize_t n, const int64_t *fixed) {
    double rows[LOW * SIDE], half[LOW * SIDE] = {0};
    int64_t low[LOW * LOW], sorted[LOW * LOW - 1];
    int shift = 0;
    while ((n >> (shift + 1)) > 0)
        shift++;
    for (int i = 0; i < SIDE * SIDE; i++)
        cells[i] = (double)((int64_t)cells[i] >> shift);
    for (int i = 0; i < LOW * SIDE; i++)
        rows[i] = (double)fixed[i];
    for (int k = 0; k < LOW; k++)
        for (int i = 0; i < SIDE; i++) {
            double w = rows[k * SIDE + i];
            for (int j = 0; j < SIDE; j++)
                half[k * SIDE + j] += w * cells[i * SIDE + j];
        }
    double columns[SIDE * LOW], products[LOW * LOW] = {0}; /* the rows transposed: the sums run along l */
    for (int l = 0; l < LOW; l++)
        for (int j = 0; j < SIDE; j++)
            columns[j * LOW + l] = rows[l * SIDE + j];
    for (int k = 0; k < LOW; k++)
        for (int j = 0; j < SIDE; j++) {
            double w = half[k * SIDE + j];
            for (int l = 0; l < LOW; l++)
                products[k * LOW + l] += w * columns[j * LOW + l];
        }
    for (int i = 0; i < LOW * LOW; i++)
        low[i] = (int64_t)products[i];
    memcpy(sorted, low + 1, sizeof(sorted));
    qsort(sorted, LOW * LOW - 1, sizeof(int64_t), compare_int64);
    int64_t median = sorted[(LOW * LOW - 1) / 2];
    uint64_t bits = 0;
    for (int t = 1; t < LOW * LOW; t++)
        bits = (bits << 1) | (low[t] > median);
    return bits;
}

static PyObject *sums(PyObject *self, PyObject *args) {
    Py_buffer pixels, dct;
    Py_ssize_t width, height;
    int kind;
    if (!PyArg_ParseTuple(args, "y*nniy*", &pixels, &width, &height, &kind, &dct))
        return NULL;
    PyObject *result = NULL;
    int32_t *grey = NULL;
    Py_ssize_t n = 0;
    if (width < 1 || height < 1 || width > MAX_SIDE || height > MAX_SIDE || (kind != 1 && kind != 3 && kind != 4)) {
        PyErr_SetString(PyExc_ValueError, "a thumbnail of 1 to 256 pixels a side, kind 1, 3 or 4");
        goto done;
    }
    n = width * height;
    if (pixels.len != n * (kind == 4 ? 4 : kind) || dct.len != (Py_ssize_t)(LOW * SIDE * sizeof(int64_t))) {
        PyErr_SetString(PyExc_ValueError, "pixels or dct of the wrong length");
        goto done;
    }
    grey = malloc((n + SIDE * width) * sizeof(int32_t));
    if (!grey) {
        PyErr_NoMemory();
        goto done;
    }
    double cells[SIDE * SIDE];
    Moments m = {0};
    uint64_t bits;
    Py_BEGIN_ALLOW_THREADS
    m.spread = grey_levels(pixels.buf, n, kind, grey);
    moments(grey, width, height, &m);
    cell_sums(grey, width, height, grey + n, cells);
    bits = hash_bits(cells, n, dct.buf);
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("(LLLLLK)", (long long)m.s1, (long long)m.s2, (long long)m.d1, (long long)m.d2,
                           (long long)m.spread, (unsigned long long)bits);
done:
    free(grey);
    PyBuffer_Release(&pixels);
    PyBuffer_Release(&dct);
    return result;
}

static PyMethodDef methods[] = {
    {"sums", sums, METH_VARARGS, "(s1, s2, d1, d2, spread, bits) of a thumbnail's pixels (see the module source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_thumbstats",
                                    "A thumbnail's hash and signal sums in C (image_tfrecords.images.thumbnail).",
                                    -1, methods};

PyMODINIT_FUNC PyInit__thumbstats(void) { return PyModule_Create(&module); }
