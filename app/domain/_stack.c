/* The LRU stack of the one-pass capacity curve in C: what app/domain/replay/curve.py's
 * _StackDistances does in Python, a dozen times faster (bench/bench_replay.py).
 *
 * Each cached key has a release stamp (1, 2, ...), kept in a dict; a Fenwick tree over the stamps
 * counts the live ones, so that a key's stack distance (how many cached keys are as new as it or
 * newer) is the live count minus the live stamps before its own. curve.py falls back to its Python
 * class when this module was not built (the extension is optional in pyproject.toml), and
 * tests/domain/test_replay_whatif.py holds both to the same answers.
 *
 * Stack(releases): room for `releases` stamps in all.
 *   distances(keys, limit[, floor]) -> list[int]: the distances of the first `limit` keys, stopping
 *     at the first never released (so the list may be shorter); with `floor`, each is instead the
 *     most of `floor` and the distances up to its own (the capacity a leading run needs).
 *   release(keys): the keys released, the last one first (its stamp the oldest of them).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef struct {
    PyObject_HEAD
    Py_ssize_t size;
    int32_t *tree; /* 1-based Fenwick tree of live stamps */
    PyObject *stamps; /* dict: key -> int stamp */
    Py_ssize_t time;
    Py_ssize_t live;
} Stack;

static void tree_add(Stack *self, Py_ssize_t position, int32_t delta) {
    for (; position <= self->size; position += position & -position) {
        self->tree[position] += delta;
    }
}

static Py_ssize_t tree_count_to(const Stack *self, Py_ssize_t position) {
    Py_ssize_t total = 0;
    for (; position > 0; position -= position & -position) {
        total += self->tree[position];
    }
    return total;
}

static int Stack_init(Stack *self, PyObject *args, PyObject *kwargs) {
    Py_ssize_t releases;
    static char *keywords[] = {"releases", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n", keywords, &releases)) {
        return -1;
    }
    if (releases < 0) {
        PyErr_SetString(PyExc_ValueError, "releases must not be negative");
        return -1;
    }
    PyMem_Free(self->tree);
    self->tree = PyMem_Calloc((size_t)releases + 1, sizeof(int32_t));
    if (self->tree == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_XSETREF(self->stamps, PyDict_New());
    if (self->stamps == NULL) {
        return -1;
    }
    self->size = releases;
    self->time = 0;
    self->live = 0;
    return 0;
}

static void Stack_dealloc(Stack *self) {
    PyMem_Free(self->tree);
    Py_XDECREF(self->stamps);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Stack_distances(Stack *self, PyObject *args) {
    PyObject *keys;
    Py_ssize_t limit;
    PyObject *floor = Py_None;
    if (!PyArg_ParseTuple(args, "On|O", &keys, &limit, &floor)) {
        return NULL;
    }
    Py_ssize_t most = -1; /* the running maximum, when a floor is given */
    if (floor != Py_None) {
        most = PyLong_AsSsize_t(floor);
        if (most == -1 && PyErr_Occurred()) {
            return NULL;
        }
    }
    PyObject *seq = PySequence_Fast(keys, "keys must be a sequence");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    if (limit < count) {
        count = limit < 0 ? 0 : limit;
    }
    PyObject *found = PyList_New(0);
    if (found == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *stamp = PyDict_GetItemWithError(self->stamps, items[i]); /* borrowed */
        if (stamp == NULL) {
            if (PyErr_Occurred()) {
                goto fail;
            }
            break;
        }
        Py_ssize_t at = PyLong_AsSsize_t(stamp);
        if (at == -1 && PyErr_Occurred()) {
            goto fail;
        }
        Py_ssize_t value = self->live - tree_count_to(self, at - 1);
        if (floor != Py_None) {
            most = value > most ? value : most;
            value = most;
        }
        PyObject *distance = PyLong_FromSsize_t(value);
        if (distance == NULL || PyList_Append(found, distance) < 0) {
            Py_XDECREF(distance);
            goto fail;
        }
        Py_DECREF(distance);
    }
    Py_DECREF(seq);
    return found;
fail:
    Py_DECREF(seq);
    Py_DECREF(found);
    return NULL;
}

static PyObject *Stack_release(Stack *self, PyObject *keys) {
    PyObject *seq = PySequence_Fast(keys, "keys must be a sequence");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    if (self->time + count > self->size) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "more releases than the stack was made for");
        return NULL;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = count - 1; i >= 0; i--) {
        PyObject *old = PyDict_GetItemWithError(self->stamps, items[i]); /* borrowed */
        if (old == NULL) {
            if (PyErr_Occurred()) {
                goto fail;
            }
            self->live += 1;
        } else {
            Py_ssize_t at = PyLong_AsSsize_t(old);
            if (at == -1 && PyErr_Occurred()) {
                goto fail;
            }
            tree_add(self, at, -1);
        }
        self->time += 1;
        PyObject *stamp = PyLong_FromSsize_t(self->time);
        if (stamp == NULL || PyDict_SetItem(self->stamps, items[i], stamp) < 0) {
            Py_XDECREF(stamp);
            goto fail;
        }
        Py_DECREF(stamp);
        tree_add(self, self->time, 1);
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq);
    return NULL;
}

static PyMethodDef Stack_methods[] = {
    {"distances", (PyCFunction)Stack_distances, METH_VARARGS,
     "distances(keys, limit[, floor]): the first `limit` keys' stack distances (with `floor`, their "
     "running maximum from it), up to the first never released."},
    {"release", (PyCFunction)Stack_release, METH_O, "release(keys): released, the last one first."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject StackType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "app.domain._stack.Stack",
    .tp_basicsize = sizeof(Stack),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An LRU stack of keys by release stamp, counting stack distances.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Stack_init,
    .tp_dealloc = (destructor)Stack_dealloc,
    .tp_methods = Stack_methods,
};

static struct PyModuleDef stack_module = {
    PyModuleDef_HEAD_INIT, "app.domain._stack", "The capacity curve's LRU stack in C.", -1, NULL,
};

PyMODINIT_FUNC PyInit__stack(void) {
    if (PyType_Ready(&StackType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&stack_module);
    if (module == NULL) {
        return NULL;
    }
    Py_INCREF(&StackType);
    if (PyModule_AddObject(module, "Stack", (PyObject *)&StackType) < 0) {
        Py_DECREF(&StackType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
