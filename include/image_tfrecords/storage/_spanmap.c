/* A map from byte strings to 64-bit integers whose keys are given as spans of a buffer, many per call: the
 * joins over every row of a table (a version's rows against the base's), without a Python object a row.
 *
 * SpanMap.add(data, starts, stops, values[, starts2, stops2]): key i is data[starts[i]:stops[i]] (followed by
 * data[starts2[i]:stops2[i]] when given), mapped to values[i]; a key added again takes the later value.
 * SpanMap.get(data, starts, stops[, starts2, stops2], missing=-1): the value of each key (bytes holding one native
 * int64 a key; ``missing`` for a key never added). The int arrays are any buffers of native 8-byte integers
 * (numpy int64). Keys are kept whole (compared byte for byte, never by a digest): memory holds each key's bytes
 * and 32 bytes a slot, at most half of them used. Python's fallback (storage/span_map.py) gives the same answers.
 *
 * join_rows (below): the text of many CSV rows at once, from spans of buffers, picks from lists and numbers
 * (storage/row_text.py, whose Python fallback gives the same bytes).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef Py_LIMITED_API /* the stable ABI (a .abi3.so) has the checked calls, not the macros; the same borrowed references */
#define PyList_GET_SIZE(o) PyList_Size(o)
#define PyList_GET_ITEM(o, i) PyList_GetItem(o, i)
#define PyTuple_GET_SIZE(o) PyTuple_Size(o)
#define PyTuple_GET_ITEM(o, i) PyTuple_GetItem(o, i)
#define PyBytes_GET_SIZE(o) PyBytes_Size(o)
#define PyBytes_AS_STRING(o) PyBytes_AsString(o)
#endif

typedef struct {
    uint64_t hash;
    uint64_t offset; /* of the key's bytes in the arena */
    int64_t value;
    uint32_t length;
    uint32_t used;
} Slot;

typedef struct {
    PyObject_HEAD
    Slot *slots;
    size_t mask;   /* slots - 1 (a power of two) */
    size_t count;
    char *arena;
    size_t arena_len, arena_cap;
    char *scratch; /* a two-part key, joined */
    size_t scratch_cap;
} SpanMap;

static uint64_t hash_bytes(const char *p, size_t n) {
    uint64_t h = 0x243F6A8885A308D3ULL ^ (n * 0x9E3779B97F4A7C15ULL), w;
    while (n >= 8) {
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDULL;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ULL;
    h ^= h >> 29;
    h *= 0x9E3779B97F4A7C15ULL;
    return h ^ (h >> 32);
}

static int grow(SpanMap *self) {
    size_t size = self->slots ? (self->mask + 1) * 2 : 1024;
    Slot *slots = calloc(size, sizeof(Slot));
    if (!slots) return -1;
    if (self->slots) {
        for (size_t i = 0; i <= self->mask; i++) {
            Slot *s = &self->slots[i];
            if (!s->used) continue;
            size_t at = s->hash & (size - 1);
            while (slots[at].used) at = (at + 1) & (size - 1);
            slots[at] = *s;
        }
        free(self->slots);
    }
    self->slots = slots;
    self->mask = size - 1;
    return 0;
}

/* The slot holding the key, or the empty slot where it would go. */
static Slot *find(SpanMap *self, const char *key, size_t n, uint64_t h) {
    size_t at = h & self->mask;
    for (;;) {
        Slot *s = &self->slots[at];
        if (!s->used || (s->hash == h && s->length == n && memcmp(self->arena + s->offset, key, n) == 0)) return s;
        at = (at + 1) & self->mask;
    }
}

typedef struct {
    Py_buffer data, starts, stops, starts2, stops2;
    Py_ssize_t count;
    int two;
} Spans;

static void release(Spans *sp) {
    PyBuffer_Release(&sp->data);
    PyBuffer_Release(&sp->starts);
    PyBuffer_Release(&sp->stops);
    if (sp->two) {
        PyBuffer_Release(&sp->starts2);
        PyBuffer_Release(&sp->stops2);
    }
}

static int int_buffer(PyObject *obj, Py_buffer *view, const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    if (view->itemsize != 8 || !view->format || !strchr("qlQL", view->format[strlen(view->format) - 1])) {
        PyErr_Format(PyExc_TypeError, "%s must hold 8-byte integers", name);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* Take the buffers; 0, or -1 with an exception set and nothing held. */
static int take(Spans *sp, PyObject *data, PyObject *starts, PyObject *stops, PyObject *starts2, PyObject *stops2) {
    memset(sp, 0, sizeof(*sp));
    sp->two = starts2 != Py_None || stops2 != Py_None;
    if (sp->two && (starts2 == Py_None || stops2 == Py_None)) {
        PyErr_SetString(PyExc_TypeError, "starts2 and stops2 go together");
        return -1;
    }
    if (PyObject_GetBuffer(data, &sp->data, PyBUF_SIMPLE) < 0) return -1;
    if (int_buffer(starts, &sp->starts, "starts") < 0) goto fail_data;
    if (int_buffer(stops, &sp->stops, "stops") < 0) goto fail_starts;
    sp->count = sp->starts.len / 8;
    if (sp->two) {
        if (int_buffer(starts2, &sp->starts2, "starts2") < 0) goto fail_stops;
        if (int_buffer(stops2, &sp->stops2, "stops2") < 0) {
            PyBuffer_Release(&sp->starts2);
            goto fail_stops;
        }
    }
    if (sp->stops.len / 8 != sp->count || (sp->two && (sp->starts2.len / 8 != sp->count ||
                                                       sp->stops2.len / 8 != sp->count))) {
        PyErr_SetString(PyExc_ValueError, "the span arrays differ in length");
        release(sp);
        return -1;
    }
    const int64_t *a = sp->starts.buf, *b = sp->stops.buf;
    const int64_t *c = sp->two ? sp->starts2.buf : NULL, *d = sp->two ? sp->stops2.buf : NULL;
    int64_t size = (int64_t)sp->data.len;
    for (Py_ssize_t i = 0; i < sp->count; i++) {
        if (a[i] < 0 || a[i] > b[i] || b[i] > size || (c && (c[i] < 0 || c[i] > d[i] || d[i] > size)) ||
            (uint64_t)(b[i] - a[i]) + (uint64_t)(c ? d[i] - c[i] : 0) > UINT32_MAX) {
            PyErr_Format(PyExc_ValueError, "span %zd is not within the data's %lld bytes", i, (long long)size);
            release(sp);
            return -1;
        }
    }
    return 0;
fail_stops:
    PyBuffer_Release(&sp->stops);
fail_starts:
    PyBuffer_Release(&sp->starts);
fail_data:
    PyBuffer_Release(&sp->data);
    return -1;
}

/* Key i of ``sp``: its bytes (joined into the scratch buffer when in two parts) and length; NULL on no memory. */
static const char *key_of(SpanMap *self, Spans *sp, Py_ssize_t i, size_t *n) {
    const char *data = sp->data.buf;
    int64_t a = ((int64_t *)sp->starts.buf)[i], b = ((int64_t *)sp->stops.buf)[i];
    if (!sp->two) {
        *n = (size_t)(b - a);
        return data + a;
    }
    int64_t c = ((int64_t *)sp->starts2.buf)[i], d = ((int64_t *)sp->stops2.buf)[i];
    *n = (size_t)(b - a + d - c);
    if (*n > self->scratch_cap) {
        char *more = realloc(self->scratch, *n * 2);
        if (!more) return NULL;
        self->scratch = more;
        self->scratch_cap = *n * 2;
    }
    memcpy(self->scratch, data + a, (size_t)(b - a));
    memcpy(self->scratch + (b - a), data + c, (size_t)(d - c));
    return self->scratch;
}

static char *kwlist_add[] = {"data", "starts", "stops", "values", "starts2", "stops2", NULL};

static PyObject *SpanMap_add(SpanMap *self, PyObject *args, PyObject *kwargs) {
    PyObject *data, *starts, *stops, *values, *starts2 = Py_None, *stops2 = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO|OO", kwlist_add, &data, &starts, &stops, &values, &starts2,
                                     &stops2))
        return NULL;
    Spans sp;
    Py_buffer vals;
    if (take(&sp, data, starts, stops, starts2, stops2) < 0) return NULL;
    if (int_buffer(values, &vals, "values") < 0) {
        release(&sp);
        return NULL;
    }
    if (vals.len / 8 != sp.count) {
        PyErr_SetString(PyExc_ValueError, "values differ in length from the spans");
        goto fail;
    }
    const int64_t *v = vals.buf;
    for (Py_ssize_t i = 0; i < sp.count; i++) {
        size_t n;
        const char *key = key_of(self, &sp, i, &n);
        if (!key) goto no_memory;
        if ((self->count + 1) * 2 > (self->slots ? self->mask + 1 : 0) && grow(self) < 0) goto no_memory;
        uint64_t h = hash_bytes(key, n);
        Slot *s = find(self, key, n, h);
        if (!s->used) {
            if (self->arena_len + n > self->arena_cap) {
                size_t cap = self->arena_cap ? self->arena_cap : 1 << 16;
                while (cap < self->arena_len + n) cap *= 2;
                char *more = realloc(self->arena, cap);
                if (!more) goto no_memory;
                self->arena = more;
                self->arena_cap = cap;
            }
            memcpy(self->arena + self->arena_len, key, n);
            s->hash = h;
            s->offset = self->arena_len;
            s->length = (uint32_t)n;
            s->used = 1;
            self->arena_len += n;
            self->count++;
        }
        s->value = v[i];
    }
    PyBuffer_Release(&vals);
    release(&sp);
    Py_RETURN_NONE;
no_memory:
    PyErr_NoMemory();
fail:
    PyBuffer_Release(&vals);
    release(&sp);
    return NULL;
}

static char *kwlist_get[] = {"data", "starts", "stops", "starts2", "stops2", "missing", NULL};

static PyObject *SpanMap_get(SpanMap *self, PyObject *args, PyObject *kwargs) {
    PyObject *data, *starts, *stops, *starts2 = Py_None, *stops2 = Py_None;
    long long missing = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|OOL", kwlist_get, &data, &starts, &stops, &starts2, &stops2,
                                     &missing))
        return NULL;
    Spans sp;
    if (take(&sp, data, starts, stops, starts2, stops2) < 0) return NULL;
    PyObject *out = PyBytes_FromStringAndSize(NULL, sp.count * 8);
    if (!out) {
        release(&sp);
        return NULL;
    }
    int64_t *found = (int64_t *)PyBytes_AsString(out);
    for (Py_ssize_t i = 0; i < sp.count; i++) {
        size_t n;
        const char *key = key_of(self, &sp, i, &n);
        if (!key) {
            Py_DECREF(out);
            release(&sp);
            return PyErr_NoMemory();
        }
        Slot *s = self->slots ? find(self, key, n, hash_bytes(key, n)) : NULL;
        found[i] = s && s->used ? s->value : (int64_t)missing;
    }
    release(&sp);
    return out;
}

static Py_ssize_t SpanMap_len(SpanMap *self) { return (Py_ssize_t)self->count; }

static void SpanMap_dealloc(SpanMap *self) {
    free(self->slots);
    free(self->arena);
    free(self->scratch);
    PyTypeObject *type = Py_TYPE((PyObject *)self);
    freefunc release_object = (freefunc)PyType_GetSlot(type, Py_tp_free);
    release_object(self);
    Py_DECREF(type);
}

static PyMethodDef SpanMap_methods[] = {
    {"add", (PyCFunction)(void (*)(void))SpanMap_add, METH_VARARGS | METH_KEYWORDS,
     "add(data, starts, stops, values, starts2=None, stops2=None): map each span's bytes to its value."},
    {"get", (PyCFunction)(void (*)(void))SpanMap_get, METH_VARARGS | METH_KEYWORDS,
     "get(data, starts, stops, starts2=None, stops2=None, missing=-1) -> bytes: each span's value, native int64s."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot SpanMap_slots[] = {
    {Py_tp_dealloc, (void *)SpanMap_dealloc},
    {Py_tp_doc, (void *)"A map from byte strings, given as spans of a buffer, to 64-bit integers."},
    {Py_tp_methods, SpanMap_methods},
    {Py_tp_new, (void *)PyType_GenericNew},
    {Py_mp_length, (void *)SpanMap_len},
    {0, NULL},
};

static PyType_Spec SpanMap_spec = {
    "image_tfrecords.storage._spanmap.SpanMap", sizeof(SpanMap), 0, Py_TPFLAGS_DEFAULT, SpanMap_slots,
};

/* join_rows(count, pieces, sep, end) -> (text, ends): ``count`` rows of text, each its pieces' values joined by
 * ``sep`` and followed by ``end``, and where each row ends in the text (bytes of native int64s). A piece is a tuple:
 * (data, starts, stops): row i's value is data[starts[i]:stops[i]] (data any buffer: bytes, a map);
 * (values, index): row i's value is values[index[i]] (a list of bytes);
 * (numbers,): row i's value is numbers[i] in decimal.
 * The int arrays are buffers of native int64 (numpy) of at least ``count`` items; a span outside its data or an
 * index outside its values is a ValueError. */
enum { SPANS = 0, PICKS = 1, NUMBERS = 2 };

typedef struct {
    int kind;
    Py_buffer data, a, b; /* SPANS: data, starts, stops; PICKS: -, index, -; NUMBERS: -, numbers, - */
    PyObject *values;     /* PICKS: the list */
    int held;             /* which buffers are held: 1 data, 2 a, 4 b */
} Piece;

static void release_pieces(Piece *pieces, Py_ssize_t n) {
    for (Py_ssize_t k = 0; k < n; k++) {
        if (pieces[k].held & 1) PyBuffer_Release(&pieces[k].data);
        if (pieces[k].held & 2) PyBuffer_Release(&pieces[k].a);
        if (pieces[k].held & 4) PyBuffer_Release(&pieces[k].b);
    }
    PyMem_Free(pieces);
}

static int row_ints(PyObject *obj, Py_buffer *view, Py_ssize_t count) {
    if (int_buffer(obj, view, "a piece's int array") < 0) return -1;
    if (view->len / 8 < count) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "join_rows: an int array holds fewer items than rows");
        return -1;
    }
    return 0;
}

static size_t decimal(int64_t v, char *out) { /* writes v's digits to out (if not NULL); returns their count */
    char tmp[24];
    size_t n = 0;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do { tmp[n++] = (char)('0' + u % 10); u /= 10; } while (u);
    if (v < 0) tmp[n++] = '-';
    if (out) for (size_t i = 0; i < n; i++) out[i] = tmp[n - 1 - i];
    return n;
}

static PyObject *join_rows(PyObject *self, PyObject *args) {
    Py_ssize_t count;
    PyObject *list;
    const char *sep, *end;
    Py_ssize_t sep_len, end_len;
    (void)self;
    if (!PyArg_ParseTuple(args, "nOy#y#", &count, &list, &sep, &sep_len, &end, &end_len)) return NULL;
    if (count < 0) { PyErr_SetString(PyExc_ValueError, "join_rows: a negative count"); return NULL; }
    PyObject *seq = PySequence_Fast(list, "join_rows: pieces must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Piece *pieces = PyMem_Calloc(n ? (size_t)n : 1, sizeof(Piece));
    if (!pieces) { Py_DECREF(seq); return PyErr_NoMemory(); }
    PyObject *text = NULL, *ends = NULL;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, k);
        Py_ssize_t size = PyTuple_Check(item) ? PyTuple_GET_SIZE(item) : -1;
        Piece *p = &pieces[k];
        if (size == 3) {
            p->kind = SPANS;
            if (PyObject_GetBuffer(PyTuple_GET_ITEM(item, 0), &p->data, PyBUF_SIMPLE) < 0) goto fail;
            p->held |= 1;
            if (row_ints(PyTuple_GET_ITEM(item, 1), &p->a, count) < 0) goto fail;
            p->held |= 2;
            if (row_ints(PyTuple_GET_ITEM(item, 2), &p->b, count) < 0) goto fail;
            p->held |= 4;
        } else if (size == 2) {
            p->kind = PICKS;
            p->values = PyTuple_GET_ITEM(item, 0);
            if (!PyList_Check(p->values)) {
                PyErr_SetString(PyExc_TypeError, "join_rows: a piece's values must be a list of bytes");
                goto fail;
            }
            for (Py_ssize_t j = 0; j < PyList_GET_SIZE(p->values); j++)
                if (!PyBytes_Check(PyList_GET_ITEM(p->values, j))) {
                    PyErr_SetString(PyExc_TypeError, "join_rows: a piece's values must be a list of bytes");
                    goto fail;
                }
            if (row_ints(PyTuple_GET_ITEM(item, 1), &p->a, count) < 0) goto fail;
            p->held |= 2;
        } else if (size == 1) {
            p->kind = NUMBERS;
            if (row_ints(PyTuple_GET_ITEM(item, 0), &p->a, count) < 0) goto fail;
            p->held |= 2;
        } else {
            PyErr_SetString(PyExc_TypeError, "join_rows: a piece is a tuple of 1, 2 or 3 items");
            goto fail;
        }
    }
    /* First pass: the text's length, with every span and index checked. */
    size_t total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        for (Py_ssize_t k = 0; k < n; k++) {
            Piece *p = &pieces[k];
            if (p->kind == SPANS) {
                int64_t a = ((const int64_t *)p->a.buf)[i], b = ((const int64_t *)p->b.buf)[i];
                if (a < 0 || b < a || b > p->data.len) {
                    PyErr_SetString(PyExc_ValueError, "join_rows: a span outside its data");
                    goto fail;
                }
                total += (size_t)(b - a);
            } else if (p->kind == PICKS) {
                int64_t j = ((const int64_t *)p->a.buf)[i];
                if (j < 0 || j >= PyList_GET_SIZE(p->values)) {
                    PyErr_SetString(PyExc_ValueError, "join_rows: an index outside its values");
                    goto fail;
                }
                total += (size_t)PyBytes_GET_SIZE(PyList_GET_ITEM(p->values, j));
            } else {
                total += decimal(((const int64_t *)p->a.buf)[i], NULL);
            }
        }
        total += (size_t)(n ? n - 1 : 0) * (size_t)sep_len + (size_t)end_len;
    }
    if (total > (size_t)PY_SSIZE_T_MAX) { PyErr_NoMemory(); goto fail; }
    text = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    ends = PyBytes_FromStringAndSize(NULL, count * 8);
    if (!text || !ends) goto fail;
    char *out = PyBytes_AS_STRING(text);
    int64_t *row_ends = (int64_t *)PyBytes_AS_STRING(ends);
    size_t at = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        for (Py_ssize_t k = 0; k < n; k++) {
            Piece *p = &pieces[k];
            if (k) { memcpy(out + at, sep, (size_t)sep_len); at += (size_t)sep_len; }
            if (p->kind == SPANS) {
                int64_t a = ((const int64_t *)p->a.buf)[i], b = ((const int64_t *)p->b.buf)[i];
                memcpy(out + at, (const char *)p->data.buf + a, (size_t)(b - a));
                at += (size_t)(b - a);
            } else if (p->kind == PICKS) {
                PyObject *v = PyList_GET_ITEM(p->values, ((const int64_t *)p->a.buf)[i]);
                memcpy(out + at, PyBytes_AS_STRING(v), (size_t)PyBytes_GET_SIZE(v));
                at += (size_t)PyBytes_GET_SIZE(v);
            } else {
                at += decimal(((const int64_t *)p->a.buf)[i], out + at);
            }
        }
        memcpy(out + at, end, (size_t)end_len);
        at += (size_t)end_len;
        row_ends[i] = (int64_t)at;
    }
    release_pieces(pieces, n);
    Py_DECREF(seq);
    PyObject *result = PyTuple_Pack(2, text, ends);
    Py_DECREF(text);
    Py_DECREF(ends);
    return result;
fail:
    Py_XDECREF(text);
    Py_XDECREF(ends);
    release_pieces(pieces, n);
    Py_DECREF(seq);
    return NULL;
}

static PyMethodDef module_methods[] = {
    {"join_rows", join_rows, METH_VARARGS,
     "join_rows(count, pieces, sep, end) -> (text, ends): rows of spans, picked values and decimals, joined."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_spanmap", .m_doc = "Joins of byte spans.", .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__spanmap(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    PyObject *type = PyType_FromSpec(&SpanMap_spec);
    if (!type || PyModule_AddObject(m, "SpanMap", type) < 0) {
        Py_XDECREF(type);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
