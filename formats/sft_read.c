/*
 * formats/sft_read.c: sft_open and the file's accessors.
 *
 * Reading is two phases. Validation reads the 8-byte length and the header
 * with pread and checks everything the header claims against the file size
 * before any tensor byte is touched. Loading then copies (SFT_LOAD_COPY) or
 * maps (SFT_LOAD_MMAP) the data section. The mapping and the slab of copies
 * belong to a reference-counted sft_data, so tensor bytes can outlive the
 * sft_file that describes them.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Heap copies are 64-byte aligned: a cache line, and enough for any SIMD
 * load the engine does. */
#define SLAB_ALIGN 64u

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

static uint64_t load_le64(const unsigned char b[8])
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | b[i];
    return v;
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
        return sft__fail(err, errlen, SFT_EFORMAT, f->path, "__metadata__ is not a JSON object");
    size_t n = json_object_size(obj);
    f->meta = calloc(n ? n : 1, sizeof *f->meta);
    if (f->meta == NULL) return sft__fail(err, errlen, SFT_ENOMEM, f->path, "out of memory");
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)obj, key, val)
    {
        if (!json_is_string(val))
            return sft__fail(err, errlen, SFT_EFORMAT, f->path,
                             "__metadata__ value of '%s' is not a string", key);
        sft_meta *m = &f->meta[f->nmeta];
        m->key = strdup(key);
        m->value = strdup(json_string_value(val));
        f->nmeta++;
        if (m->key == NULL || m->value == NULL)
            return sft__fail(err, errlen, SFT_ENOMEM, f->path, "out of memory");
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
        return sft__fail(err, errlen, SFT_EFORMAT, f->path,
                         "tensor '%s': entry is not a JSON object", name);
    const json_t *jd = json_object_get(v, "dtype");
    const json_t *js = json_object_get(v, "shape");
    const json_t *jo = json_object_get(v, "data_offsets");
    if (jd == NULL)
        return sft__fail(err, errlen, SFT_EFORMAT, f->path, "tensor '%s': missing dtype", name);
    if (!json_is_string(jd))
        return sft__fail(err, errlen, SFT_EFORMAT, f->path, "tensor '%s': dtype is not a string",
                         name);
    if (js == NULL)
        return sft__fail(err, errlen, SFT_EFORMAT, f->path, "tensor '%s': missing shape", name);
    if (!json_is_array(js))
        return sft__fail(err, errlen, SFT_EFORMAT, f->path, "tensor '%s': shape is not an array",
                         name);
    if (jo == NULL)
        return sft__fail(err, errlen, SFT_EFORMAT, f->path, "tensor '%s': missing data_offsets",
                         name);
    if (!json_is_array(jo))
        return sft__fail(err, errlen, SFT_EFORMAT, f->path,
                         "tensor '%s': data_offsets is not an array", name);

    if (sft_dtype_parse(json_string_value(jd), &t->dtype) != SFT_OK)
        return sft__fail(err, errlen, SFT_ETYPE, f->path, "tensor '%s': unsupported dtype '%s'",
                         name, json_string_value(jd));

    t->ndim = json_array_size(js);
    int64_t *shape = calloc(t->ndim ? t->ndim : 1, sizeof *shape);
    if (shape == NULL) return sft__fail(err, errlen, SFT_ENOMEM, f->path, "out of memory");
    t->shape = shape;
    for (size_t i = 0; i < t->ndim; i++) {
        if (!json_nonneg(json_array_get(js, i), &shape[i]))
            return sft__fail(err, errlen, SFT_EFORMAT, f->path,
                             "tensor '%s': shape[%zu] is not a non-negative integer", name, i);
    }

    if (json_array_size(jo) != 2)
        return sft__fail(err, errlen, SFT_EFORMAT, f->path,
                         "tensor '%s': data_offsets has %zu elements, not 2", name,
                         json_array_size(jo));
    int64_t b, e;
    if (!json_nonneg(json_array_get(jo, 0), &b) || !json_nonneg(json_array_get(jo, 1), &e))
        return sft__fail(err, errlen, SFT_EFORMAT, f->path,
                         "tensor '%s': data_offsets are not non-negative integers", name);
    t->begin = (uint64_t)b;
    t->end = (uint64_t)e;
    if (t->end < t->begin)
        return sft__fail(err, errlen, SFT_EFORMAT, f->path,
                         "tensor '%s': data_offsets [%llu, %llu) end before they begin", name,
                         (unsigned long long)t->begin, (unsigned long long)t->end);

    uint64_t numel, nbytes;
    char sbuf[160];
    if (!sft__shape_bytes(t->shape, t->ndim, sft_dtype_size(t->dtype), &numel, &nbytes))
        return sft__fail(err, errlen, SFT_EFORMAT, f->path,
                         "tensor '%s': shape %s x %s overflows the byte count", name,
                         sft__shape_str(sbuf, sizeof sbuf, t->shape, t->ndim),
                         sft_dtype_name(t->dtype));
    if (nbytes != t->end - t->begin)
        return sft__fail(err, errlen, SFT_EFORMAT, f->path,
                         "tensor '%s': data_offsets [%llu, %llu) hold %llu bytes but shape %s x %s "
                         "needs %llu",
                         name, (unsigned long long)t->begin, (unsigned long long)t->end,
                         (unsigned long long)(t->end - t->begin),
                         sft__shape_str(sbuf, sizeof sbuf, t->shape, t->ndim),
                         sft_dtype_name(t->dtype), (unsigned long long)nbytes);
    t->nbytes = (size_t)nbytes;
    return SFT_OK;
}

/* Sorted by offsets, the tensors must tile [0, data_len) exactly. */
static sft_status check_layout(const sft_file *f, uint64_t data_len, char *err, size_t errlen)
{
    const sft_tensor **order = calloc(f->n ? f->n : 1, sizeof *order);
    if (order == NULL) return sft__fail(err, errlen, SFT_ENOMEM, f->path, "out of memory");
    for (size_t i = 0; i < f->n; i++) order[i] = &f->tensors[i];
    qsort(order, f->n, sizeof *order, cmp_entry_offsets);
    sft_status rc = SFT_OK;
    uint64_t pos = 0;
    for (size_t i = 0; i < f->n; i++) {
        const sft_tensor *t = order[i];
        if (t->end > data_len) {
            rc = sft__fail(
                err, errlen, SFT_EFORMAT, f->path,
                "tensor '%s': data_offsets end %llu is past the data section of %llu bytes",
                t->name, (unsigned long long)t->end, (unsigned long long)data_len);
            goto done;
        }
        if (t->begin != pos) {
            rc = sft__fail(err, errlen, SFT_EFORMAT, f->path,
                           "tensor '%s' starts at %llu but the previous one ended at %llu (%s)",
                           t->name, (unsigned long long)t->begin, (unsigned long long)pos,
                           t->begin > pos ? "a gap" : "an overlap");
            goto done;
        }
        pos = t->end;
    }
    if (pos != data_len)
        rc =
            sft__fail(err, errlen, SFT_EFORMAT, f->path,
                      "the tensors cover %llu bytes but the data section has %llu (trailing bytes)",
                      (unsigned long long)pos, (unsigned long long)data_len);
done:
    free(order);
    return rc;
}

static sft_status parse_header(sft_file *f, const char *text, size_t len, char *err, size_t errlen)
{
    size_t valid = sft__utf8_valid_prefix((const unsigned char *)text, len);
    if (valid != len)
        return sft__fail(err, errlen, SFT_EFORMAT, f->path, "header is not valid UTF-8 (byte %zu)",
                         valid);
    if (len == 0 || text[0] != '{')
        return sft__fail(err, errlen, SFT_EFORMAT, f->path, "header does not start with '{'");

    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL)
        return sft__fail(err, errlen, SFT_EFORMAT, f->path,
                         "header is not valid JSON: %s (byte %d)", jerr.text, jerr.position);
    sft_status rc = SFT_OK;
    if (!json_is_object(root)) {
        rc = sft__fail(err, errlen, SFT_EFORMAT, f->path, "header is not a JSON object");
        goto done;
    }

    size_t total = json_object_size(root);
    f->tensors = calloc(total ? total : 1, sizeof *f->tensors);
    if (f->tensors == NULL) {
        rc = sft__fail(err, errlen, SFT_ENOMEM, f->path, "out of memory");
        goto done;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val)
    {
        if (strcmp(key, SFT__METADATA_KEY) == 0) {
            rc = parse_metadata(f, val, err, errlen);
            if (rc != SFT_OK) goto done;
            continue;
        }
        sft_tensor *t = &f->tensors[f->n];
        t->name = strdup(key);
        f->n++;
        if (t->name == NULL) {
            rc = sft__fail(err, errlen, SFT_ENOMEM, f->path, "out of memory");
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
    if (need == NULL) return sft__fail(err, errlen, SFT_ENOMEM, f->path, "out of memory");
    sft_status rc = SFT_OK;

    if (f->mode == SFT_LOAD_MMAP) {
        struct stat now;
        if (fstat(fd, &now) != 0) {
            rc = sft__fail(err, errlen, SFT_EIO, f->path, "fstat: %s", strerror(errno));
            goto done;
        }
        if (now.st_size != before->st_size || now.st_mtim.tv_sec != before->st_mtim.tv_sec
            || now.st_mtim.tv_nsec != before->st_mtim.tv_nsec) {
            rc = sft__fail(err, errlen, SFT_EIO, f->path,
                           "the file changed while it was being read");
            goto done;
        }
        /* Mapped lazily (no MAP_POPULATE): a page is read and mapped when
         * something reads it. inspect and convert read headers and single
         * tensors, and a server's processes share in their Pss only the
         * pages their steps read, not the tensors they never use (the mask
         * buffers of an HF checkpoint, wpe past the positions served;
         * tests/test_shared_weights.sh). The server's warm-up step
         * (eng_sched_warmup) maps every page a step reads before it
         * listens. */
        void *map = mmap(NULL, (size_t)f->file_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            rc = sft__fail(err, errlen, SFT_ENOMEM, f->path, "mmap of %llu bytes: %s",
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
            rc = sft__fail(err, errlen, SFT_ENOMEM, f->path, "cannot allocate aligned copies");
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
            rc = sft__fail(err, errlen, SFT_ENOMEM, f->path, "cannot allocate %s",
                           "the tensor data");
            goto done;
        }
    }
    /* The copies are read with pread, not through the mapping, so the pages
     * of misaligned tensors are never faulted into the mapping as well. */
    for (size_t i = 0; i < f->n; i++) {
        sft_tensor *t = &f->tensors[i];
        if (!need[i]) continue;
        if (pread_full(fd, (void *)t->data, t->nbytes, data_start + t->begin) != 0) {
            rc = sft__fail(err, errlen, SFT_EIO, f->path, "tensor '%s': read: %s", t->name,
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
                rc = sft__fail(err, errlen, SFT_EFORMAT, f->path,
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
    if (path == NULL) return sft__fail(err, errlen, SFT_EINVAL, "(null)", "no path");
    if (mode != SFT_LOAD_COPY && mode != SFT_LOAD_MMAP)
        return sft__fail(err, errlen, SFT_EINVAL, path, "unknown load mode %d", (int)mode);

    sft_status rc = SFT_OK;
    char *header = NULL;
    sft_file *f = calloc(1, sizeof *f);
    int fd = -1;
    if (f == NULL || (f->path = strdup(path)) == NULL) {
        rc = sft__fail(err, errlen, SFT_ENOMEM, path, "out of memory");
        goto fail;
    }
    f->mode = mode;
    f->data = calloc(1, sizeof *f->data);
    if (f->data == NULL) {
        rc = sft__fail(err, errlen, SFT_ENOMEM, path, "out of memory");
        goto fail;
    }
    atomic_init(&f->data->refs, 1);

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = sft__fail(err, errlen, SFT_EIO, path, "cannot open: %s", strerror(errno));
        goto fail;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = sft__fail(err, errlen, SFT_EIO, path, "fstat: %s", strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = sft__fail(err, errlen, SFT_EIO, path, "not a regular file");
        goto fail;
    }
    f->file_size = (uint64_t)st.st_size;
    if (f->file_size < 8) {
        rc = sft__fail(err, errlen, SFT_EFORMAT, path,
                       "the file is too short (%llu bytes) to hold the 8-byte header length",
                       (unsigned long long)f->file_size);
        goto fail;
    }
    unsigned char lenbuf[8];
    if (pread_full(fd, lenbuf, 8, 0) != 0) {
        rc = sft__fail(err, errlen, SFT_EIO, path, "read: %s",
                       errno ? strerror(errno) : "short read");
        goto fail;
    }
    f->header_len = load_le64(lenbuf);
    /* Compared as N <= size - 8 (size >= 8 checked above): N + 8 could wrap. */
    if (f->header_len > SFT_MAX_HEADER) {
        rc = sft__fail(err, errlen, SFT_ETOOBIG, path,
                       "header length %llu is over the limit of %u bytes",
                       (unsigned long long)f->header_len, SFT_MAX_HEADER);
        goto fail;
    }
    if (f->header_len > f->file_size - 8) {
        rc = sft__fail(err, errlen, SFT_EFORMAT, path,
                       "header length %llu does not fit the file of %llu bytes",
                       (unsigned long long)f->header_len, (unsigned long long)f->file_size);
        goto fail;
    }
    size_t hlen = (size_t)f->header_len;
    header = malloc(hlen ? hlen : 1);
    if (header == NULL) {
        rc = sft__fail(err, errlen, SFT_ENOMEM, path, "out of memory for the header");
        goto fail;
    }
    if (pread_full(fd, header, hlen, 8) != 0) {
        rc = sft__fail(err, errlen, SFT_EIO, path, "header read: %s",
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
