/* Native scoring path of the built-in classifier (controller/classifier/model.py).
 *
 * The numpy path makes ~25 numpy calls per request; after the process has slept, each one
 * pays a cold code-footprint penalty (docs/classifier.md, "Native scorer"). These functions
 * do the same arithmetic in one call each:
 *
 *   segment_sums(data, weights, num_bits, sizes, segment) -> (sums, num_ngrams)
 *       sums[t] = sum over every byte n-gram of data, for every n in sizes, of
 *       weights[t, bucket(n-gram)], accumulated in double; num_ngrams counts them.
 *       The bucket is features.byte_buckets' hash, bit for bit:
 *           h_1 = byte[i];  h_n = h_{n-1} * PRIME + byte[i + n - 1]            (uint32)
 *           bucket = ((h_n + n * SALT + segment * SEGMENT_SALT) * MULTIPLIER) >> (32 - num_bits)
 *       An n larger than the data gives no n-gram; a size listed twice counts once.
 *
 *   request_probabilities(focus, context, weights, num_bits, sizes, length_scale,
 *                         w1, b1, w2, b2, shape_table, shape_sizes) -> list[float] | None
 *       the whole segmented model, what model.py calls per request: both segments' sums
 *       (from str, encoded as str.encode("utf-8", "replace")), plus, for every size in
 *       shape_sizes, the n-grams of the segment's bytes mapped through shape_table (256
 *       bytes; features.SHAPE_TABLE) hashed with segment + 2 (features.shape_buckets), all
 *       counted in the segment's N; combiner.combiner_inputs,
 *       the combiner softmax(w2 @ relu(w1 @ inputs + b1) + b2) (combiner.py); None when
 *       neither segment has an n-gram. One call instead of ~10
 *       Python-level steps saved ~40 us per request after a sleep.
 *       An optional 13th argument, word_mode (0 none, 1 words, 2 words and symbols), adds
 *       the word view (features.word_buckets): each ASCII word of a segment (a run of
 *       [A-Za-z0-9_], lowercased; with mode 2 each other printable ASCII byte too) hashed
 *       whole with segment + 4, summed, divided by sqrt(number of words) and added to the
 *       segment's score; the words do not count in N.
 *
 * Plain C99 and the Python C API; no threads, the GIL is held throughout. Bad arguments
 * raise TypeError or ValueError naming the argument.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Must equal controller/classifier/features.py (tests/classifier/test_native.py checks). */
#define PRIME 16777619u
#define SALT 0x9E3779B9u
#define MULTIPLIER 0x85EBCA6Bu
#define SEGMENT_SALT 0x7F4A7C15u
#define SHAPE_SEGMENT_OFFSET 2u
#define WORD_SEGMENT_OFFSET 4u
#define MAX_NGRAM_SIZE 64 /* the n-gram sizes are a bit mask of a uint64 */
#define NUM_STACK_TASKS 16 /* more tasks than this accumulate in a heap array */

/* 1 when `format` (a buffer's struct format) is one native-order item of type `code`. */
static int
is_native_format(const char *format, char code)
{
    if (format == NULL) {
        return code == 'B';
    }
    if (format[0] == '@' || format[0] == '=') {
        format++;
    }
#if PY_LITTLE_ENDIAN
    else if (format[0] == '<') {
        format++;
    }
#else
    else if (format[0] == '>' || format[0] == '!') {
        format++;
    }
#endif
    return format[0] == code && format[1] == '\0';
}

/* Get a C-contiguous buffer of `ndim` native `code` items from `obj`; on error, raise
 * naming `name` and return -1. */
static int
get_array(PyObject *obj, Py_buffer *view, const char *name, char code, int ndim)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_RECORDS_RO) < 0) {
        PyErr_Format(PyExc_TypeError,
                     "%s must be a C-contiguous %s array (e.g. a numpy array), not %.100s",
                     name, code == 'f' ? "float32" : "float64", Py_TYPE(obj)->tp_name);
        return -1;
    }
    const char *problem = NULL;
    if (!is_native_format(view->format, code) ||
        view->itemsize != (code == 'f' ? 4 : 8)) {
        problem = code == 'f' ? "must have dtype float32" : "must have dtype float64";
    }
    else if (view->ndim != ndim) {
        problem = ndim == 1 ? "must be 1-dimensional" : "must be 2-dimensional";
    }
    else if (!PyBuffer_IsContiguous(view, 'C')) {
        problem = "must be C-contiguous (use numpy.ascontiguousarray)";
    }
    if (problem != NULL) {
        PyErr_Format(PyExc_ValueError, "%s %s (got format %s, %d dimension(s))", name,
                     problem, view->format ? view->format : "B", view->ndim);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* The n-gram sizes as a bit mask (bit n set for size n) and the largest; -1 on error. */
static int
parse_sizes(PyObject *sizes, uint64_t *mask, int *max_size)
{
    if (!PyTuple_Check(sizes) && !PyList_Check(sizes)) {
        PyErr_Format(PyExc_TypeError, "sizes must be a tuple of ints, not %.100s",
                     Py_TYPE(sizes)->tp_name);
        return -1;
    }
    Py_ssize_t num_sizes = PySequence_Fast_GET_SIZE(sizes);
    PyObject **items = PySequence_Fast_ITEMS(sizes);
    *mask = 0;
    *max_size = 0;
    for (Py_ssize_t i = 0; i < num_sizes; i++) {
        if (!PyLong_Check(items[i])) {
            PyErr_Format(PyExc_TypeError, "sizes[%zd] must be an int, not %.100s", i,
                         Py_TYPE(items[i])->tp_name);
            return -1;
        }
        long size = PyLong_AsLong(items[i]);
        if (size == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            size = MAX_NGRAM_SIZE + 1;
        }
        if (size < 1 || size > MAX_NGRAM_SIZE) {
            PyErr_Format(PyExc_ValueError, "sizes[%zd] is %R; n-gram sizes must be in [1, %d]",
                         i, items[i], MAX_NGRAM_SIZE);
            return -1;
        }
        *mask |= (uint64_t)1 << size;
        if (size > *max_size) {
            *max_size = (int)size;
        }
    }
    return 0;
}

/* An int argument in [low, high], or -1 with ValueError/TypeError naming it. */
static int
parse_bounded(PyObject *obj, const char *name, long long low, long long high,
              long long *value)
{
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", name,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    int overflow = 0;
    *value = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow != 0 || *value < low || *value > high) {
        PyErr_Format(PyExc_ValueError, "%s is %R; it must be in [%lld, %lld]", name, obj, low,
                     high);
        return -1;
    }
    return 0;
}

#define BLOCK 256 /* n-grams hashed per batch (a 1 KiB array on the stack) */

/* buckets[j] = the bucket of the n-gram of `n` bytes at data[j], j < count <= BLOCK
 * (features.byte_buckets' hash). Loop order as numpy's: each step runs over all positions,
 * so the multiplies of different positions do not wait on each other (and vectorise). */
static void
hash_block(const uint8_t *data, Py_ssize_t count, int n, uint32_t salt, int shift,
           uint32_t *buckets)
{
    for (Py_ssize_t j = 0; j < count; j++) {
        buckets[j] = data[j];
    }
    for (int k = 1; k < n; k++) {
        for (Py_ssize_t j = 0; j < count; j++) {
            buckets[j] = buckets[j] * PRIME + data[j + k];
        }
    }
    for (Py_ssize_t j = 0; j < count; j++) {
        buckets[j] = ((buckets[j] + salt) * MULTIPLIER) >> shift;
    }
}

#define NUM_LANES 4 /* independent accumulators: the adds do not wait on each other */

/* Add the weight columns of `count` buckets to sums[0..3), summed in NUM_LANES lanes kept in
 * registers (3 tasks: math, code, chat). */
static void
gather3(const float *weights, Py_ssize_t num_buckets, const uint32_t *buckets,
        Py_ssize_t count, double *sums)
{
    const float *rows[3] = {weights, weights + num_buckets, weights + 2 * num_buckets};
    double lanes[NUM_LANES][3] = {{0.0}};
    Py_ssize_t j = 0;
    for (; j + NUM_LANES <= count; j += NUM_LANES) {
        for (int lane = 0; lane < NUM_LANES; lane++) {
            for (int t = 0; t < 3; t++) {
                lanes[lane][t] += rows[t][buckets[j + lane]];
            }
        }
    }
    for (; j < count; j++) {
        for (int t = 0; t < 3; t++) {
            lanes[0][t] += rows[t][buckets[j]];
        }
    }
    for (int t = 0; t < 3; t++) {
        sums[t] += (lanes[0][t] + lanes[1][t]) + (lanes[2][t] + lanes[3][t]);
    }
}

/* The same for any number of tasks (sums in memory: each add waits on the previous). */
static void
gather(const float *weights, Py_ssize_t num_tasks, Py_ssize_t num_buckets,
       const uint32_t *buckets, Py_ssize_t count, double *sums)
{
    if (num_tasks == 3) {
        gather3(weights, num_buckets, buckets, count, sums);
        return;
    }
    for (Py_ssize_t j = 0; j < count; j++) {
        for (Py_ssize_t t = 0; t < num_tasks; t++) {
            sums[t] += weights[t * num_buckets + buckets[j]];
        }
    }
}

/* sums[t] += weights[t, bucket] over the n-grams of data, one pass per n-gram size, BLOCK
 * n-grams at a time; returns the number of n-grams. */
static Py_ssize_t
accumulate(const uint8_t *data, Py_ssize_t num_bytes, const float *weights,
           Py_ssize_t num_tasks, Py_ssize_t num_buckets, int shift, uint64_t mask,
           int max_size, uint32_t segment, double *sums)
{
    uint32_t buckets[BLOCK];
    Py_ssize_t num_ngrams = 0;
    for (int n = 1; n <= max_size && n <= num_bytes; n++) {
        if (!((mask >> n) & 1)) {
            continue;
        }
        uint32_t salt = (uint32_t)n * SALT + segment * SEGMENT_SALT;
        Py_ssize_t count = num_bytes - n + 1;
        for (Py_ssize_t start = 0; start < count; start += BLOCK) {
            Py_ssize_t num_block = count - start < BLOCK ? count - start : BLOCK;
            hash_block(data + start, num_block, n, salt, shift, buckets);
            gather(weights, num_tasks, num_buckets, buckets, num_block, sums);
        }
        num_ngrams += count;
    }
    return num_ngrams;
}

static PyObject *
sums_result(const double *sums, Py_ssize_t num_tasks, Py_ssize_t num_ngrams)
{
    PyObject *values = PyTuple_New(num_tasks);
    if (values == NULL) {
        return NULL;
    }
    for (Py_ssize_t t = 0; t < num_tasks; t++) {
        PyObject *value = PyFloat_FromDouble(sums[t]);
        if (value == NULL) {
            Py_DECREF(values);
            return NULL;
        }
        PyTuple_SET_ITEM(values, t, value);
    }
    return Py_BuildValue("(Nn)", values, num_ngrams);
}

PyDoc_STRVAR(segment_sums_doc,
"segment_sums(data, weights, num_bits, sizes, segment) -> (sums, num_ngrams)\n\n"
"Per-task sums of the weight columns of every byte n-gram of `data` (bytes-like, UTF-8)\n"
"for every n-gram size in `sizes` (tuple of ints in [1, 64]), hashed as\n"
"features.byte_buckets hashes them for `segment` (int >= 0). `weights` is a C-contiguous\n"
"float32 array [num_tasks, 2**num_bits]. Returns a tuple of num_tasks floats (summed in\n"
"double) and the number of n-grams.");

static PyObject *
segment_sums(PyObject *module, PyObject *const *args, Py_ssize_t num_args)
{
    (void)module;
    if (num_args != 5) {
        PyErr_Format(PyExc_TypeError,
                     "segment_sums(data, weights, num_bits, sizes, segment) takes 5 "
                     "arguments (%zd given)", num_args);
        return NULL;
    }
    long long num_bits, segment;
    uint64_t mask;
    int max_size;
    if (parse_bounded(args[2], "num_bits", 1, 32, &num_bits) < 0 ||
        parse_sizes(args[3], &mask, &max_size) < 0 ||
        parse_bounded(args[4], "segment", 0, UINT32_MAX, &segment) < 0) {
        return NULL;
    }
    Py_buffer data;
    if (PyObject_GetBuffer(args[0], &data, PyBUF_SIMPLE) < 0) {
        PyErr_Format(PyExc_TypeError, "data must be bytes (UTF-8), not %.100s",
                     Py_TYPE(args[0])->tp_name);
        return NULL;
    }
    Py_buffer weights;
    if (get_array(args[1], &weights, "weights", 'f', 2) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t num_tasks = weights.shape[0];
    Py_ssize_t num_buckets = weights.shape[1];
    double stack_sums[NUM_STACK_TASKS] = {0.0};
    double *sums = stack_sums;
    if ((unsigned long long)num_buckets != 1ull << num_bits) {
        PyErr_Format(PyExc_ValueError,
                     "weights has %zd columns but num_bits %lld needs 2**%lld = %llu",
                     num_buckets, num_bits, num_bits, 1ull << num_bits);
        goto done;
    }
    if (num_tasks > NUM_STACK_TASKS) {
        sums = PyMem_Calloc((size_t)num_tasks, sizeof(double));
        if (sums == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    }
    Py_ssize_t num_ngrams = accumulate(
        (const uint8_t *)data.buf, data.len, (const float *)weights.buf, num_tasks,
        num_buckets, 32 - (int)num_bits, mask, max_size, (uint32_t)segment, sums);
    result = sums_result(sums, num_tasks, num_ngrams);
done:
    if (sums != stack_sums) {
        PyMem_Free(sums);
    }
    PyBuffer_Release(&weights);
    PyBuffer_Release(&data);
    return result;
}

/* out[r] = bias[r] + sum_c matrix[r, c] * vector[c]  (matrix [num_rows, num_cols]). */
static void
affine(const double *matrix, const double *bias, const double *vector, Py_ssize_t num_rows,
       Py_ssize_t num_cols, double *out)
{
    for (Py_ssize_t r = 0; r < num_rows; r++) {
        double total = 0.0;
        for (Py_ssize_t c = 0; c < num_cols; c++) {
            total += matrix[r * num_cols + c] * vector[c];
        }
        out[r] = total + bias[r];
    }
}

/* The softmax of logits[0..n) as a new list of floats. */
static PyObject *
softmax_list(double *logits, Py_ssize_t n)
{
    double top = logits[0];
    for (Py_ssize_t i = 1; i < n; i++) {
        top = logits[i] > top ? logits[i] : top;
    }
    double total = 0.0;
    for (Py_ssize_t i = 0; i < n; i++) {
        logits[i] = exp(logits[i] - top);
        total += logits[i];
    }
    PyObject *result = PyList_New(n);
    for (Py_ssize_t i = 0; result != NULL && i < n; i++) {
        PyObject *value = PyFloat_FromDouble(logits[i] / total);
        if (value == NULL) {
            Py_CLEAR(result);
            break;
        }
        PyList_SET_ITEM(result, i, value);
    }
    return result;
}

/* Check the combiner's shapes: w1 [H, I], b1 [H], w2 [O, H], b2 [O], O >= 1. */
static int
check_mlp_shapes(const Py_buffer *w1, const Py_buffer *b1, const Py_buffer *w2,
                 const Py_buffer *b2, Py_ssize_t num_inputs)
{
    Py_ssize_t num_hidden = w1->shape[0];
    if (w1->shape[1] != num_inputs || b1->shape[0] != num_hidden ||
        w2->shape[1] != num_hidden || b2->shape[0] != w2->shape[0] || w2->shape[0] < 1) {
        PyErr_Format(PyExc_ValueError,
                     "shapes do not fit: inputs [%zd], w1 [%zd, %zd], b1 [%zd], w2 [%zd, %zd], "
                     "b2 [%zd]; need w1 [H, %zd], b1 [H], w2 [O, H], b2 [O] with O >= 1",
                     num_inputs, w1->shape[0], w1->shape[1], b1->shape[0], w2->shape[0],
                     w2->shape[1], b2->shape[0], num_inputs);
        return -1;
    }
    return 0;
}

/* The combiner's four C-contiguous float64 arrays, w1 [H, I], b1 [H], w2 [O, H], b2 [O]. */
typedef struct {
    Py_buffer views[4];
    int num_views;
} Mlp;

static void
release_mlp(Mlp *mlp)
{
    for (int i = 0; i < mlp->num_views; i++) {
        PyBuffer_Release(&mlp->views[i]);
    }
    mlp->num_views = 0;
}

/* Acquire w1, b1, w2, b2 from args[0..4); on error, release what was taken and return -1. */
static int
get_mlp(PyObject *const *args, Mlp *mlp)
{
    static const char *const names[4] = {"w1", "b1", "w2", "b2"};
    static const int ndims[4] = {2, 1, 2, 1};
    for (mlp->num_views = 0; mlp->num_views < 4; mlp->num_views++) {
        if (get_array(args[mlp->num_views], &mlp->views[mlp->num_views],
                      names[mlp->num_views], 'd', ndims[mlp->num_views]) < 0) {
            release_mlp(mlp);
            return -1;
        }
    }
    return 0;
}

/* softmax(w2 @ relu(w1 @ inputs + b1) + b2) as a new list of floats; NULL on error. */
static PyObject *
run_mlp(const Mlp *mlp, const double *inputs, Py_ssize_t num_inputs)
{
    const Py_buffer *w1 = &mlp->views[0], *b1 = &mlp->views[1];
    const Py_buffer *w2 = &mlp->views[2], *b2 = &mlp->views[3];
    if (check_mlp_shapes(w1, b1, w2, b2, num_inputs) < 0) {
        return NULL;
    }
    Py_ssize_t num_hidden = w1->shape[0];
    Py_ssize_t num_outputs = w2->shape[0];
    double *scratch = PyMem_Malloc(sizeof(double) * (size_t)(num_hidden + num_outputs));
    if (scratch == NULL) {
        return PyErr_NoMemory();
    }
    double *hidden = scratch;
    double *logits = scratch + num_hidden;
    affine(w1->buf, b1->buf, inputs, num_hidden, num_inputs, hidden);
    for (Py_ssize_t h = 0; h < num_hidden; h++) {
        hidden[h] = hidden[h] > 0.0 ? hidden[h] : 0.0;
    }
    affine(w2->buf, b2->buf, hidden, num_outputs, num_hidden, logits);
    PyObject *result = softmax_list(logits, num_outputs);
    PyMem_Free(scratch);
    return result;
}

/* The UTF-8 bytes of `text` (a str) as Python's text.encode("utf-8", "replace") gives them:
 * the str's cached UTF-8 when it has no lone surrogate, else a new bytes in *owner. */
static int
utf8_of(PyObject *text, const char *name, const char **bytes, Py_ssize_t *num_bytes,
        PyObject **owner)
{
    *owner = NULL;
    if (!PyUnicode_Check(text)) {
        PyErr_Format(PyExc_TypeError, "%s must be a str, not %.100s", name,
                     Py_TYPE(text)->tp_name);
        return -1;
    }
    *bytes = PyUnicode_AsUTF8AndSize(text, num_bytes);
    if (*bytes != NULL) {
        return 0;
    }
    if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) {
        return -1;
    }
    PyErr_Clear();
    *owner = PyUnicode_AsEncodedString(text, "utf-8", "replace");
    if (*owner == NULL) {
        return -1;
    }
    *bytes = PyBytes_AS_STRING(*owner);
    *num_bytes = PyBytes_GET_SIZE(*owner);
    return 0;
}

/* The combiner inputs of one request (combiner.py): each segment's sums / sqrt(N) (0 without
 * n-grams), then log1p(N) / length_scale of each; inputs has 2 * num_tasks + 2 slots. */
static void
combiner_inputs(const double *sums, const Py_ssize_t *num_ngrams, Py_ssize_t num_tasks,
                double length_scale, double *inputs)
{
    for (int segment = 0; segment < 2; segment++) {
        double n = (double)num_ngrams[segment];
        for (Py_ssize_t t = 0; t < num_tasks; t++) {
            double total = sums[segment * num_tasks + t];
            inputs[segment * num_tasks + t] = n > 0 ? total / sqrt(n) : 0.0;
        }
        inputs[2 * num_tasks + segment] = log1p(n) / length_scale;
    }
}

/* Score both segments and run the combiner; args as request_probabilities' after parsing. */
/* The n-gram sizes of the shape view and its byte map (shape_sizes empty: no view). */
typedef struct {
    const uint8_t *table;
    uint64_t mask;
    int max_size;
} ShapeView;

/* accumulate() over the shape view of data[0..num_bytes); returns its n-grams. */
static Py_ssize_t
accumulate_shape(const uint8_t *data, Py_ssize_t num_bytes, const ShapeView *view,
                 const Py_buffer *weights, int shift, uint32_t segment, double *sums)
{
    if (view->mask == 0 || num_bytes == 0) {
        return 0;
    }
    uint8_t *mapped = PyMem_Malloc((size_t)num_bytes);
    if (mapped == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < num_bytes; i++) {
        mapped[i] = view->table[data[i]];
    }
    Py_ssize_t count = accumulate(mapped, num_bytes, (const float *)weights->buf,
                                  weights->shape[0], weights->shape[1], shift, view->mask,
                                  view->max_size, segment + SHAPE_SEGMENT_OFFSET, sums);
    PyMem_Free(mapped);
    return count;
}

/* The word view (features.word_buckets): sums[t] += weights[t, bucket(word)] over the ASCII
 * words of data (mode 1) and its other printable ASCII bytes (mode 2); returns the number of
 * words. A word hashes as an n-gram of its lowercased bytes, salted by segment + 4 only. */
static Py_ssize_t
accumulate_words(const uint8_t *data, Py_ssize_t num_bytes, int mode, const Py_buffer *weights,
                 int shift, uint32_t segment, double *sums)
{
    uint32_t buckets[BLOCK];
    Py_ssize_t count = 0, num_words = 0;
    uint32_t salt = (segment + WORD_SEGMENT_OFFSET) * SEGMENT_SALT;
    uint32_t hash = 0;
    int in_word = 0;
    for (Py_ssize_t i = 0; i <= num_bytes; i++) {
        uint8_t byte = i < num_bytes ? data[i] : 0;
        int is_word = (byte >= '0' && byte <= '9') || (byte >= 'a' && byte <= 'z') ||
                      (byte >= 'A' && byte <= 'Z') || byte == '_';
        if (is_word) {
            uint32_t lower = (byte >= 'A' && byte <= 'Z') ? (uint32_t)byte + 32u : byte;
            hash = in_word ? hash * PRIME + lower : lower;
            in_word = 1;
            continue;
        }
        if (in_word) {
            buckets[count++] = ((hash + salt) * MULTIPLIER) >> shift;
            in_word = 0;
        }
        if (mode == 2 && byte >= 33 && byte <= 126) {
            buckets[count++] = (((uint32_t)byte + salt) * MULTIPLIER) >> shift;
        }
        if (count >= BLOCK - 2 || (i == num_bytes && count > 0)) {
            gather((const float *)weights->buf, weights->shape[0], weights->shape[1], buckets,
                   count, sums);
            num_words += count;
            count = 0;
        }
    }
    return num_words;
}

static PyObject *
score_request(PyObject *const *texts, const Py_buffer *weights, long long num_bits,
              uint64_t mask, int max_size, double length_scale, const Mlp *mlp,
              const ShapeView *view, int word_mode)
{
    Py_ssize_t num_tasks = weights->shape[0];
    if ((unsigned long long)weights->shape[1] != 1ull << num_bits) {
        PyErr_Format(PyExc_ValueError,
                     "weights has %zd columns but num_bits %lld needs 2**%lld = %llu",
                     weights->shape[1], num_bits, num_bits, 1ull << num_bits);
        return NULL;
    }
    /* sums [2, num_tasks], then the inputs [2 * num_tasks + 2], then word sums [num_tasks] */
    double *scratch = PyMem_Calloc((size_t)(5 * num_tasks + 2), sizeof(double));
    if (scratch == NULL) {
        return PyErr_NoMemory();
    }
    static const char *const names[2] = {"focus", "context"};
    Py_ssize_t num_ngrams[2] = {0, 0};
    PyObject *result = NULL;
    for (int segment = 0; segment < 2; segment++) {
        const char *bytes;
        Py_ssize_t num_bytes;
        PyObject *owner;
        if (utf8_of(texts[segment], names[segment], &bytes, &num_bytes, &owner) < 0) {
            goto done;
        }
        num_ngrams[segment] = accumulate(
            (const uint8_t *)bytes, num_bytes, (const float *)weights->buf, num_tasks,
            weights->shape[1], 32 - (int)num_bits, mask, max_size, (uint32_t)segment,
            scratch + segment * num_tasks);
        Py_ssize_t num_shape = accumulate_shape(
            (const uint8_t *)bytes, num_bytes, view, weights, 32 - (int)num_bits,
            (uint32_t)segment, scratch + segment * num_tasks);
        Py_XDECREF(owner);
        if (num_shape < 0) {
            goto done;
        }
        num_ngrams[segment] += num_shape;
    }
    if (num_ngrams[0] == 0 && num_ngrams[1] == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    double *inputs = scratch + 2 * num_tasks;
    combiner_inputs(scratch, num_ngrams, num_tasks, length_scale, inputs);
    for (int segment = 0; segment < 2 && word_mode > 0; segment++) {
        /* A segment with no n-gram has no word either (words are bytes). */
        double *word_sums = scratch + 4 * num_tasks + 2;
        memset(word_sums, 0, (size_t)num_tasks * sizeof(double));
        const char *bytes;
        Py_ssize_t num_bytes;
        PyObject *owner;
        if (utf8_of(texts[segment], names[segment], &bytes, &num_bytes, &owner) < 0) {
            goto done;
        }
        Py_ssize_t num_words = accumulate_words((const uint8_t *)bytes, num_bytes, word_mode,
                                                weights, 32 - (int)num_bits, (uint32_t)segment,
                                                word_sums);
        Py_XDECREF(owner);
        for (Py_ssize_t t = 0; t < num_tasks && num_words > 0; t++) {
            inputs[segment * num_tasks + t] += word_sums[t] / sqrt((double)num_words);
        }
    }
    result = run_mlp(mlp, inputs, 2 * num_tasks + 2);
done:
    PyMem_Free(scratch);
    return result;
}

PyDoc_STRVAR(request_probabilities_doc,
"request_probabilities(focus, context, weights, num_bits, sizes, length_scale, w1, b1, w2,\n"
"                      b2, shape_table, shape_sizes) -> list[float] | None\n\n"
"The whole segmented model in one call: segment_sums of `focus` (segment 0) and `context`\n"
"(segment 1), both str, encoded as str.encode('utf-8', 'replace'); the combiner inputs\n"
"[focus sums / sqrt(N0), context sums / sqrt(N1), log1p(N0) / length_scale,\n"
"log1p(N1) / length_scale] (0 for a segment without n-grams); then the combiner,\n"
"softmax(w2 @ relu(w1 @ inputs + b1) + b2). None when neither segment has an n-gram.\n"
"Each segment's sums and N also count the n-grams of its bytes mapped through shape_table\n"
"(bytes of length 256) for every size in shape_sizes (may be empty), hashed with segment\n"
"+ 2. word_mode (optional, default 0): 1 adds the word view (features.word_buckets),\n"
"2 the word view with symbols; each segment's score gains its words' sums / sqrt(words).");

static PyObject *
request_probabilities(PyObject *module, PyObject *const *args, Py_ssize_t num_args)
{
    (void)module;
    if (num_args != 12 && num_args != 13) {
        PyErr_Format(PyExc_TypeError,
                     "request_probabilities(focus, context, weights, num_bits, sizes, "
                     "length_scale, w1, b1, w2, b2, shape_table, shape_sizes[, word_mode]) "
                     "takes 12 or 13 arguments (%zd given)", num_args);
        return NULL;
    }
    long long word_mode = 0;
    if (num_args == 13 && parse_bounded(args[12], "word_mode", 0, 2, &word_mode) < 0) {
        return NULL;
    }
    long long num_bits;
    uint64_t mask;
    int max_size;
    ShapeView view = {NULL, 0, 0};
    if (parse_bounded(args[3], "num_bits", 1, 32, &num_bits) < 0 ||
        parse_sizes(args[4], &mask, &max_size) < 0 ||
        parse_sizes(args[11], &view.mask, &view.max_size) < 0) {
        return NULL;
    }
    if (!PyBytes_Check(args[10]) || PyBytes_GET_SIZE(args[10]) != 256) {
        PyErr_Format(PyExc_TypeError, "shape_table must be bytes of length 256, not %.100s",
                     Py_TYPE(args[10])->tp_name);
        return NULL;
    }
    view.table = (const uint8_t *)PyBytes_AS_STRING(args[10]);
    double length_scale = PyFloat_AsDouble(args[5]);
    if (length_scale == -1.0 && PyErr_Occurred()) {
        PyErr_Format(PyExc_TypeError, "length_scale must be a float, not %.100s",
                     Py_TYPE(args[5])->tp_name);
        return NULL;
    }
    if (!(length_scale > 0.0)) {
        PyErr_Format(PyExc_ValueError, "length_scale is %R; it must be > 0", args[5]);
        return NULL;
    }
    Py_buffer weights;
    if (get_array(args[2], &weights, "weights", 'f', 2) < 0) {
        return NULL;
    }
    Mlp mlp;
    PyObject *result = NULL;
    if (get_mlp(args + 6, &mlp) == 0) {
        result = score_request(args, &weights, num_bits, mask, max_size, length_scale, &mlp,
                               &view, (int)word_mode);
        release_mlp(&mlp);
    }
    PyBuffer_Release(&weights);
    return result;
}

static PyMethodDef ngram_methods[] = {
    {"segment_sums", (PyCFunction)(void (*)(void))segment_sums, METH_FASTCALL,
     segment_sums_doc},
    {"request_probabilities", (PyCFunction)(void (*)(void))request_probabilities, METH_FASTCALL,
     request_probabilities_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef ngram_module = {
    PyModuleDef_HEAD_INIT,
    "controller.classifier._ngram",
    "Native n-gram scoring and combiner of the built-in classifier (see _ngram.c).",
    -1,
    ngram_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__ngram(void)
{
    PyObject *module = PyModule_Create(&ngram_module);
    if (module == NULL) {
        return NULL;
    }
    static const char *const names[5] = {"MAX_NGRAM_SIZE", "PRIME", "SALT", "MULTIPLIER",
                                         "SEGMENT_SALT"};
    static const unsigned long values[5] = {MAX_NGRAM_SIZE, PRIME, SALT, MULTIPLIER,
                                            SEGMENT_SALT};
    for (int i = 0; i < 5; i++) {
        PyObject *value = PyLong_FromUnsignedLong(values[i]);
        int status = value == NULL ? -1 : PyModule_AddObjectRef(module, names[i], value);
        Py_XDECREF(value);
        if (status < 0) {
            Py_DECREF(module);
            return NULL;
        }
    }
    return module;
}
