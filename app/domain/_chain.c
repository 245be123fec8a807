/* The block-hash chain of one prompt in C: what app/domain/blockhash.py computes, four times
 * faster than its numpy path (bench/bench_blockhash.py).
 *
 * vLLM's sha256_cbor hashes, for each full block, the CBOR of (parent digest, the block's token ids,
 * extra keys). Python spends most of a block's time calling sha256 and building its bytes; here the
 * loop writes each block's CBOR into one buffer and hashes it with OpenSSL (the library Python's
 * hashlib uses), without the GIL. blockhash.py falls back to its numpy path when this module was not
 * built (no compiler at install: the extension is optional in pyproject.toml), and
 * tests/domain/test_blockhash.py holds both paths to cbor2 and to the real vLLM captures.
 *
 * chain_digests(ids, block_size, array_head, first_tail, later_tail) -> bytes
 *   ids: a C-contiguous buffer of int64 token ids (numpy int64); every full block is hashed, a
 *   trailing partial block is not. array_head: the CBOR head of an array of block_size items;
 *   first_tail / later_tail: the CBOR of the first block's extra keys and of every later block's;
 *   seed: the parent of the first block (blockhash.NONE_HASH, vLLM's, kept in one place).
 *   Returns the 32-byte digests of the blocks, concatenated.
 *
 * leading(keys, holding) -> int: see below.
 *
 * json_token_ids(raw) -> bytes | None: see below.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <openssl/evp.h>
#include <stdint.h>
#include <string.h>

#define DIGEST_SIZE 32

/* The message of a block: CBOR array of 3, its first item a byte string of 32 (the parent). */
static const unsigned char BLOCK_HEAD[] = {0x83, 0x58, 0x20};

static EVP_MD *sha256_md;

/* An integer as CBOR writes it, in the fewest bytes: major type 0 for n >= 0, 1 for -1 - n. */
static size_t put_cbor_int(unsigned char *out, int64_t id) {
    unsigned char major = id < 0 ? 0x20 : 0x00;
    uint64_t n = id < 0 ? ~(uint64_t)id : (uint64_t)id; /* ~id is -1 - id, without overflow */
    if (n < 24) {
        out[0] = major | (unsigned char)n;
        return 1;
    }
    int width = n <= 0xff ? 1 : n <= 0xffff ? 2 : n <= 0xffffffffu ? 4 : 8;
    out[0] = major | (width == 1 ? 0x18 : width == 2 ? 0x19 : width == 4 ? 0x1a : 0x1b);
    for (int i = 0; i < width; i++) {
        out[width - i] = (unsigned char)(n >> (8 * i)); /* big-endian */
    }
    return (size_t)width + 1;
}

static int hash_chain(const int64_t *ids, Py_ssize_t blocks, Py_ssize_t block_size, const Py_buffer *head,
                      const Py_buffer *first_tail, const Py_buffer *later_tail, const unsigned char *seed,
                      unsigned char *digests, unsigned char *message) {
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (ctx == NULL) {
        return 0;
    }
    int ok = 1;
    const unsigned char *parent = seed;
    memcpy(message, BLOCK_HEAD, sizeof BLOCK_HEAD);
    memcpy(message + sizeof BLOCK_HEAD + DIGEST_SIZE, head->buf, (size_t)head->len);
    size_t ids_at = sizeof BLOCK_HEAD + DIGEST_SIZE + (size_t)head->len;
    for (Py_ssize_t block = 0; block < blocks && ok; block++) {
        memcpy(message + sizeof BLOCK_HEAD, parent, DIGEST_SIZE);
        size_t at = ids_at;
        const int64_t *block_ids = ids + block * block_size;
        for (Py_ssize_t i = 0; i < block_size; i++) {
            at += put_cbor_int(message + at, block_ids[i]);
        }
        const Py_buffer *tail = block == 0 ? first_tail : later_tail;
        memcpy(message + at, tail->buf, (size_t)tail->len);
        at += (size_t)tail->len;
        unsigned char *digest = digests + block * DIGEST_SIZE;
        ok = EVP_DigestInit_ex(ctx, sha256_md, NULL) && EVP_DigestUpdate(ctx, message, at) &&
             EVP_DigestFinal_ex(ctx, digest, NULL);
        parent = digest;
    }
    EVP_MD_CTX_free(ctx);
    return ok;
}

static PyObject *chain_digests(PyObject *module, PyObject *args) {
    Py_buffer ids, head, first_tail, later_tail, seed;
    Py_ssize_t block_size;
    if (!PyArg_ParseTuple(args, "y*ny*y*y*y*", &ids, &block_size, &head, &first_tail, &later_tail, &seed)) {
        return NULL;
    }
    PyObject *result = NULL;
    if (block_size <= 0 || ids.len % (Py_ssize_t)sizeof(int64_t) != 0 || seed.len != DIGEST_SIZE) {
        PyErr_SetString(PyExc_ValueError, "chain_digests: a positive block size, int64 ids, a 32-byte seed");
        goto done;
    }
    Py_ssize_t blocks = ids.len / (Py_ssize_t)sizeof(int64_t) / block_size;
    Py_ssize_t tail_len = first_tail.len > later_tail.len ? first_tail.len : later_tail.len;
    unsigned char *message = PyMem_RawMalloc(sizeof BLOCK_HEAD + DIGEST_SIZE + (size_t)head.len +
                                             9 * (size_t)block_size + (size_t)tail_len);
    if (message == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, blocks * DIGEST_SIZE);
    if (result != NULL) {
        int ok;
        Py_BEGIN_ALLOW_THREADS;
        ok = hash_chain(ids.buf, blocks, block_size, &head, &first_tail, &later_tail, seed.buf,
                        (unsigned char *)PyBytes_AS_STRING(result), message);
        Py_END_ALLOW_THREADS;
        if (!ok) {
            Py_CLEAR(result);
            PyErr_SetString(PyExc_RuntimeError, "chain_digests: OpenSSL's sha256 failed");
        }
    }
    PyMem_RawFree(message);
done:
    PyBuffer_Release(&ids);
    PyBuffer_Release(&head);
    PyBuffer_Release(&first_tail);
    PyBuffer_Release(&later_tail);
    PyBuffer_Release(&seed);
    return result;
}

/* leading(keys, holding) -> int: how many of the sequence's leading keys `holding` contains, one
 * after the other (app/domain/leading.py). The diagnosis asks it of every request's chain several
 * times, against dicts of a million blocks; in Python each key cost a call of __contains__ through
 * takewhile. A dict's or a set's own contains is called here directly, anything else's through
 * its __contains__, as in Python. */
static PyObject *leading(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "leading(keys, holding)");
        return NULL;
    }
    PyObject *keys = PySequence_Fast(args[0], "leading: keys must be a sequence");
    if (keys == NULL) {
        return NULL;
    }
    Py_ssize_t held = 0;
    /* The size and the item read again each time: a __contains__ in Python may change the list. */
    for (; held < PySequence_Fast_GET_SIZE(keys); held++) {
        PyObject *key = PySequence_Fast_GET_ITEM(keys, held);
        Py_INCREF(key);
        int found = PySequence_Contains(args[1], key);
        Py_DECREF(key);
        if (found < 0) {
            Py_DECREF(keys);
            return NULL;
        }
        if (!found) {
            break;
        }
    }
    Py_DECREF(keys);
    return PyLong_FromSsize_t(held);
}

/* json_token_ids(raw) -> bytes | None: the token ids of a JSON array (a trace line's `token_ids`,
 * as msgspec.Raw hands it over) as native int32s, or None for anything but a non-empty array of
 * plain decimal integers from 0 to 2**31 - 1 (the caller then decodes it in Python, which says
 * what is wrong with it). The offline analyzer reads tens of millions of ids: as Python ints,
 * each was an object made, checked and unboxed again into the int32 buffer. */
static int is_json_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static Py_ssize_t parse_ids(const unsigned char *at, const unsigned char *end, int32_t *out) {
    while (end > at && is_json_space(end[-1])) end--;
    while (at < end && is_json_space(*at)) at++;
    /* Ending on its ']', every scan below stops there at the latest: no bound checked per byte. */
    if (end - at < 3 || *at != '[' || end[-1] != ']') return -1;
    at++;
    Py_ssize_t count = 0;
    for (;;) {
        while (is_json_space(*at)) at++;
        unsigned digit = (unsigned)(*at - '0');
        if (digit > 9) return -1; /* an empty array, a sign, another type */
        if (digit == 0 && (unsigned)(at[1] - '0') <= 9) return -1; /* a leading zero: not JSON */
        uint64_t id = digit;
        int digits = 1;
        for (at++; (digit = (unsigned)(*at - '0')) <= 9; at++) {
            id = id * 10 + digit;
            if (++digits > 10) return -1; /* past int32 whatever its value */
        }
        if (id > INT32_MAX) return -1;
        out[count++] = (int32_t)id;
        while (is_json_space(*at)) at++;
        if (*at == ',') {
            at++;
        } else {
            return *at == ']' && at == end - 1 ? count : -1; /* a fraction, an exponent, nesting */
        }
    }
}

static PyObject *json_token_ids(PyObject *module, PyObject *raw_object) {
    Py_buffer raw;
    if (PyObject_GetBuffer(raw_object, &raw, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    /* An id takes at least two bytes of the array (a digit and a comma or the closing bracket):
     * the ids are written into a bytes object of that room, then shrunk to what they took. */
    PyObject *result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)sizeof(int32_t) * (raw.len / 2 + 1));
    if (result != NULL) {
        const unsigned char *start = raw.buf;
        Py_ssize_t count = parse_ids(start, start + raw.len, (int32_t *)PyBytes_AS_STRING(result));
        if (count < 0) {
            Py_SETREF(result, Py_NewRef(Py_None));
        } else {
            _PyBytes_Resize(&result, count * (Py_ssize_t)sizeof(int32_t)); /* NULL, an error set, if it fails */
        }
    }
    PyBuffer_Release(&raw);
    return result;
}

static PyMethodDef methods[] = {
    {"chain_digests", chain_digests, METH_VARARGS, "The sha256_cbor digests of every full block, concatenated."},
    {"leading", (PyCFunction)(void (*)(void))leading, METH_FASTCALL,
     "How many of the leading keys the container holds, one after the other."},
    {"json_token_ids", json_token_ids, METH_O, "A JSON array of token ids as int32s; None unless plain."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_chain", NULL, -1, methods};

PyMODINIT_FUNC PyInit__chain(void) {
    /* Fetched once: in OpenSSL 3, EVP_sha256() would look the implementation up on every init. */
    sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
    if (sha256_md == NULL) {
        PyErr_SetString(PyExc_ImportError, "OpenSSL has no SHA256");
        return NULL;
    }
    return PyModule_Create(&module);
}
