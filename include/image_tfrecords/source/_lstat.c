/* The lstat of every name of one folder in one call: what a listing of 100,000 files costs per file.
 *
 * From Python, os.stat(name, dir_fd=fd, follow_symlinks=False) costs about 4 us a file on a 2-core VM, of
 * which the system call is 1.5: the rest is argument parsing, the path's conversion and a stat_result of
 * 19 fields, where a listing needs three. Here the names are encoded first (os.fsencode), the calls run
 * without the GIL, and only the three values come back:
 *
 *     lstat_names(dir_fd, names) -> (modes, sizes, stamps)
 *
 * names: a list of str (a folder's entries, as os.scandir gives them). modes[i]: st_mode, or -errno when
 * the call failed (ENOENT: removed since listed); sizes[i]: st_size; stamps[i]: st_mtime_ns as a decimal
 * str (what FileInfo.stamp holds), "" after a failure. localfs.py has the same in Python (the fallback where
 * the package was installed without its C parts); tests compare the two.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The modification time with nanoseconds: POSIX 2008's st_mtim; macOS and the BSDs name it st_mtimespec. */
#if defined(__APPLE__)
#define MTIME(st) ((st).st_mtimespec)
#else
#define MTIME(st) ((st).st_mtim)
#endif

typedef struct {
    long long mode, size, seconds, nanoseconds;
} Found;

/* st_mtime_ns as Python's str() gives it: seconds * 10**9 + nanoseconds (0 <= nanoseconds < 10**9), printed
 * digit groups apart so that no product can overflow, before 1970 too. */
static void stamp_text(long long seconds, long long nanoseconds, char *text, size_t size) {
    if (seconds >= 0) {
        if (seconds)
            snprintf(text, size, "%lld%09lld", seconds, nanoseconds);
        else
            snprintf(text, size, "%lld", nanoseconds);
    } else if (nanoseconds == 0) {
        snprintf(text, size, "-%llu000000000", 0ULL - (unsigned long long)seconds);
    } else { /* -(value) = (-seconds - 1) * 10**9 + (10**9 - nanoseconds) */
        unsigned long long whole = 0ULL - (unsigned long long)seconds - 1ULL;
        if (whole)
            snprintf(text, size, "-%llu%09lld", whole, 1000000000LL - nanoseconds);
        else
            snprintf(text, size, "-%lld", 1000000000LL - nanoseconds);
    }
}

static PyObject *lstat_names(PyObject *self, PyObject *args) {
    int fd;
    PyObject *names;
    if (!PyArg_ParseTuple(args, "iO!", &fd, &PyList_Type, &names))
        return NULL;
    Py_ssize_t count = PyList_Size(names);
    PyObject **encoded = PyMem_Calloc(count ? count : 1, sizeof(PyObject *));
    const char **paths = PyMem_Calloc(count ? count : 1, sizeof(char *));
    Found *found = PyMem_Calloc(count ? count : 1, sizeof(Found));
    PyObject *modes = NULL, *sizes = NULL, *stamps = NULL, *result = NULL;
    if (!encoded || !paths || !found) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *name = PyList_GetItem(names, i);
        if (!name || !PyUnicode_Check(name)) {
            PyErr_SetString(PyExc_TypeError, "names must be str");
            goto done;
        }
        if (!(encoded[i] = PyUnicode_EncodeFSDefault(name)) || !(paths[i] = PyBytes_AsString(encoded[i])))
            goto done;
        if ((Py_ssize_t)strlen(paths[i]) != PyBytes_Size(encoded[i])) { /* as os.stat: never a shorter name */
            PyErr_SetString(PyExc_ValueError, "embedded null byte");
            goto done;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++) {
        struct stat st;
        if (fstatat(fd, paths[i], &st, AT_SYMLINK_NOFOLLOW) != 0) {
            found[i].mode = -(long long)errno;
            continue;
        }
        found[i].mode = st.st_mode;
        found[i].size = st.st_size;
        found[i].seconds = MTIME(st).tv_sec;
        found[i].nanoseconds = MTIME(st).tv_nsec;
    }
    Py_END_ALLOW_THREADS
    if (!(modes = PyList_New(count)) || !(sizes = PyList_New(count)) || !(stamps = PyList_New(count)))
        goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *mode = PyLong_FromLongLong(found[i].mode), *size = NULL, *stamp = NULL;
        if (mode && found[i].mode >= 0) {
            char text[48];
            stamp_text(found[i].seconds, found[i].nanoseconds, text, sizeof(text));
            size = PyLong_FromLongLong(found[i].size);
            stamp = PyUnicode_FromString(text);
        } else if (mode) {
            size = PyLong_FromLong(0);
            stamp = PyUnicode_FromString("");
        }
        if (!mode || !size || !stamp) {
            Py_XDECREF(mode);
            Py_XDECREF(size);
            Py_XDECREF(stamp);
            goto done;
        }
        PyList_SetItem(modes, i, mode);
        PyList_SetItem(sizes, i, size);
        PyList_SetItem(stamps, i, stamp);
    }
    result = PyTuple_Pack(3, modes, sizes, stamps);
done:
    if (encoded) {
        for (Py_ssize_t i = 0; i < count; i++)
            Py_XDECREF(encoded[i]);
        PyMem_Free(encoded);
    }
    PyMem_Free(paths);
    PyMem_Free(found);
    Py_XDECREF(modes);
    Py_XDECREF(sizes);
    Py_XDECREF(stamps);
    return result;
}

static PyMethodDef methods[] = {
    {"lstat_names", lstat_names, METH_VARARGS, "(dir_fd, names) -> (modes, sizes, stamps): lstat of each name"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_lstat", NULL, -1, methods};

PyMODINIT_FUNC PyInit__lstat(void) { return PyModule_Create(&module); }
