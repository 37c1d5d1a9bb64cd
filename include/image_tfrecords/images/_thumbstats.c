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
 * three bytes R, G, B; kind 4, a native int32 grey level of 0-255000 (16-bit grey, scaled by the caller);
 * kind 5, four bytes R, G, B, padding (Pillow's own layout, which measure_arrow reads in place).
 * At most 256 pixels a side (the caller reduces larger images). dct: 8 x 32 native int64, the DCT's rows in
 * fixed point, each at most 2^11 (made by the Python module). s1, s2: the sum of the grey levels and of
 * their squares; d1, d2: the same of the 4-neighbour Laplacian (4 g - up - down - left - right) over the
 * inner pixels (0 when width or height < 3); spread: the sum of |R-G| + |G-B| + |B-R| (0 unless kind 3);
 * bits: the 63-bit pHash (thumbnail.py says how it is made).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#define SIDE 32
#define LOW 8
#define MAX_SIDE 256 /* the caller reduces larger images */
#define CHUNK 256   /* pixels split into planes at a time */
#define SPAN (MAX_SIDE / SIDE + 2) /* the most pixels one of SIDE cells spans along a side */

/* The pixel loops vectorise far better with AVX2; GCC builds both and picks at load time (ifunc, which glibc
   provides: musl, macOS and Windows have no ifunc, and there the default loop alone is built). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__GLIBC__)
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
    if (kind == 5) { /* Pillow's own RGBX, handed over through Arrow: a pixel is one 32-bit word */
        int32_t part = 0; /* at most 510 a pixel, 65536 pixels */
        for (Py_ssize_t i = 0; i < n; i++) {
            uint32_t word;
            memcpy(&word, bytes + 4 * i, sizeof(word));
            int32_t r = (int32_t)(word & 0xff), g = (int32_t)((word >> 8) & 0xff), b = (int32_t)((word >> 16) & 0xff);
            grey[i] = 299 * r + 587 * g + 114 * b;
            part += abs(r - g) + abs(g - b) + abs(b - r);
        }
        spread = part;
    } else if (kind == 3) {
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

/* The sums and the hash of a thumbnail's pixels; 0, or -1 with a Python error set. */
static int thumbnail_sums(const uint8_t *pixels, Py_ssize_t length, Py_ssize_t width, Py_ssize_t height, int kind,
                          Py_buffer *dct, Moments *m, uint64_t *bits) {
    if (width < 1 || height < 1 || width > MAX_SIDE || height > MAX_SIDE ||
        (kind != 1 && kind != 3 && kind != 4 && kind != 5)) {
        PyErr_SetString(PyExc_ValueError, "a thumbnail of 1 to 256 pixels a side, kind 1, 3, 4 or 5");
        return -1;
    }
    Py_ssize_t n = width * height;
    if (length != n * (kind == 5 ? 4 : kind) || dct->len != (Py_ssize_t)(LOW * SIDE * sizeof(int64_t))) {
        PyErr_SetString(PyExc_ValueError, "pixels or dct of the wrong length");
        return -1;
    }
    int32_t *grey = malloc((n + SIDE * width) * sizeof(int32_t));
    if (!grey) {
        PyErr_NoMemory();
        return -1;
    }
    double cells[SIDE * SIDE];
    Py_BEGIN_ALLOW_THREADS
    memset(m, 0, sizeof(*m));
    m->spread = grey_levels(pixels, n, kind, grey);
    moments(grey, width, height, m);
    cell_sums(grey, width, height, grey + n, cells);
    *bits = hash_bits(cells, n, dct->buf);
    Py_END_ALLOW_THREADS
    free(grey);
    return 0;
}

static PyObject *sums(PyObject *self, PyObject *args) {
    Py_buffer pixels, dct;
    Py_ssize_t width, height;
    int kind;
    if (!PyArg_ParseTuple(args, "y*nniy*", &pixels, &width, &height, &kind, &dct))
        return NULL;
    Moments m;
    uint64_t bits;
    PyObject *result = NULL;
    if (thumbnail_sums(pixels.buf, pixels.len, width, height, kind, &dct, &m, &bits) == 0)
        result = Py_BuildValue("(LLLLLK)", (long long)m.s1, (long long)m.s2, (long long)m.d1, (long long)m.d2,
                               (long long)m.spread, (unsigned long long)bits);
    PyBuffer_Release(&pixels);
    PyBuffer_Release(&dct);
    return result;
}

/* What images.quality's columns() does, in the same operations (so the same bits): its thresholds and flag
 * names, set once by thresholds(). */
static double dark = 0, bright = 0, flat = 0, blurry = 0, grey_max = 0, odd_aspect = 0;
static long long tiny = 0;
static PyObject *flag_names[7], *column_names[5];

static PyObject *thresholds(PyObject *self, PyObject *args) {
    PyObject *names;
    if (!PyArg_ParseTuple(args, "dddddLdO!", &dark, &bright, &flat, &blurry, &grey_max, &tiny, &odd_aspect,
                          &PyTuple_Type, &names))
        return NULL;
    if (PyTuple_Size(names) != 7) {
        PyErr_SetString(PyExc_ValueError, "seven flag names");
        return NULL;
    }
    for (int i = 0; i < 7; i++) {
        PyObject *old = flag_names[i];
        flag_names[i] = Py_NewRef(PyTuple_GetItem(names, i));
        Py_XDECREF(old);
    }
    Py_RETURN_NONE;
}

/* (numerator) / (count * count * 1000000) with Python's int division: n x s2 - s1 x s1 passes 64 bits, and
 * Python's quotient is the correctly rounded one. */
static int variance_of(long long count, long long total, long long squares, double *out) {
    PyObject *n = PyLong_FromLongLong(count), *s1 = PyLong_FromLongLong(total), *s2 = PyLong_FromLongLong(squares);
    PyObject *million = PyLong_FromLong(1000000), *a = NULL, *b = NULL, *num = NULL, *den = NULL, *q = NULL;
    int status = -1;
    if (!n || !s1 || !s2 || !million)
        goto done;
    if (!(a = PyNumber_Multiply(n, s2)) || !(b = PyNumber_Multiply(s1, s1)) || !(num = PyNumber_Subtract(a, b)))
        goto done;
    Py_DECREF(a);
    a = PyNumber_Multiply(n, n);
    if (!a || !(den = PyNumber_Multiply(a, million)) || !(q = PyNumber_TrueDivide(num, den)))
        goto done;
    *out = PyFloat_AsDouble(q);
    status = *out == -1.0 && PyErr_Occurred() ? -1 : 0;
done:
    Py_XDECREF(n);
    Py_XDECREF(s1);
    Py_XDECREF(s2);
    Py_XDECREF(million);
    Py_XDECREF(a);
    Py_XDECREF(b);
    Py_XDECREF(num);
    Py_XDECREF(den);
    Py_XDECREF(q);
    return status;
}

/* f"{value:.3f}".rstrip("0").rstrip(".") */
static PyObject *cell(double value) {
    char *text = PyOS_double_to_string(value, 'f', 3, 0, NULL);
    if (!text)
        return NULL;
    size_t len = strlen(text);
    while (len && text[len - 1] == '0')
        len--;
    while (len && text[len - 1] == '.')
        len--;
    PyObject *out = PyUnicode_FromStringAndSize(text, (Py_ssize_t)len);
    PyMem_Free(text);
    return out;
}

/* The hash's digits and the columns of a thumbnail's pixels (see measure). */
static PyObject *columns_of(const uint8_t *pixels, Py_ssize_t length, Py_ssize_t width, Py_ssize_t height, int kind,
                            Py_buffer *dct, long long stored_width, long long stored_height, long long channels) {
    if (!flag_names[0]) {
        PyErr_SetString(PyExc_RuntimeError, "thresholds() first");
        return NULL;
    }
    Moments m;
    uint64_t bits;
    PyObject *result = NULL, *values[5] = {NULL}, *columns = NULL;
    if (thumbnail_sums(pixels, length, width, height, kind, dct, &m, &bits) < 0)
        return NULL;
    long long n = (long long)width * height;
    double variance, detail = 0, sharpness = 0;
    int has_detail = width > 2 && height > 2;
    if (variance_of(n, m.s1, m.s2, &variance) < 0)
        return NULL;
    if (has_detail && variance_of((long long)(width - 2) * (height - 2), m.d1, m.d2, &detail) < 0)
        return NULL;
    double brightness = (double)m.s1 / (double)(1000 * n), contrast = pow(variance, 0.5);
    double colourfulness = (double)m.spread / (double)(2 * n);
    if (has_detail)
        sharpness = detail / (variance + 1.0);
    long long shorter = stored_width < stored_height ? stored_width : stored_height;
    long long longer = stored_width < stored_height ? stored_height : stored_width;
    int marks[7] = {brightness < dark, brightness > bright, contrast < flat,
                    contrast >= flat && has_detail && sharpness < blurry, channels >= 3 && colourfulness < grey_max,
                    shorter < tiny, shorter > 0 && (double)longer / (double)shorter > odd_aspect};
    char text[128];
    size_t len = 0;
    for (int i = 0; i < 7; i++) {
        if (!marks[i])
            continue;
        Py_ssize_t size;
        const char *name = PyUnicode_AsUTF8AndSize(flag_names[i], &size);
        if (!name || len + (size_t)size + 1 >= sizeof(text)) {
            if (name)
                PyErr_SetString(PyExc_ValueError, "flag names too long");
            return NULL;
        }
        if (len)
            text[len++] = '|';
        memcpy(text + len, name, (size_t)size);
        len += (size_t)size;
    }
    char hex[17];
    snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)bits);
    if (!(values[0] = cell(brightness)) || !(values[1] = cell(contrast)) ||
        !(values[2] = has_detail ? cell(sharpness) : PyUnicode_FromString("")) || !(values[3] = cell(colourfulness)) ||
        !(values[4] = PyUnicode_FromStringAndSize(text, (Py_ssize_t)len)) || !(columns = PyDict_New()))
        goto done;
    for (int i = 0; i < 5; i++)
        if (PyDict_SetItem(columns, column_names[i], values[i]) < 0)
            goto done;
    result = Py_BuildValue("(sO)", hex, columns);
done:
    for (int i = 0; i < 5; i++)
        Py_XDECREF(values[i]);
    Py_XDECREF(columns);
    return result;
}

static PyObject *measure(PyObject *self, PyObject *args) {
    Py_buffer pixels, dct;
    Py_ssize_t width, height;
    long long stored_width, stored_height, channels;
    int kind;
    if (!PyArg_ParseTuple(args, "y*nniy*LLL", &pixels, &width, &height, &kind, &dct, &stored_width, &stored_height,
                          &channels))
        return NULL;
    PyObject *result = columns_of(pixels.buf, pixels.len, width, height, kind, &dct, stored_width, stored_height,
                                  channels);
    PyBuffer_Release(&pixels);
    PyBuffer_Release(&dct);
    return result;
}

/* The Arrow C data interface's structures (a stable ABI: arrow.apache.org/docs/format/CDataInterface.html). */
struct ArrowSchema {
    const char *format, *name, *metadata;
    int64_t flags, n_children;
    struct ArrowSchema **children, *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};
struct ArrowArray {
    int64_t length, null_count, offset, n_buffers, n_children;
    const void **buffers;
    struct ArrowArray **children, *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

static PyObject *measure_arrow(PyObject *self, PyObject *args) {
    PyObject *schema_capsule, *array_capsule;
    Py_buffer dct;
    Py_ssize_t width, height;
    long long stored_width, stored_height, channels;
    if (!PyArg_ParseTuple(args, "OOnny*LLL", &schema_capsule, &array_capsule, &width, &height, &dct, &stored_width,
                          &stored_height, &channels))
        return NULL;
    PyObject *result = NULL;
    struct ArrowSchema *schema = PyCapsule_GetPointer(schema_capsule, "arrow_schema");
    struct ArrowArray *array = schema ? PyCapsule_GetPointer(array_capsule, "arrow_array") : NULL;
    if (!array)
        goto done;
    /* Pillow's RGB: a fixed-size list of 4 bytes a pixel (R, G, B, padding), no nulls */
    if (strcmp(schema->format, "+w:4") != 0 || schema->n_children != 1 || strcmp(schema->children[0]->format, "C") ||
        array->n_children != 1 || array->null_count != 0 || array->length != (int64_t)width * height ||
        array->children[0]->n_buffers != 2 || array->children[0]->null_count != 0 ||
        array->children[0]->length < 4 * (array->offset + array->length) || !array->children[0]->buffers[1]) {
        PyErr_SetString(PyExc_ValueError, "not an Arrow array of RGB pixels as Pillow exports them");
        goto done;
    }
    const struct ArrowArray *bytes = array->children[0];
    const uint8_t *data = (const uint8_t *)bytes->buffers[1] + bytes->offset + 4 * array->offset;
    result = columns_of(data, 4 * (Py_ssize_t)array->length, width, height, 5, &dct, stored_width, stored_height,
                        channels);
done:
    PyBuffer_Release(&dct);
    return result;
}

static PyMethodDef methods[] = {
    {"sums", sums, METH_VARARGS, "(s1, s2, d1, d2, spread, bits) of a thumbnail's pixels (see the module source)."},
    {"measure", measure, METH_VARARGS,
     "measure(pixels, width, height, kind, dct, stored_width, stored_height, channels) -> (phash, columns): "
     "images.quality.columns() and the hash's hex digits, in one call."},
    {"measure_arrow", measure_arrow, METH_VARARGS,
     "measure_arrow(schema, array, width, height, dct, stored_width, stored_height, channels): measure() of an RGB "
     "image's Arrow export (Image.__arrow_c_array__), without copying its pixels."},
    {"thresholds", thresholds, METH_VARARGS,
     "thresholds(dark, bright, flat, blurry, grey, tiny, odd_aspect, flag_names): images.quality's, once."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_thumbstats",
                                    "A thumbnail's hash and signal sums in C (image_tfrecords.images.thumbnail).",
                                    -1, methods};

PyMODINIT_FUNC PyInit__thumbstats(void) {
    const char *names[5] = {"brightness", "contrast", "sharpness", "colourfulness", "quality"};
    for (int i = 0; i < 5; i++)
        if (!column_names[i] && !(column_names[i] = PyUnicode_InternFromString(names[i])))
            return NULL;
    return PyModule_Create(&module);
}
