/*
 * formats/safetensors.c: see safetensors.h for the contract.
 *
 * Reading is two phases. Validation reads the 8-byte length and the header
 * with pread and checks everything the header claims against the file size
 * before any tensor byte is touched. Loading then copies (SFT_LOAD_COPY) or
 * maps (SFT_LOAD_MMAP) the data section. The mapping and the slab of copies
 * belong to a reference-counted sft_data, so tensor bytes can outlive the
 * sft_file that describes them.
 */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Heap copies are 64-byte aligned: a cache line, and enough for any SIMD
 * load the engine does. */
#define SLAB_ALIGN 64u

/* Writer header alignment: with the 8-byte length prefix, an 8-byte padded
 * header makes the data section start at a multiple of 8, so every tensor
 * whose offset is a multiple of its element size is naturally aligned. */
#define HEADER_ALIGN 8u

#define METADATA_KEY "__metadata__"

struct sft_data {
    atomic_int refs;
    void *map; /* PROT_READ mapping of the whole file, or NULL */
    size_t map_len;
    void *slab; /* aligned heap copies, or NULL */
};

struct sft_file {
    char *path;
    sft_load_mode mode;
    uint64_t file_size;
    uint64_t header_len;
    size_t n;
    sft_tensor *tensors; /* name order */
    size_t nmeta;
    sft_meta *meta; /* key order */
    sft_data *data;
    size_t copied;
};

static const struct {
    const char *name;
    size_t size;
} dtype_table[SFT_DTYPE_COUNT] = {
    [SFT_F32] = {"F32", 4},   [SFT_F64] = {"F64", 8}, [SFT_I64] = {"I64", 8},
    [SFT_BOOL] = {"BOOL", 1}, [SFT_F16] = {"F16", 2}, [SFT_BF16] = {"BF16", 2},
    [SFT_I32] = {"I32", 4},   [SFT_I16] = {"I16", 2}, [SFT_I8] = {"I8", 1},
    [SFT_U8] = {"U8", 1},
};

const char *sft_dtype_name(sft_dtype d)
{
    return (unsigned)d < SFT_DTYPE_COUNT ? dtype_table[d].name : "?";
}

size_t sft_dtype_size(sft_dtype d)
{
    return (unsigned)d < SFT_DTYPE_COUNT ? dtype_table[d].size : 0;
}

sft_status sft_dtype_parse(const char *name, sft_dtype *out)
{
    for (unsigned i = 0; i < SFT_DTYPE_COUNT; i++) {
        if (strcmp(name, dtype_table[i].name) == 0) {
            *out = (sft_dtype)i;
            return SFT_OK;
        }
    }
    return SFT_ETYPE;
}

const char *sft_strerror(sft_status s)
{
    switch (s) {
    case SFT_OK: return "ok";
    case SFT_EIO: return "I/O error";
    case SFT_EFORMAT: return "format error";
    case SFT_ETYPE: return "type error";
    case SFT_ETOOBIG: return "too big";
    case SFT_ENOMEM: return "out of memory";
    case SFT_EINVAL: return "invalid argument";
    }
    return "unknown status";
}

/* Writes "PATH: message" into err and returns s. */
#if defined(__GNUC__)
__attribute__((format(printf, 5, 6)))
#endif
static sft_status
fail(char *err, size_t errlen, sft_status s, const char *path, const char *fmt, ...)
{
    if (err != NULL && errlen > 0) {
        int k = snprintf(err, errlen, "%s: ", path);
        size_t used = k < 0 ? 0 : (size_t)k;
        if (used < errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(err + used, errlen - used, fmt, ap);
            va_end(ap);
        }
        /* One line, whatever the file holds: control bytes quoted from a
         * header (jansson's "near '...'") or a path become '?'. */
        for (char *c = err; *c != '\0'; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
    }
    return s;
}

/*
 * Returns the length of the longest valid UTF-8 prefix of p[0..n) (n when
 * all of it is valid). Rejects overlong forms, surrogates and code points
 * above U+10FFFF, as RFC 3629 requires.
 */
static size_t utf8_valid_prefix(const unsigned char *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) {
            len = 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else {
            return i;
        }
        if (n - i < len) return i;
        if (p[i + 1] < lo || p[i + 1] > hi) return i;
        for (size_t k = 2; k < len; k++)
            if (p[i + k] < 0x80 || p[i + k] > 0xBF) return i;
        i += len;
    }
    return n;
}

static int utf8_ok(const char *s)
{
    size_t n = strlen(s);
    return utf8_valid_prefix((const unsigned char *)s, n) == n;
}

/* Reads exactly n bytes at off; returns 0, or -1 with errno (0 on EOF). */
static int pread_full(int fd, void *buf, size_t n, uint64_t off)
{
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) {
            errno = 0;
            return -1;
        }
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

static int write_full(int fd, const void *buf, size_t n)
{
    const unsigned char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static uint64_t load_le64(const unsigned char b[8])
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | b[i];
    return v;
}

static void store_le64(unsigned char b[8], uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        b[i] = (unsigned char)(v & 0xFF);
        v >>= 8;
    }
}

/* Writes "[d0,d1,...]" into buf for messages (truncated if long). */
static const char *shape_str(char *buf, size_t len, const int64_t *shape, size_t ndim)
{
    size_t used = 0;
    buf[0] = '\0';
    int k = snprintf(buf, len, "[");
    used = k > 0 ? (size_t)k : 0;
    for (size_t i = 0; i < ndim && used < len; i++) {
        k = snprintf(buf + used, len - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
        used += k > 0 ? (size_t)k : 0;
    }
    if (used < len) snprintf(buf + used, len - used, "]");
    return buf;
}

/* numel and nbytes of a shape with overflow checks; returns 0 on overflow. */
static int shape_bytes(const int64_t *shape, size_t ndim, size_t esize, uint64_t *numel,
                       uint64_t *nbytes)
{
    uint64_t count = 1;
    for (size_t i = 0; i < ndim; i++) {
        if (__builtin_mul_overflow(count, (uint64_t)shape[i], &count)) return 0;
    }
    uint64_t bytes;
    if (__builtin_mul_overflow(count, (uint64_t)esize, &bytes)) return 0;
    if (bytes > SIZE_MAX) return 0;
    *numel = count;
    *nbytes = bytes;
    return 1;
}

size_t sft_tensor_numel(const sft_tensor *t)
{
    size_t esize = sft_dtype_size(t->dtype);
    return esize ? t->nbytes / esize : 0;
}

/* ---- sft_data: the reference-counted bytes ------------------------------ */

sft_data *sft_data_ref(const sft_file *f)
{
    if (f == NULL || f->data == NULL) return NULL;
    atomic_fetch_add_explicit(&f->data->refs, 1, memory_order_relaxed);
    return f->data;
}

void sft_data_unref(sft_data *d)
{
    if (d == NULL) return;
    if (atomic_fetch_sub_explicit(&d->refs, 1, memory_order_acq_rel) != 1) return;
    if (d->map != NULL) munmap(d->map, d->map_len);
    free(d->slab);
    free(d);
}

/* ---- Reading: validation ------------------------------------------------ */

static int cmp_entry_offsets(const void *a, const void *b)
{
    const sft_tensor *x = *(const sft_tensor *const *)a;
    const sft_tensor *y = *(const sft_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int cmp_tensor_names(const void *a, const void *b)
{
    return strcmp(((const sft_tensor *)a)->name, ((const sft_tensor *)b)->name);
}

static int cmp_meta_keys(const void *a, const void *b)
{
    return strcmp(((const sft_meta *)a)->key, ((const sft_meta *)b)->key);
}

/* A JSON integer in [0, INT64_MAX]; jansson already refuses values that do
 * not fit a long long, and reals ("1.0", "1e3") are not integers. */
static int json_nonneg(const json_t *v, int64_t *out)
{
    if (!json_is_integer(v)) return 0;
    json_int_t x = json_integer_value(v);
    if (x < 0) return 0;
    *out = (int64_t)x;
    return 1;
}

static void free_tensors(sft_tensor *t, size_t n)
{
    if (t == NULL) return;
    for (size_t i = 0; i < n; i++) {
        free((void *)t[i].name);
        free((void *)t[i].shape);
    }
    free(t);
}

static void free_meta(sft_meta *m, size_t n)
{
    if (m == NULL) return;
    for (size_t i = 0; i < n; i++) {
        free((void *)m[i].key);
        free((void *)m[i].value);
    }
    free(m);
}

void sft_close(sft_file *f)
{
    if (f == NULL) return;
    free_tensors(f->tensors, f->n);
    free_meta(f->meta, f->nmeta);
    sft_data_unref(f->data);
    free(f->path);
    free(f);
}

static sft_status parse_metadata(sft_file *f, const json_t *obj, char *err, size_t errlen)
{
    if (!json_is_object(obj))
        return fail(err, errlen, SFT_EFORMAT, f->path, "__metadata__ is not a JSON object");
    size_t n = json_object_size(obj);
    f->meta = calloc(n ? n : 1, sizeof *f->meta);
    if (f->meta == NULL) return fail(err, errlen, SFT_ENOMEM, f->path, "out of memory");
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)obj, key, val)
    {
        if (!json_is_string(val))
            return fail(err, errlen, SFT_EFORMAT, f->path,
                        "__metadata__ value of '%s' is not a string", key);
        sft_meta *m = &f->meta[f->nmeta];
        m->key = strdup(key);
        m->value = strdup(json_string_value(val));
        f->nmeta++;
        if (m->key == NULL || m->value == NULL)
            return fail(err, errlen, SFT_ENOMEM, f->path, "out of memory");
    }
    qsort(f->meta, f->nmeta, sizeof *f->meta, cmp_meta_keys);
    return SFT_OK;
}

/* Parses one tensor entry into t (name already set). */
static sft_status parse_entry(const sft_file *f, sft_tensor *t, const json_t *v, char *err,
                              size_t errlen)
{
    const char *name = t->name;
    if (!json_is_object(v))
        return fail(err, errlen, SFT_EFORMAT, f->path, "tensor '%s': entry is not a JSON object",
                    name);
    const json_t *jd = json_object_get(v, "dtype");
    const json_t *js = json_object_get(v, "shape");
    const json_t *jo = json_object_get(v, "data_offsets");
    if (jd == NULL)
        return fail(err, errlen, SFT_EFORMAT, f->path, "tensor '%s': missing dtype", name);
    if (!json_is_string(jd))
        return fail(err, errlen, SFT_EFORMAT, f->path, "tensor '%s': dtype is not a string", name);
    if (js == NULL)
        return fail(err, errlen, SFT_EFORMAT, f->path, "tensor '%s': missing shape", name);
    if (!json_is_array(js))
        return fail(err, errlen, SFT_EFORMAT, f->path, "tensor '%s': shape is not an array", name);
    if (jo == NULL)
        return fail(err, errlen, SFT_EFORMAT, f->path, "tensor '%s': missing data_offsets", name);
    if (!json_is_array(jo))
        return fail(err, errlen, SFT_EFORMAT, f->path, "tensor '%s': data_offsets is not an array",
                    name);

    if (sft_dtype_parse(json_string_value(jd), &t->dtype) != SFT_OK)
        return fail(err, errlen, SFT_ETYPE, f->path, "tensor '%s': unsupported dtype '%s'", name,
                    json_string_value(jd));

    t->ndim = json_array_size(js);
    int64_t *shape = calloc(t->ndim ? t->ndim : 1, sizeof *shape);
    if (shape == NULL) return fail(err, errlen, SFT_ENOMEM, f->path, "out of memory");
    t->shape = shape;
    for (size_t i = 0; i < t->ndim; i++) {
        if (!json_nonneg(json_array_get(js, i), &shape[i]))
            return fail(err, errlen, SFT_EFORMAT, f->path,
                        "tensor '%s': shape[%zu] is not a non-negative integer", name, i);
    }

    if (json_array_size(jo) != 2)
        return fail(err, errlen, SFT_EFORMAT, f->path,
                    "tensor '%s': data_offsets has %zu elements, not 2", name, json_array_size(jo));
    int64_t b, e;
    if (!json_nonneg(json_array_get(jo, 0), &b) || !json_nonneg(json_array_get(jo, 1), &e))
        return fail(err, errlen, SFT_EFORMAT, f->path,
                    "tensor '%s': data_offsets are not non-negative integers", name);
    t->begin = (uint64_t)b;
    t->end = (uint64_t)e;
    if (t->end < t->begin)
        return fail(err, errlen, SFT_EFORMAT, f->path,
                    "tensor '%s': data_offsets [%llu, %llu) end before they begin", name,
                    (unsigned long long)t->begin, (unsigned long long)t->end);

    uint64_t numel, nbytes;
    char sbuf[160];
    if (!shape_bytes(t->shape, t->ndim, sft_dtype_size(t->dtype), &numel, &nbytes))
        return fail(err, errlen, SFT_EFORMAT, f->path,
                    "tensor '%s': shape %s x %s overflows the byte count", name,
                    shape_str(sbuf, sizeof sbuf, t->shape, t->ndim), sft_dtype_name(t->dtype));
    if (nbytes != t->end - t->begin)
        return fail(err, errlen, SFT_EFORMAT, f->path,
                    "tensor '%s': data_offsets [%llu, %llu) hold %llu bytes but shape %s x %s "
                    "needs %llu",
                    name, (unsigned long long)t->begin, (unsigned long long)t->end,
                    (unsigned long long)(t->end - t->begin),
                    shape_str(sbuf, sizeof sbuf, t->shape, t->ndim), sft_dtype_name(t->dtype),
                    (unsigned long long)nbytes);
    t->nbytes = (size_t)nbytes;
    return SFT_OK;
}

/* Sorted by offsets, the tensors must tile [0, data_len) exactly. */
static sft_status check_layout(const sft_file *f, uint64_t data_len, char *err, size_t errlen)
{
    const sft_tensor **order = calloc(f->n ? f->n : 1, sizeof *order);
    if (order == NULL) return fail(err, errlen, SFT_ENOMEM, f->path, "out of memory");
    for (size_t i = 0; i < f->n; i++) order[i] = &f->tensors[i];
    qsort(order, f->n, sizeof *order, cmp_entry_offsets);
    sft_status rc = SFT_OK;
    uint64_t pos = 0;
    for (size_t i = 0; i < f->n; i++) {
        const sft_tensor *t = order[i];
        if (t->end > data_len) {
            rc = fail(err, errlen, SFT_EFORMAT, f->path,
                      "tensor '%s': data_offsets end %llu is past the data section of %llu bytes",
                      t->name, (unsigned long long)t->end, (unsigned long long)data_len);
            goto done;
        }
        if (t->begin != pos) {
            rc = fail(err, errlen, SFT_EFORMAT, f->path,
                      "tensor '%s' starts at %llu but the previous one ended at %llu (%s)", t->name,
                      (unsigned long long)t->begin, (unsigned long long)pos,
                      t->begin > pos ? "a gap" : "an overlap");
            goto done;
        }
        pos = t->end;
    }
    if (pos != data_len)
        rc = fail(err, errlen, SFT_EFORMAT, f->path,
                  "the tensors cover %llu bytes but the data section has %llu (trailing bytes)",
                  (unsigned long long)pos, (unsigned long long)data_len);
done:
    free(order);
    return rc;
}

static sft_status parse_header(sft_file *f, const char *text, size_t len, char *err, size_t errlen)
{
    size_t valid = utf8_valid_prefix((const unsigned char *)text, len);
    if (valid != len)
        return fail(err, errlen, SFT_EFORMAT, f->path, "header is not valid UTF-8 (byte %zu)",
                    valid);
    if (len == 0 || text[0] != '{')
        return fail(err, errlen, SFT_EFORMAT, f->path, "header does not start with '{'");

    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL)
        return fail(err, errlen, SFT_EFORMAT, f->path, "header is not valid JSON: %s (byte %d)",
                    jerr.text, jerr.position);
    sft_status rc = SFT_OK;
    if (!json_is_object(root)) {
        rc = fail(err, errlen, SFT_EFORMAT, f->path, "header is not a JSON object");
        goto done;
    }

    size_t total = json_object_size(root);
    f->tensors = calloc(total ? total : 1, sizeof *f->tensors);
    if (f->tensors == NULL) {
        rc = fail(err, errlen, SFT_ENOMEM, f->path, "out of memory");
        goto done;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val)
    {
        if (strcmp(key, METADATA_KEY) == 0) {
            rc = parse_metadata(f, val, err, errlen);
            if (rc != SFT_OK) goto done;
            continue;
        }
        sft_tensor *t = &f->tensors[f->n];
        t->name = strdup(key);
        f->n++;
        if (t->name == NULL) {
            rc = fail(err, errlen, SFT_ENOMEM, f->path, "out of memory");
            goto done;
        }
        rc = parse_entry(f, t, val, err, errlen);
        if (rc != SFT_OK) goto done;
    }
    qsort(f->tensors, f->n, sizeof *f->tensors, cmp_tensor_names);
done:
    json_decref(root);
    return rc;
}

/* ---- Reading: loading --------------------------------------------------- */

static size_t round_up(size_t n, size_t a)
{
    return (n + a - 1) / a * a;
}

/* Allocates the slab for the tensors selected by need[] and assigns each its
 * place; returns 0 on overflow or allocation failure. */
static int alloc_slab(sft_file *f, const unsigned char *need)
{
    size_t total = 0;
    for (size_t i = 0; i < f->n; i++) {
        if (!need[i]) continue;
        size_t sz = round_up(f->tensors[i].nbytes, SLAB_ALIGN);
        if (sz < f->tensors[i].nbytes || SIZE_MAX - total < sz) return 0;
        total += sz;
    }
    if (total == 0) return 1;
    unsigned char *slab = aligned_alloc(SLAB_ALIGN, total);
    if (slab == NULL) return 0;
    f->data->slab = slab;
    f->copied = total;
    size_t off = 0;
    for (size_t i = 0; i < f->n; i++) {
        if (!need[i]) continue;
        f->tensors[i].data = slab + off;
        off += round_up(f->tensors[i].nbytes, SLAB_ALIGN);
    }
    return 1;
}

static sft_status load_data(sft_file *f, int fd, const struct stat *before, char *err,
                            size_t errlen)
{
    uint64_t data_start = 8 + f->header_len;
    unsigned char *need = calloc(f->n ? f->n : 1, 1);
    if (need == NULL) return fail(err, errlen, SFT_ENOMEM, f->path, "out of memory");
    sft_status rc = SFT_OK;

    if (f->mode == SFT_LOAD_MMAP) {
        struct stat now;
        if (fstat(fd, &now) != 0) {
            rc = fail(err, errlen, SFT_EIO, f->path, "fstat: %s", strerror(errno));
            goto done;
        }
        if (now.st_size != before->st_size || now.st_mtim.tv_sec != before->st_mtim.tv_sec
            || now.st_mtim.tv_nsec != before->st_mtim.tv_nsec) {
            rc = fail(err, errlen, SFT_EIO, f->path, "the file changed while it was being read");
            goto done;
        }
        void *map = mmap(NULL, (size_t)f->file_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            rc = fail(err, errlen, SFT_ENOMEM, f->path, "mmap of %llu bytes: %s",
                      (unsigned long long)f->file_size, strerror(errno));
            goto done;
        }
        f->data->map = map;
        f->data->map_len = (size_t)f->file_size;
        for (size_t i = 0; i < f->n; i++) {
            sft_tensor *t = &f->tensors[i];
            if (t->nbytes == 0) continue;
            uint64_t pos = data_start + t->begin;
            if (pos % sft_dtype_size(t->dtype) == 0) {
                t->data = (const unsigned char *)map + pos;
                t->mapped = 1;
            } else {
                need[i] = 1;
            }
        }
        if (!alloc_slab(f, need)) {
            rc = fail(err, errlen, SFT_ENOMEM, f->path, "cannot allocate aligned copies");
            goto done;
        }
        /* Nothing points into the mapping (a misaligned file): drop it, so
         * the process holds one copy of the weights, not two. */
        size_t nmapped = 0;
        for (size_t i = 0; i < f->n; i++) nmapped += (size_t)f->tensors[i].mapped;
        if (nmapped == 0) {
            munmap(map, f->data->map_len);
            f->data->map = NULL;
            f->data->map_len = 0;
        }
    } else {
        for (size_t i = 0; i < f->n; i++) need[i] = f->tensors[i].nbytes > 0;
        if (!alloc_slab(f, need)) {
            rc = fail(err, errlen, SFT_ENOMEM, f->path, "cannot allocate %s", "the tensor data");
            goto done;
        }
    }
    /* The copies are read with pread, not through the mapping, so the pages
     * of misaligned tensors are never faulted into the mapping as well. */
    for (size_t i = 0; i < f->n; i++) {
        sft_tensor *t = &f->tensors[i];
        if (!need[i]) continue;
        if (pread_full(fd, (void *)t->data, t->nbytes, data_start + t->begin) != 0) {
            rc = fail(err, errlen, SFT_EIO, f->path, "tensor '%s': read: %s", t->name,
                      errno ? strerror(errno) : "the file is shorter than at open");
            goto done;
        }
    }

    /* A BOOL byte other than 0 or 1 is a valid uint8 but not a valid bool. */
    for (size_t i = 0; i < f->n; i++) {
        const sft_tensor *t = &f->tensors[i];
        if (t->dtype != SFT_BOOL) continue;
        const unsigned char *p = t->data;
        for (size_t k = 0; k < t->nbytes; k++) {
            if (p[k] > 1) {
                rc = fail(err, errlen, SFT_EFORMAT, f->path,
                          "tensor '%s': BOOL element %zu is %u, not 0 or 1", t->name, k, p[k]);
                goto done;
            }
        }
    }
done:
    free(need);
    return rc;
}

sft_status sft_open(const char *path, sft_load_mode mode, sft_file **out, char *err, size_t errlen)
{
    *out = NULL;
    if (err != NULL && errlen > 0) err[0] = '\0';
    if (path == NULL) return fail(err, errlen, SFT_EINVAL, "(null)", "no path");
    if (mode != SFT_LOAD_COPY && mode != SFT_LOAD_MMAP)
        return fail(err, errlen, SFT_EINVAL, path, "unknown load mode %d", (int)mode);

    sft_status rc = SFT_OK;
    char *header = NULL;
    sft_file *f = calloc(1, sizeof *f);
    int fd = -1;
    if (f == NULL || (f->path = strdup(path)) == NULL) {
        rc = fail(err, errlen, SFT_ENOMEM, path, "out of memory");
        goto fail;
    }
    f->mode = mode;
    f->data = calloc(1, sizeof *f->data);
    if (f->data == NULL) {
        rc = fail(err, errlen, SFT_ENOMEM, path, "out of memory");
        goto fail;
    }
    atomic_init(&f->data->refs, 1);

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = fail(err, errlen, SFT_EIO, path, "cannot open: %s", strerror(errno));
        goto fail;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = fail(err, errlen, SFT_EIO, path, "fstat: %s", strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = fail(err, errlen, SFT_EIO, path, "not a regular file");
        goto fail;
    }
    f->file_size = (uint64_t)st.st_size;
    if (f->file_size < 8) {
        rc = fail(err, errlen, SFT_EFORMAT, path,
                  "the file is too short (%llu bytes) to hold the 8-byte header length",
                  (unsigned long long)f->file_size);
        goto fail;
    }
    unsigned char lenbuf[8];
    if (pread_full(fd, lenbuf, 8, 0) != 0) {
        rc = fail(err, errlen, SFT_EIO, path, "read: %s", errno ? strerror(errno) : "short read");
        goto fail;
    }
    f->header_len = load_le64(lenbuf);
    /* Compared as N <= size - 8 (size >= 8 checked above): N + 8 could wrap. */
    if (f->header_len > SFT_MAX_HEADER) {
        rc =
            fail(err, errlen, SFT_ETOOBIG, path, "header length %llu is over the limit of %u bytes",
                 (unsigned long long)f->header_len, SFT_MAX_HEADER);
        goto fail;
    }
    if (f->header_len > f->file_size - 8) {
        rc = fail(err, errlen, SFT_EFORMAT, path,
                  "header length %llu does not fit the file of %llu bytes",
                  (unsigned long long)f->header_len, (unsigned long long)f->file_size);
        goto fail;
    }
    size_t hlen = (size_t)f->header_len;
    header = malloc(hlen ? hlen : 1);
    if (header == NULL) {
        rc = fail(err, errlen, SFT_ENOMEM, path, "out of memory for the header");
        goto fail;
    }
    if (pread_full(fd, header, hlen, 8) != 0) {
        rc = fail(err, errlen, SFT_EIO, path, "header read: %s",
                  errno ? strerror(errno) : "the header is truncated");
        goto fail;
    }
    rc = parse_header(f, header, hlen, err, errlen);
    if (rc != SFT_OK) goto fail;
    rc = check_layout(f, f->file_size - 8 - f->header_len, err, errlen);
    if (rc != SFT_OK) goto fail;
    rc = load_data(f, fd, &st, err, errlen);
    if (rc != SFT_OK) goto fail;

    free(header);
    close(fd);
    *out = f;
    return SFT_OK;
fail:
    free(header);
    if (fd >= 0) close(fd);
    sft_close(f);
    return rc;
}

size_t sft_count(const sft_file *f)
{
    return f->n;
}

const sft_tensor *sft_tensor_at(const sft_file *f, size_t i)
{
    return i < f->n ? &f->tensors[i] : NULL;
}

const sft_tensor *sft_find(const sft_file *f, const char *name)
{
    sft_tensor key = {.name = name};
    return bsearch(&key, f->tensors, f->n, sizeof *f->tensors, cmp_tensor_names);
}

const sft_meta *sft_metadata(const sft_file *f, size_t *n)
{
    *n = f->nmeta;
    return f->meta;
}

const char *sft_metadata_get(const sft_file *f, const char *key)
{
    sft_meta k = {.key = key};
    const sft_meta *m =
        f->nmeta ? bsearch(&k, f->meta, f->nmeta, sizeof *f->meta, cmp_meta_keys) : NULL;
    return m ? m->value : NULL;
}

uint64_t sft_header_len(const sft_file *f)
{
    return f->header_len;
}
uint64_t sft_data_start(const sft_file *f)
{
    return 8 + f->header_len;
}
uint64_t sft_file_size(const sft_file *f)
{
    return f->file_size;
}
sft_load_mode sft_mode(const sft_file *f)
{
    return f->mode;
}
size_t sft_copied_bytes(const sft_file *f)
{
    return f->copied;
}
const char *sft_path(const sft_file *f)
{
    return f->path;
}

/* ---- Conversions -------------------------------------------------------- */

float sft_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t man = h & 0x3FFu;
    uint32_t bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13); /* inf or NaN (payload kept) */
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {
        /* subnormal: value = man * 2^-24; normalise into an F32 exponent */
        uint32_t e = 113u;
        while ((man & 0x400u) == 0) {
            man <<= 1;
            e--;
        }
        bits = sign | (e << 23) | ((man & 0x3FFu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

float sft_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

uint16_t sft_f32_to_f16(float value)
{
    uint32_t x;
    memcpy(&x, &value, sizeof x);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t exp = (x >> 23) & 0xFFu;
    uint32_t man = x & 0x7FFFFFu;
    if (exp == 0xFF) return (uint16_t)(sign | 0x7C00u | (man ? 0x200u : 0u));
    int e = (int)exp - 127 + 15;
    if (e >= 0x1F) return (uint16_t)(sign | 0x7C00u);
    if (e <= 0) {
        if (e < -10) return sign;
        man |= 0x800000u;
        unsigned shift = (unsigned)(14 - e);
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1u);
        uint32_t mid = 1u << (shift - 1u);
        if (rem > mid || (rem == mid && (half & 1u))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = ((uint32_t)e << 10) | (man >> 13);
    uint32_t rem = man & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) half++; /* may carry into inf */
    return (uint16_t)(sign | half);
}

sft_status sft_tensor_to_f32(const sft_tensor *t, float *out, size_t n, char *err, size_t errlen)
{
    size_t numel = sft_tensor_numel(t);
    if (n != numel)
        return fail(err, errlen, SFT_EINVAL, t->name, "asked for %zu elements, the tensor has %zu",
                    n, numel);
    const unsigned char *p = t->data;
    switch (t->dtype) {
    case SFT_F32:
        if (n) memcpy(out, p, n * sizeof *out);
        return SFT_OK;
    case SFT_F16:
    case SFT_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = (uint16_t)(p[2 * i] | (p[2 * i + 1] << 8));
            out[i] = t->dtype == SFT_F16 ? sft_f16_to_f32(h) : sft_bf16_to_f32(h);
        }
        return SFT_OK;
    case SFT_F64:
        for (size_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, p + 8 * i, sizeof d);
            out[i] = (float)d;
        }
        return SFT_OK;
    default:
        return fail(err, errlen, SFT_ETYPE, t->name, "cannot convert %s to F32",
                    sft_dtype_name(t->dtype));
    }
}

/* ---- Writing ------------------------------------------------------------ */

static int cmp_index_by_name(const void *a, const void *b, void *ctx)
{
    const sft_tensor *t = ctx;
    return strcmp(t[*(const size_t *)a].name, t[*(const size_t *)b].name);
}

/* Validates the writer input; fills order[] with the tensor indices in name
 * order and nbytes[] with each tensor's size. */
static sft_status validate_save(const char *path, const sft_tensor *t, size_t n,
                                const sft_meta *meta, size_t nmeta, size_t *order, size_t *nbytes,
                                char *err, size_t errlen)
{
    for (size_t i = 0; i < n; i++) {
        if (t[i].name == NULL)
            return fail(err, errlen, SFT_EINVAL, path, "tensor %zu has no name", i);
        if (!utf8_ok(t[i].name))
            return fail(err, errlen, SFT_EINVAL, path, "tensor %zu: the name is not valid UTF-8",
                        i);
        if (strcmp(t[i].name, METADATA_KEY) == 0)
            return fail(err, errlen, SFT_EINVAL, path, "a tensor cannot be named %s", METADATA_KEY);
        if ((unsigned)t[i].dtype >= SFT_DTYPE_COUNT)
            return fail(err, errlen, SFT_ETYPE, path, "tensor '%s': unknown dtype %d", t[i].name,
                        (int)t[i].dtype);
        if (t[i].ndim > 0 && t[i].shape == NULL)
            return fail(err, errlen, SFT_EINVAL, path, "tensor '%s': no shape", t[i].name);
        for (size_t d = 0; d < t[i].ndim; d++)
            if (t[i].shape[d] < 0)
                return fail(err, errlen, SFT_EINVAL, path, "tensor '%s': negative dimension",
                            t[i].name);
        uint64_t numel, nb;
        if (!shape_bytes(t[i].shape, t[i].ndim, sft_dtype_size(t[i].dtype), &numel, &nb))
            return fail(err, errlen, SFT_ETOOBIG, path, "tensor '%s': size overflows", t[i].name);
        if (nb > 0 && t[i].data == NULL)
            return fail(err, errlen, SFT_EINVAL, path, "tensor '%s': no data", t[i].name);
        nbytes[i] = (size_t)nb;
        order[i] = i;
    }
    qsort_r(order, n, sizeof *order, cmp_index_by_name, (void *)t);
    for (size_t i = 1; i < n; i++)
        if (strcmp(t[order[i - 1]].name, t[order[i]].name) == 0)
            return fail(err, errlen, SFT_EINVAL, path, "duplicate tensor name '%s'",
                        t[order[i]].name);
    for (size_t i = 0; i < nmeta; i++) {
        if (meta[i].key == NULL || meta[i].value == NULL)
            return fail(err, errlen, SFT_EINVAL, path, "metadata entry %zu is NULL", i);
        if (!utf8_ok(meta[i].key) || !utf8_ok(meta[i].value))
            return fail(err, errlen, SFT_EINVAL, path, "metadata entry %zu is not valid UTF-8", i);
        for (size_t k = 0; k < i; k++)
            if (strcmp(meta[i].key, meta[k].key) == 0)
                return fail(err, errlen, SFT_EINVAL, path, "duplicate metadata key '%s'",
                            meta[i].key);
    }
    return SFT_OK;
}

/* Builds the compact, key-sorted JSON header; returns owned text (free). */
static char *build_header(const sft_tensor *t, size_t n, const sft_meta *meta, size_t nmeta,
                          const size_t *order, const size_t *nbytes)
{
    json_t *root = json_object();
    if (root == NULL) return NULL;
    char *text = NULL;
    if (nmeta > 0) {
        json_t *m = json_object();
        if (m == NULL || json_object_set_new(root, METADATA_KEY, m) != 0) goto done;
        for (size_t i = 0; i < nmeta; i++)
            if (json_object_set_new(m, meta[i].key, json_string(meta[i].value)) != 0) goto done;
    }
    uint64_t pos = 0;
    for (size_t k = 0; k < n; k++) {
        size_t i = order[k];
        json_t *e = json_object();
        json_t *shape = json_array();
        json_t *offs = json_array();
        if (e == NULL || shape == NULL || offs == NULL) {
            json_decref(e);
            json_decref(shape);
            json_decref(offs);
            goto done;
        }
        for (size_t d = 0; d < t[i].ndim; d++)
            json_array_append_new(shape, json_integer(t[i].shape[d]));
        json_array_append_new(offs, json_integer((json_int_t)pos));
        pos += nbytes[i];
        json_array_append_new(offs, json_integer((json_int_t)pos));
        json_object_set_new(e, "dtype", json_string(sft_dtype_name(t[i].dtype)));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets", offs);
        if (json_object_set_new(root, t[i].name, e) != 0) goto done;
    }
    text = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
done:
    json_decref(root);
    return text;
}

sft_status sft_save(const char *path, const sft_tensor *tensors, size_t n, const sft_meta *meta,
                    size_t nmeta, const sft_save_opts *opts, char *err, size_t errlen)
{
    if (err != NULL && errlen > 0) err[0] = '\0';
    if (path == NULL) return fail(err, errlen, SFT_EINVAL, "(null)", "no path");
    if (n > 0 && tensors == NULL) return fail(err, errlen, SFT_EINVAL, path, "no tensors");
    if (nmeta > 0 && meta == NULL) return fail(err, errlen, SFT_EINVAL, path, "no metadata");
    unsigned misalign = opts ? opts->data_misalign : 0;
    if (misalign >= HEADER_ALIGN)
        return fail(err, errlen, SFT_EINVAL, path, "data_misalign %u is not below %u", misalign,
                    HEADER_ALIGN);

    sft_status rc = SFT_OK;
    size_t *order = calloc(n ? n : 1, sizeof *order);
    size_t *nbytes = calloc(n ? n : 1, sizeof *nbytes);
    char *text = NULL, *tmp = NULL, *dir = NULL;
    int fd = -1;
    if (order == NULL || nbytes == NULL) {
        rc = fail(err, errlen, SFT_ENOMEM, path, "out of memory");
        goto done;
    }
    rc = validate_save(path, tensors, n, meta, nmeta, order, nbytes, err, errlen);
    if (rc != SFT_OK) goto done;
    text = build_header(tensors, n, meta, nmeta, order, nbytes);
    if (text == NULL) {
        rc = fail(err, errlen, SFT_ENOMEM, path, "cannot build the header");
        goto done;
    }
    size_t len = strlen(text);
    size_t pad = (HEADER_ALIGN + misalign - (8 + len) % HEADER_ALIGN) % HEADER_ALIGN;

    /* The temporary file sits beside the target: rename is atomic only within
     * one file system. Its name is unique by pid and clock, and O_EXCL makes
     * sure it is ours. */
    size_t plen = strlen(path);
    tmp = malloc(plen + 64);
    const char *slash = strrchr(path, '/');
    dir = slash == NULL ? strdup(".") : strndup(path, slash == path ? 1 : (size_t)(slash - path));
    if (tmp == NULL || dir == NULL) {
        rc = fail(err, errlen, SFT_ENOMEM, path, "out of memory");
        goto done;
    }
    for (int attempt = 0; fd < 0; attempt++) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        snprintf(tmp, plen + 64, "%s.tmp.%ld.%lx", path, (long)getpid(),
                 (unsigned long)ts.tv_nsec ^ (unsigned long)attempt);
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 && (errno != EEXIST || attempt > 100)) {
            rc = fail(err, errlen, SFT_EIO, path, "cannot create %s: %s", tmp, strerror(errno));
            free(tmp);
            tmp = NULL;
            goto done;
        }
    }

    unsigned char lenbuf[8];
    store_le64(lenbuf, (uint64_t)(len + pad));
    static const char spaces[HEADER_ALIGN] = "        ";
    if (write_full(fd, lenbuf, 8) != 0 || write_full(fd, text, len) != 0
        || write_full(fd, spaces, pad) != 0)
        goto write_fail;
    for (size_t k = 0; k < n; k++) {
        size_t i = order[k];
        if (nbytes[i] > 0 && write_full(fd, tensors[i].data, nbytes[i]) != 0) goto write_fail;
    }
    if (fsync(fd) != 0) goto write_fail;
    int cr = close(fd);
    fd = -1;
    if (cr != 0) goto write_fail;
    if (rename(tmp, path) != 0) {
        rc = fail(err, errlen, SFT_EIO, path, "rename from %s: %s", tmp, strerror(errno));
        goto done;
    }
    free(tmp);
    tmp = NULL; /* renamed: nothing left to remove */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || fsync(dfd) != 0) {
        rc = fail(err, errlen, SFT_EIO, path, "fsync of directory %s: %s", dir, strerror(errno));
        if (dfd >= 0) close(dfd);
        goto done;
    }
    close(dfd);
    goto done;

write_fail:
    rc = fail(err, errlen, SFT_EIO, path, "writing %s: %s", tmp, strerror(errno));
done:
    if (fd >= 0) close(fd);
    if (tmp != NULL) {
        unlink(tmp);
        free(tmp);
    }
    free(dir);
    free(text);
    free(nbytes);
    free(order);
    return rc;
}
