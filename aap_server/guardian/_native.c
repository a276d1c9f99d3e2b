/* The guardian's hot primitives in C: the same results as the pure-Python code they stand
 * for (aap_server/guardian/native.py selects them; tests/guardian/test_native.py compares
 * the two over generated texts), without a Python object per word of the text.
 *
 * - fingerprints(chunks): fingerprints.fingerprint of each chunk, (crc32 << 32) | adler32,
 *   both computed here bit for bit as zlib does (no zlib linked: its headers may be absent).
 * - parts_prints(text): provenance._parts_prints of ASCII text.
 * - distinct_runs(data, table, delete=b''): set(data.translate(table, delete).split()).
 * - distinct_words(text): set(text.split()) of ASCII text.
 * - amount_prints(text): provenance._amount_prints of ASCII text without an apostrophe.
 * - merge_prints(prints, values, epoch): the dict work of fingerprints.Prints.add_all.
 *
 * Every input is attacker-controlled text: each read is bounded by the length Python gives,
 * the work is one pass (plus hash-set upkeep, amortised constant per item), no recursion.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* --- the checksums ------------------------------------------------------------------------ */

/* CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320, as zlib.crc32), eight bytes a step
 * ("slicing by 8"): crc_table[k][b] is the CRC of byte b followed by k zero bytes. */
static uint32_t crc_table[8][256];

static void
crc_init(void)
{
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int k = 0; k < 8; k++) {
            c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
        }
        crc_table[0][b] = c;
    }
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = crc_table[0][b];
        for (int k = 1; k < 8; k++) {
            c = crc_table[0][c & 0xff] ^ (c >> 8);
            crc_table[k][b] = c;
        }
    }
}

static uint32_t
crc32_of(const unsigned char *p, Py_ssize_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    while (n >= 8) {
        /* Bytes assembled explicitly: no unaligned load, same on either byte order. */
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                           (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 |
                      (uint32_t)p[7] << 24;
        c = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^
            crc_table[5][(lo >> 16) & 0xff] ^ crc_table[4][lo >> 24] ^
            crc_table[3][hi & 0xff] ^ crc_table[2][(hi >> 8) & 0xff] ^
            crc_table[1][(hi >> 16) & 0xff] ^ crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n-- > 0) {
        c = crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    }
    return c ^ 0xFFFFFFFFu;
}

/* Adler-32 (RFC 1950, as zlib.adler32 from its default start of 1). */
#define ADLER_MOD 65521u
#define ADLER_NMAX 5552 /* the most bytes before the sums can overflow 32 bits */

static uint32_t
adler32_of(const unsigned char *p, Py_ssize_t n)
{
    uint32_t a = 1, b = 0;
    while (n > 0) {
        Py_ssize_t block = n < ADLER_NMAX ? n : ADLER_NMAX;
        n -= block;
        while (block-- > 0) {
            a += *p++;
            b += a;
        }
        a %= ADLER_MOD;
        b %= ADLER_MOD;
    }
    return (b << 16) | a;
}

static inline uint64_t
fingerprint_of(const unsigned char *p, Py_ssize_t n)
{
    if (n < 16) {
        /* A word or a value (most of what is hashed): the CRC four bytes a step, then the
         * Adler sums, which 15 bytes cannot take past their modulus before the end. */
        uint32_t c = 0xFFFFFFFFu, a = 1, b = 0;
        Py_ssize_t i = 0;
        for (; i + 4 <= n; i += 4) { /* (four bytes a step: "slicing by 4") */
            c ^= (uint32_t)p[i] | (uint32_t)p[i + 1] << 8 | (uint32_t)p[i + 2] << 16 |
                 (uint32_t)p[i + 3] << 24;
            c = crc_table[3][c & 0xff] ^ crc_table[2][(c >> 8) & 0xff] ^
                crc_table[1][(c >> 16) & 0xff] ^ crc_table[0][c >> 24];
        }
        for (; i < n; i++) {
            c = crc_table[0][(c ^ p[i]) & 0xff] ^ (c >> 8);
        }
        for (i = 0; i < n; i++) {
            a += p[i];
            b += a;
        }
        return ((uint64_t)(c ^ 0xFFFFFFFFu) << 32) | ((b % ADLER_MOD) << 16) | (a % ADLER_MOD);
    }
    return ((uint64_t)crc32_of(p, n) << 32) | adler32_of(p, n);
}

/* --- the hash sets ------------------------------------------------------------------------ */

/* Runs and fingerprints of attacker-controlled text are hashed with a per-process key (taken
 * from Python's own hash secret at import, so as random as PYTHONHASHSEED makes it): which
 * values collide cannot be worked out ahead. And each set counts its probes: past
 * COLLISION_BUDGET of its look-ups (eight probes a look-up on average, repeats counted as
 * look-ups too, so a text of a few values many times is not cut short) the function gives up
 * (returns None) and its caller runs the Python code, so no input makes the work quadratic. */
static uint64_t hash_key;

#define COLLISION_BUDGET(lookups) (8 * (lookups) + 1024)
#define TOO_MANY_COLLISIONS (-2)

static inline uint64_t
fmix64(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k;
}

/* How many items a set starts with room for, for a text of `n` characters: one every 16
 * (a word, a part), which most texts do not outgrow; past a megabyte it grows as it must. */
static size_t
expected_items(Py_ssize_t n)
{
    return (size_t)(n < (1 << 20) ? n : (1 << 20)) / 16;
}

static size_t
table_size(size_t capacity)
{
    size_t cap = 16;
    while (cap < capacity * 2) {
        cap <<= 1;
    }
    return cap;
}

/* A set of 64-bit values (open addressing, linear probing, at most half full). */
typedef struct {
    uint64_t *slots;
    unsigned char *used;
    size_t mask; /* capacity - 1, capacity a power of two */
    size_t count;
    size_t lookups; /* add calls, repeats included: what the probes are weighed against */
    size_t probes;  /* steps past a value's first slot, all added up */
} PrintSet;

static int
printset_init(PrintSet *s, size_t capacity)
{
    size_t cap = table_size(capacity);
    s->slots = PyMem_Malloc(cap * sizeof(uint64_t));
    s->used = PyMem_Calloc(cap, 1);
    if (s->slots == NULL || s->used == NULL) {
        PyMem_Free(s->slots);
        PyMem_Free(s->used);
        s->slots = NULL;
        s->used = NULL;
        PyErr_NoMemory();
        return -1;
    }
    s->mask = cap - 1;
    s->count = 0;
    s->lookups = 0;
    s->probes = 0;
    return 0;
}

static void
printset_free(PrintSet *s)
{
    PyMem_Free(s->slots);
    PyMem_Free(s->used);
}

/* The slot of `v`: its own, or the empty one where it goes. */
static inline size_t
printset_find(PrintSet *s, uint64_t v)
{
    size_t i = (size_t)fmix64(v ^ hash_key) & s->mask;
    while (s->used[i] && s->slots[i] != v) {
        i = (i + 1) & s->mask;
        s->probes++;
    }
    return i;
}

/* 1 if added, 0 if there already, -1 on MemoryError, TOO_MANY_COLLISIONS. */
static int
printset_add(PrintSet *s, uint64_t v)
{
    size_t i = printset_find(s, v);
    s->lookups++;
    if (s->probes > COLLISION_BUDGET(s->lookups)) {
        return TOO_MANY_COLLISIONS;
    }
    if (s->used[i]) {
        return 0;
    }
    if ((s->count + 1) * 2 > s->mask + 1) {
        PrintSet bigger;
        if (printset_init(&bigger, s->mask + 1) < 0) {
            return -1;
        }
        for (size_t k = 0; k <= s->mask; k++) {
            if (s->used[k]) {
                size_t j = printset_find(&bigger, s->slots[k]);
                bigger.used[j] = 1;
                bigger.slots[j] = s->slots[k];
            }
        }
        bigger.count = s->count;
        bigger.lookups = s->lookups;
        bigger.probes += s->probes;
        printset_free(s);
        *s = bigger;
        i = printset_find(s, v);
    }
    s->used[i] = 1;
    s->slots[i] = v;
    s->count++;
    return 1;
}

/* The values, as a list of ints (new reference, or NULL). */
static PyObject *
printset_list(PrintSet *s)
{
    PyObject *out = PyList_New((Py_ssize_t)s->count);
    Py_ssize_t i = 0;
    for (size_t k = 0; out != NULL && k <= s->mask; k++) {
        if (!s->used[k]) {
            continue;
        }
        PyObject *value = PyLong_FromUnsignedLongLong(s->slots[k]);
        if (value == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i++, value);
    }
    return out;
}

/* A set of byte runs, each a (start, size) in one buffer, told apart by their bytes. */
typedef struct {
    Py_ssize_t *starts; /* -1: an empty slot */
    Py_ssize_t *sizes;
    uint64_t *hashes;
    size_t mask;
    size_t count;
    size_t lookups; /* as PrintSet's */
    size_t probes;
} RunSet;

static int
runset_init(RunSet *r, size_t capacity)
{
    size_t cap = table_size(capacity);
    r->starts = PyMem_Malloc(cap * sizeof(Py_ssize_t));
    r->sizes = PyMem_Malloc(cap * sizeof(Py_ssize_t));
    r->hashes = PyMem_Malloc(cap * sizeof(uint64_t));
    if (r->starts == NULL || r->sizes == NULL || r->hashes == NULL) {
        PyMem_Free(r->starts);
        PyMem_Free(r->sizes);
        PyMem_Free(r->hashes);
        r->starts = NULL;
        r->sizes = NULL;
        r->hashes = NULL;
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < cap; i++) {
        r->starts[i] = -1;
    }
    r->mask = cap - 1;
    r->count = 0;
    r->lookups = 0;
    r->probes = 0;
    return 0;
}

static void
runset_free(RunSet *r)
{
    PyMem_Free(r->starts);
    PyMem_Free(r->sizes);
    PyMem_Free(r->hashes);
}

/* A keyed hash of a run, as `add_runs` takes it on the way: its bytes gathered eight at a
 * time into a word, each word mixed in, the last (partial) one and the length last. */
#define RUN_MULTIPLIER 0x9e3779b97f4a7c15ULL

static inline uint64_t
run_hash_step(uint64_t h, uint64_t word)
{
    h = (h ^ word) * RUN_MULTIPLIER;
    return h ^ (h >> 32);
}

static inline uint64_t
run_hash_end(uint64_t h, uint64_t word, Py_ssize_t n)
{
    return fmix64(h ^ word ^ ((uint64_t)n * RUN_MULTIPLIER));
}

static inline void
runset_place(RunSet *r, Py_ssize_t start, Py_ssize_t size, uint64_t hash)
{
    size_t i = (size_t)hash & r->mask;
    while (r->starts[i] != -1) {
        i = (i + 1) & r->mask;
        r->probes++;
    }
    r->starts[i] = start;
    r->sizes[i] = size;
    r->hashes[i] = hash;
    r->count++;
}

static inline int
same_bytes(const unsigned char *a, const unsigned char *b, Py_ssize_t n)
{
    if (n > 16) {
        return memcmp(a, b, (size_t)n) == 0;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        if (a[k] != b[k]) {
            return 0;
        }
    }
    return 1;
}

/* 1 if added, 0 if there already, -1 on MemoryError, TOO_MANY_COLLISIONS; `hash` is the
 * run's (`run_hash_step`, `run_hash_end`). (Not inlined: its callers' loops keep their
 * registers.) */
Py_NO_INLINE static int
runset_add(RunSet *r, const unsigned char *buffer, Py_ssize_t start, Py_ssize_t size,
           uint64_t hash)
{
    size_t i = (size_t)hash & r->mask;
    r->lookups++;
    while (r->starts[i] != -1) {
        if (r->hashes[i] == hash && r->sizes[i] == size &&
            same_bytes(buffer + r->starts[i], buffer + start, size)) {
            return 0;
        }
        i = (i + 1) & r->mask;
        if (++r->probes > COLLISION_BUDGET(r->lookups)) {
            return TOO_MANY_COLLISIONS;
        }
    }
    if ((r->count + 1) * 2 > r->mask + 1) {
        RunSet bigger;
        if (runset_init(&bigger, r->mask + 1) < 0) {
            return -1;
        }
        for (size_t k = 0; k <= r->mask; k++) {
            if (r->starts[k] != -1) {
                runset_place(&bigger, r->starts[k], r->sizes[k], r->hashes[k]);
            }
        }
        bigger.lookups = r->lookups;
        bigger.probes += r->probes;
        runset_free(r);
        *r = bigger;
    }
    runset_place(r, start, size, hash);
    return 1;
}

/* --- fingerprints(chunks) ----------------------------------------------------------------- */

static PyObject *
native_fingerprints(PyObject *module, PyObject *chunks)
{
    /* A tuple: a snapshot no buffer export (which may run Python code) can change. */
    PyObject *seq = PySequence_Tuple(chunks);
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    PyObject *out = PyList_New(n);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(seq, i); /* (held by the tuple) */
        uint64_t print;
        if (PyBytes_CheckExact(item)) {
            print = fingerprint_of((const unsigned char *)PyBytes_AS_STRING(item),
                                   PyBytes_GET_SIZE(item));
        }
        else {
            /* Any contiguous buffer, as zlib.crc32 takes (a str is refused: TypeError). */
            Py_buffer view;
            if (PyObject_GetBuffer(item, &view, PyBUF_SIMPLE) < 0) {
                Py_DECREF(out);
                Py_DECREF(seq);
                return NULL;
            }
            print = fingerprint_of((const unsigned char *)view.buf, view.len);
            PyBuffer_Release(&view);
        }
        PyObject *value = PyLong_FromUnsignedLongLong(print);
        if (value == NULL) {
            Py_DECREF(out);
            Py_DECREF(seq);
            return NULL;
        }
        PyList_SET_ITEM(out, i, value);
    }
    Py_DECREF(seq);
    return out;
}

/* --- parts_prints(text) ------------------------------------------------------------------- */

/* What `provenance._parts_prints` cuts ASCII text at: bytes.split's whitespace and
 * provenance._DELIMITERS; and provenance._EDGE, stripped from each part's ends. And what
 * `distinct_runs` and `distinct_words` split at: bytes.split's whitespace (Py_ISSPACE of a
 * byte), and str.split's among ASCII characters. */
static unsigned char is_cut[256];
static unsigned char is_edge[256];
static unsigned char is_space[256];
static unsigned char is_str_space[256];

static void
classes_init(void)
{
    const char *spaces = " \t\n\r\x0b\x0c";
    const char *delimiters = "\"'<>()[]{},;!?`|*";
    const char *edges = ".:#@/-_=+";
    for (const char *c = spaces; *c; c++) {
        is_space[(unsigned char)*c] = is_str_space[(unsigned char)*c] = 1;
        is_cut[(unsigned char)*c] = 1;
    }
    for (int c = 0x1c; c <= 0x1f; c++) {
        is_str_space[c] = 1;
    }
    for (const char *c = delimiters; *c; c++) {
        is_cut[(unsigned char)*c] = 1;
    }
    for (const char *c = edges; *c; c++) {
        is_edge[(unsigned char)*c] = 1;
    }
}

#define MIN_VALUE_CHARS 3

/* Whether p[0:n] is digits, one dot, digits (provenance._DECIMAL_ASCII's fullmatch). */
static int
is_decimal(const unsigned char *p, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n && p[i] >= '0' && p[i] <= '9') {
        i++;
    }
    if (i == 0 || i >= n || p[i] != '.') {
        return 0;
    }
    Py_ssize_t dot = i++;
    while (i < n && p[i] >= '0' && p[i] <= '9') {
        i++;
    }
    return i == n && i > dot + 1;
}

/* Borrowed: the ASCII characters of a str, or NULL with ValueError/TypeError set. */
static const unsigned char *
ascii_of(PyObject *text, Py_ssize_t *size)
{
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "expected a str");
        return NULL;
    }
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(text) < 0) {
        return NULL;
    }
#endif
    if (!PyUnicode_IS_ASCII(text)) {
        PyErr_SetString(PyExc_ValueError, "expected ASCII text");
        return NULL;
    }
    *size = PyUnicode_GET_LENGTH(text);
    return (const unsigned char *)PyUnicode_DATA(text);
}

static PyObject *
native_parts_prints(PyObject *module, PyObject *text)
{
    Py_ssize_t n;
    const unsigned char *s = ascii_of(text, &n);
    if (s == NULL) {
        return NULL;
    }
    PrintSet seen;
    if (printset_init(&seen, expected_items(n)) < 0) {
        return NULL;
    }
    Py_ssize_t i = 0;
    while (i < n) {
        while (i < n && is_cut[s[i]]) {
            i++;
        }
        Py_ssize_t start = i;
        while (i < n && !is_cut[s[i]]) {
            i++;
        }
        Py_ssize_t end = i;
        while (start < end && is_edge[s[start]]) {
            start++;
        }
        while (end > start && is_edge[s[end - 1]]) {
            end--;
        }
        if (end - start < MIN_VALUE_CHARS) {
            continue;
        }
        /* provenance._normal_ascii: `mailto:` off, or a decimal's trailing zeros. */
        const unsigned char *part = s + start;
        Py_ssize_t size = end - start;
        if (size >= 7 && memcmp(part, "mailto:", 7) == 0) {
            part += 7;
            size -= 7;
        }
        else if (part[size - 1] == '0' && is_decimal(part, size)) {
            while (size > 0 && part[size - 1] == '0') {
                size--;
            }
            while (size > 0 && part[size - 1] == '.') {
                size--;
            }
        }
        int added = printset_add(&seen, fingerprint_of(part, size));
        if (added < 0) {
            printset_free(&seen);
            if (added == TOO_MANY_COLLISIONS) {
                Py_RETURN_NONE;
            }
            return NULL;
        }
    }
    PyObject *out = printset_list(&seen);
    printset_free(&seen);
    return out;
}

/* --- distinct_runs(data, table, delete=b'') ---------------------------------------------- */


/* `source` translated by `table` into `out`, the bytes marked in `deleted` (if given) left
 * out: how many bytes it wrote. (Locals and `restrict`: a store through a char pointer
 * would otherwise make the compiler reload everything at every byte.) */
#if defined(__GNUC__) && !defined(__clang__)
/* (GCC builds this loop of table look-ups into 16-byte stores of bytes put together in a
 * register pair, which stall: three times slower than a byte at a time.) */
__attribute__((optimize("no-tree-vectorize")))
#endif
static Py_ssize_t
translate(unsigned char *restrict out, const unsigned char *restrict source, Py_ssize_t n,
          const unsigned char *restrict table, const unsigned char *restrict deleted)
{
    if (deleted == NULL) {
        for (Py_ssize_t k = 0; k < n; k++) {
            out[k] = table[source[k]];
        }
        return n;
    }
    Py_ssize_t size = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        unsigned char c = source[k];
        out[size] = table[c];
        size += !deleted[c];
    }
    return size;
}

/* The runs of `buffer` between the bytes marked in `spaces` added to `runs`: 0, -1 on
 * MemoryError, or TOO_MANY_COLLISIONS. */
static int
add_runs(RunSet *runs, const unsigned char *buffer, Py_ssize_t size,
         const unsigned char *spaces)
{
    Py_ssize_t i = 0;
    for (;;) {
        while (i < size && spaces[buffer[i]]) {
            i++;
        }
        if (i >= size) {
            return 0;
        }
        Py_ssize_t start = i;
        uint64_t h = hash_key, word = 0;
        unsigned shift = 0;
        while (i < size && !spaces[buffer[i]]) {
            word |= (uint64_t)buffer[i++] << shift;
            shift += 8;
            if (shift == 64) {
                h = run_hash_step(h, word);
                word = 0;
                shift = 0;
            }
        }
        Py_ssize_t n = i - start;
        uint64_t hash = run_hash_end(h, word, n);
        /* A run seen before is most often in its first slot: looked at here. */
        size_t slot = (size_t)hash & runs->mask;
        if (runs->starts[slot] != -1 && runs->hashes[slot] == hash && runs->sizes[slot] == n &&
            same_bytes(buffer + runs->starts[slot], buffer + start, n)) {
            continue;
        }
        int added = runset_add(runs, buffer, start, n, hash);
        if (added < 0) {
            return added;
        }
    }
}

static PyObject *
native_distinct_runs(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 2 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "distinct_runs(data, table, delete=b'')");
        return NULL;
    }
    Py_buffer data, table, delete_;
    data.obj = table.obj = delete_.obj = NULL;
    PyObject *result = NULL;
    unsigned char *mapped = NULL;
    RunSet runs = {NULL, NULL, NULL, 0, 0, 0, 0};
    unsigned char deleted[256] = {0};
    Py_ssize_t size = 0;
    if (PyObject_GetBuffer(args[0], &data, PyBUF_SIMPLE) < 0 ||
        PyObject_GetBuffer(args[1], &table, PyBUF_SIMPLE) < 0) {
        goto done;
    }
    if (table.len != 256) {
        PyErr_SetString(PyExc_ValueError, "translation table must be 256 characters long");
        goto done;
    }
    if (nargs == 3) {
        if (PyObject_GetBuffer(args[2], &delete_, PyBUF_SIMPLE) < 0) {
            goto done;
        }
        for (Py_ssize_t k = 0; k < delete_.len; k++) {
            deleted[((const unsigned char *)delete_.buf)[k]] = 1;
        }
    }
    /* The translated bytes, deleted ones left out (runs point into this copy). */
    mapped = PyMem_Malloc(data.len > 0 ? (size_t)data.len : 1);
    if (mapped == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    size = translate(mapped, data.buf, data.len, table.buf, nargs == 3 ? deleted : NULL);
    if (runset_init(&runs, expected_items(size)) < 0) {
        goto done;
    }
    int added = add_runs(&runs, mapped, size, is_space);
    if (added == TOO_MANY_COLLISIONS) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    if (added < 0) {
        goto done;
    }
    result = PySet_New(NULL);
    if (result == NULL) {
        goto done;
    }
    for (size_t k = 0; k <= runs.mask; k++) {
        if (runs.starts[k] == -1) {
            continue;
        }
        PyObject *run =
            PyBytes_FromStringAndSize((const char *)mapped + runs.starts[k], runs.sizes[k]);
        if (run == NULL || PySet_Add(result, run) < 0) {
            Py_XDECREF(run);
            Py_CLEAR(result);
            goto done;
        }
        Py_DECREF(run);
    }
done:
    if (runs.starts != NULL) {
        runset_free(&runs);
    }
    PyMem_Free(mapped);
    if (data.obj != NULL) {
        PyBuffer_Release(&data);
    }
    if (table.obj != NULL) {
        PyBuffer_Release(&table);
    }
    if (delete_.obj != NULL) {
        PyBuffer_Release(&delete_);
    }
    return result;
}

/* --- distinct_words(text) ------------------------------------------------------------------ */

static PyObject *
native_distinct_words(PyObject *module, PyObject *text)
{
    Py_ssize_t n;
    const unsigned char *s = ascii_of(text, &n);
    if (s == NULL) {
        return NULL;
    }
    RunSet words;
    if (runset_init(&words, expected_items(n)) < 0) {
        return NULL;
    }
    int added = add_runs(&words, s, n, is_str_space);
    if (added < 0) {
        runset_free(&words);
        if (added == TOO_MANY_COLLISIONS) {
            Py_RETURN_NONE;
        }
        return NULL;
    }
    PyObject *result = PySet_New(NULL);
    for (size_t k = 0; result != NULL && k <= words.mask; k++) {
        if (words.starts[k] == -1) {
            continue;
        }
        PyObject *found = PyUnicode_FromKindAndData(PyUnicode_1BYTE_KIND, s + words.starts[k],
                                                    words.sizes[k]);
        if (found == NULL || PySet_Add(result, found) < 0) {
            Py_XDECREF(found);
            Py_CLEAR(result);
            break;
        }
        Py_DECREF(found);
    }
    runset_free(&words);
    return result;
}

/* --- amount_prints(text) -------------------------------------------------------------------- */

/* provenance._NUMBER on ASCII text (its group mark is not ASCII):
 *
 *   \d(?:(?<![\w/.,-]\d)|(?<=(?:CODES)\d))\d*(?:[,.]\d+)*(?:(?![\w/-]|[,.]\d)|(?=(?:CODES)(?![a-z])))
 *
 * A match starts at a digit with no word character, `/`, `.`, `,` or `-` before it, or a
 * currency code; it runs over the digits and the `,`/`.` each followed by a digit (greedy),
 * and ends where no word character, `/` or `-` follows, or a currency code (not followed by
 * a letter) does. Ends short of the longest run always have a digit, or a separator and a
 * digit, after them: the pattern's backtracking finds no other end, so where the longest
 * fails the start fails. Inside a run no digit may start one (a digit or a separator is
 * before it): one pass. */

static const char *const currency_codes[] = {
    "usd", "eur", "gbp", "chf", "jpy", "cny", "rmb", "inr", "cad", "aud",
    "nzd", "sek", "nok", "dkk", "pln", "czk", "huf", "rub", "brl", "mxn",
    "krw", "sgd", "hkd", "ils", "aed", "sar", "btc", "eth", NULL,
};

static int
is_code(const unsigned char *p)
{
    for (const char *const *code = currency_codes; *code; code++) {
        if (memcmp(p, *code, 3) == 0) {
            return 1;
        }
    }
    return 0;
}

static inline int
is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

static inline int
is_word(unsigned char c)
{
    return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static int
add_amount(PrintSet *prints, const unsigned char *amount, Py_ssize_t size)
{
    if (size < MIN_VALUE_CHARS) {
        return 0;
    }
    int added = printset_add(prints, fingerprint_of(amount, size));
    return added < 0 ? added : 0;
}

/* provenance._amounts of a run (digits and `,`/`.`, each separator between two digits), each
 * amount's fingerprint added to `prints` if it has MIN_VALUE_CHARS or more: `9,731.50` is
 * `9731.5`, `9.731,00` is `9731`, `9,731` both `9731` and `9.731`; groups of other sizes
 * (`1.2.3`) are no number. 0, -1 on MemoryError, or TOO_MANY_COLLISIONS. */
static int
add_amounts(PrintSet *prints, const unsigned char *run, Py_ssize_t n, unsigned char *buffer)
{
    Py_ssize_t last = -1; /* the last separator */
    for (Py_ssize_t i = 0; i < n; i++) {
        if (run[i] == ',' || run[i] == '.') {
            last = i;
        }
    }
    if (last == -1) {
        return add_amount(prints, run, n);
    }
    /* A last group of other than three digits is a fraction, after a point that may not
     * also separate the groups before it. */
    Py_ssize_t end = n - last - 1 == 3 ? n : last;
    /* The groups before `end`: one separator throughout, a first group of one to three
     * digits, the others of three. */
    Py_ssize_t separators = 0, first = -1, group = 0;
    for (Py_ssize_t i = 0; i < end; i++) {
        if (run[i] != ',' && run[i] != '.') {
            group++;
            continue;
        }
        if (end != n && run[i] == run[last]) {
            return 0;
        }
        if (first == -1) {
            first = i;
        }
        else if (run[i] != run[first] || group != 3) {
            return 0;
        }
        separators++;
        group = 0;
    }
    if (separators > 0 && (first > 3 || group != 3)) {
        return 0;
    }
    /* The whole number: its groups' digits run together. */
    size_t whole = 0;
    for (Py_ssize_t i = 0; i < end; i++) {
        if (run[i] != ',' && run[i] != '.') {
            buffer[whole++] = run[i];
        }
    }
    if (end != n) {
        /* `whole.fraction`, the fraction's trailing zeros off (and the point if no digit is
         * left): at most the run's length. */
        const unsigned char *fraction = run + end + 1;
        size_t fraction_size = (size_t)(n - end - 1);
        while (fraction_size > 0 && fraction[fraction_size - 1] == '0') {
            fraction_size--;
        }
        if (fraction_size > 0) {
            buffer[whole] = '.';
            memcpy(buffer + whole + 1, fraction, fraction_size);
            whole += 1 + fraction_size;
        }
        return add_amount(prints, buffer, (Py_ssize_t)whole);
    }
    int failed = add_amount(prints, buffer, (Py_ssize_t)whole);
    if (failed || separators != 1) {
        return failed;
    }
    /* `9,731` or `9.731` alone: a decimal too (the first group, a point, the second without
     * its trailing zeros). */
    const unsigned char *decimals = run + first + 1;
    size_t decimals_size = (size_t)(n - first - 1);
    while (decimals_size > 0 && decimals[decimals_size - 1] == '0') {
        decimals_size--;
    }
    size_t size = (size_t)first;
    memcpy(buffer, run, size);
    if (decimals_size > 0) {
        buffer[size++] = '.';
        memcpy(buffer + size, decimals, decimals_size);
        size += decimals_size;
    }
    return add_amount(prints, buffer, (Py_ssize_t)size);
}

/* provenance._SHAPES: a digit as `0`, a letter or `:` as `a`, `,` and `'` as `,`, others as
 * a space (filled by shapes_init). */
static unsigned char amount_shape[256];

static void
shapes_init(void)
{
    for (int c = 0; c < 256; c++) {
        amount_shape[c] = ' ';
    }
    for (int c = '0'; c <= '9'; c++) {
        amount_shape[c] = '0';
    }
    for (int c = 'a'; c <= 'z'; c++) {
        amount_shape[c] = amount_shape[c - 'a' + 'A'] = 'a';
    }
    amount_shape[':'] = 'a';
    amount_shape[','] = amount_shape['\''] = ',';
}

/* Whether the text may spell an amount other than as a word of its own (the test that
 * opens provenance._amount_prints): a `$`, `=` or backslash, or `aa0`, `0aa` or `0,0` in
 * its shape. */
static int
may_spell_amount(const unsigned char *s, Py_ssize_t n)
{
    if (memchr(s, '$', (size_t)n) || memchr(s, '=', (size_t)n) || memchr(s, '\\', (size_t)n)) {
        return 1;
    }
    unsigned char a = ' ', b = ' ';
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = amount_shape[s[i]];
        if ((c == '0' && ((a == 'a' && b == 'a') || (a == '0' && b == ','))) ||
            (c == 'a' && a == '0' && b == 'a')) {
            return 1;
        }
        a = b;
        b = c;
    }
    return 0;
}

static PyObject *
native_amount_prints(PyObject *module, PyObject *text)
{
    Py_ssize_t n;
    const unsigned char *s = ascii_of(text, &n);
    if (s == NULL) {
        return NULL;
    }
    if (memchr(s, '\'', (size_t)n)) {
        PyErr_SetString(PyExc_ValueError, "an apostrophe may be a group mark: not read here");
        return NULL;
    }
    if (!may_spell_amount(s, n)) {
        return PyList_New(0);
    }
    PrintSet prints;
    if (printset_init(&prints, 16) < 0) {
        return NULL;
    }
    /* An amount is at most as long as its run: room for the longest. */
    unsigned char *buffer = PyMem_Malloc(n > 0 ? (size_t)n : 1);
    if (buffer == NULL) {
        printset_free(&prints);
        return PyErr_NoMemory();
    }
    Py_ssize_t p = 0;
    while (p < n) {
        if (!is_digit(s[p])) {
            p++;
            continue;
        }
        unsigned char before = p > 0 ? s[p - 1] : ' ';
        int starts = !(is_word(before) || before == '/' || before == '.' || before == ',' ||
                       before == '-') ||
                     (p >= 3 && before >= 'a' && before <= 'z' && is_code(s + p - 3));
        if (!starts) {
            p++;
            continue;
        }
        Py_ssize_t e = p + 1;
        for (;;) {
            while (e < n && is_digit(s[e])) {
                e++;
            }
            if (e + 1 < n && (s[e] == ',' || s[e] == '.') && is_digit(s[e + 1])) {
                e++;
                continue;
            }
            break;
        }
        int ends = e >= n || !(is_word(s[e]) || s[e] == '/' || s[e] == '-');
        if (!ends && e + 3 <= n && s[e] >= 'a' && s[e] <= 'z' && is_code(s + e)) {
            ends = e + 3 >= n || !(s[e + 3] >= 'a' && s[e + 3] <= 'z');
        }
        if (!ends) {
            p++;
            continue;
        }
        int failed = add_amounts(&prints, s + p, e - p, buffer);
        if (failed) {
            PyMem_Free(buffer);
            printset_free(&prints);
            if (failed == TOO_MANY_COLLISIONS) {
                Py_RETURN_NONE;
            }
            return NULL;
        }
        p = e;
    }
    PyMem_Free(buffer);
    PyObject *out = printset_list(&prints);
    printset_free(&prints);
    return out;
}

/* --- merge_prints(prints, values, epoch) ---------------------------------------------------- */

/* The core of fingerprints.Prints.add_all: each value of the list moved to (or put at) the end
 * of the dict, mapped to `epoch`, one after the other (so a value the list repeats ends up
 * where it occurs last). Returns (how many distinct values were not already mapped to
 * `epoch`, whether any was not in the dict at all). */
static PyObject *
native_merge_prints(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyDict_CheckExact(args[0]) || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "merge_prints(dict, list, epoch)");
        return NULL;
    }
    PyObject *prints = args[0], *values = args[1], *epoch = args[2];
    /* Every value hashed first (an int's hash cannot fail): an unhashable one raises before
     * the dict changes, as in Python, and never leaves a batch half in. */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(values); i++) {
        PyObject *value = PyList_GET_ITEM(values, i);
        if (!PyLong_CheckExact(value)) {
            Py_INCREF(value);
            Py_hash_t hash = PyObject_Hash(value);
            Py_DECREF(value);
            if (hash == -1) {
                return NULL;
            }
        }
    }
    Py_ssize_t touched = 0;
    int fresh = 0;
    /* (The size read each time and the value held: a key's __eq__ may run Python code.) */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(values); i++) {
        PyObject *value = PyList_GET_ITEM(values, i);
        Py_INCREF(value);
        /* One look-up for a new value (most are): put in if absent, else the value kept. */
        Py_ssize_t size = PyDict_GET_SIZE(prints);
        PyObject *last = PyDict_SetDefault(prints, value, epoch); /* (borrowed) */
        int failed = last == NULL;
        if (!failed && PyDict_GET_SIZE(prints) > size) {
            fresh = 1;
            touched++;
        }
        else if (!failed) { /* known: moved to the end, mapped to `epoch` */
            Py_INCREF(last);
            int same = PyObject_RichCompareBool(last, epoch, Py_EQ);
            Py_DECREF(last);
            failed = same < 0 || PyDict_DelItem(prints, value) < 0 ||
                     PyDict_SetItem(prints, value, epoch) < 0;
            touched += !same;
        }
        Py_DECREF(value);
        if (failed) {
            return NULL;
        }
    }
    return Py_BuildValue("(nO)", touched, fresh ? Py_True : Py_False);
}

/* --- the module --------------------------------------------------------------------------- */

static PyMethodDef native_methods[] = {
    {"fingerprints", native_fingerprints, METH_O,
     "fingerprints(chunks) -> list[int]: (crc32 << 32) | adler32 of each chunk, in order."},
    {"parts_prints", native_parts_prints, METH_O,
     "parts_prints(text) -> list[int] | None: provenance._parts_prints of ASCII text "
     "(distinct fingerprints; None: too many hash collisions)."},
    {"distinct_runs", (PyCFunction)(void (*)(void))native_distinct_runs, METH_FASTCALL,
     "distinct_runs(data, table, delete=b'') -> set[bytes] | None: "
     "set(data.translate(table, delete).split()) (None: too many hash collisions)."},
    {"distinct_words", native_distinct_words, METH_O,
     "distinct_words(text) -> set[str] | None: set(text.split()) of ASCII text (None: too "
     "many hash collisions)."},
    {"amount_prints", native_amount_prints, METH_O,
     "amount_prints(text) -> list[int] | None: provenance._amount_prints of ASCII text "
     "without an apostrophe (distinct fingerprints; None: too many hash collisions)."},
    {"merge_prints", (PyCFunction)(void (*)(void))native_merge_prints, METH_FASTCALL,
     "merge_prints(prints, values, epoch) -> (int, bool): the core of Prints.add_all."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    "_native",
    "The guardian's hot primitives in C (see aap_server/guardian/native.py).",
    0,
    native_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    /* The hash sets' key, from Python's hash secret (a str's hash is keyed by it). */
    PyObject *salt = PyUnicode_FromString("aap_server.guardian._native");
    if (salt == NULL) {
        return NULL;
    }
    Py_hash_t salted = PyObject_Hash(salt);
    Py_DECREF(salt);
    if (salted == -1 && PyErr_Occurred()) {
        return NULL;
    }
    hash_key = fmix64((uint64_t)salted ^ 0x6a09e667f3bcc909ULL);
    crc_init();
    classes_init();
    shapes_init();
    return PyModule_Create(&native_module);
}
