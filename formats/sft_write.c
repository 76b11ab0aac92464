/*
 * formats/sft_write.c: sft_save, which writes an aligned safetensors file
 * (validated first, written to a temporary file, renamed into place).
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Writer header alignment: with the 8-byte length prefix, an 8-byte padded
 * header makes the data section start at a multiple of 8, so every tensor
 * whose offset is a multiple of its element size is naturally aligned. */
#define HEADER_ALIGN 8u

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

static void store_le64(unsigned char b[8], uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        b[i] = (unsigned char)(v & 0xFF);
        v >>= 8;
    }
}

/* Writes "[d0,d1,...]" into buf for messages (truncated if long). */
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
            return sft__fail(err, errlen, SFT_EINVAL, path, "tensor %zu has no name", i);
        if (!sft__utf8_ok(t[i].name))
            return sft__fail(err, errlen, SFT_EINVAL, path,
                             "tensor %zu: the name is not valid UTF-8", i);
        if (strcmp(t[i].name, SFT__METADATA_KEY) == 0)
            return sft__fail(err, errlen, SFT_EINVAL, path, "a tensor cannot be named %s",
                             SFT__METADATA_KEY);
        if ((unsigned)t[i].dtype >= SFT_DTYPE_COUNT)
            return sft__fail(err, errlen, SFT_ETYPE, path, "tensor '%s': unknown dtype %d",
                             t[i].name, (int)t[i].dtype);
        if (t[i].ndim > 0 && t[i].shape == NULL)
            return sft__fail(err, errlen, SFT_EINVAL, path, "tensor '%s': no shape", t[i].name);
        for (size_t d = 0; d < t[i].ndim; d++)
            if (t[i].shape[d] < 0)
                return sft__fail(err, errlen, SFT_EINVAL, path, "tensor '%s': negative dimension",
                                 t[i].name);
        uint64_t numel, nb;
        if (!sft__shape_bytes(t[i].shape, t[i].ndim, sft_dtype_size(t[i].dtype), &numel, &nb))
            return sft__fail(err, errlen, SFT_ETOOBIG, path, "tensor '%s': size overflows",
                             t[i].name);
        if (nb > 0 && t[i].data == NULL)
            return sft__fail(err, errlen, SFT_EINVAL, path, "tensor '%s': no data", t[i].name);
        nbytes[i] = (size_t)nb;
        order[i] = i;
    }
    qsort_r(order, n, sizeof *order, cmp_index_by_name, (void *)t);
    for (size_t i = 1; i < n; i++)
        if (strcmp(t[order[i - 1]].name, t[order[i]].name) == 0)
            return sft__fail(err, errlen, SFT_EINVAL, path, "duplicate tensor name '%s'",
                             t[order[i]].name);
    for (size_t i = 0; i < nmeta; i++) {
        if (meta[i].key == NULL || meta[i].value == NULL)
            return sft__fail(err, errlen, SFT_EINVAL, path, "metadata entry %zu is NULL", i);
        if (!sft__utf8_ok(meta[i].key) || !sft__utf8_ok(meta[i].value))
            return sft__fail(err, errlen, SFT_EINVAL, path, "metadata entry %zu is not valid UTF-8",
                             i);
        for (size_t k = 0; k < i; k++)
            if (strcmp(meta[i].key, meta[k].key) == 0)
                return sft__fail(err, errlen, SFT_EINVAL, path, "duplicate metadata key '%s'",
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
        if (m == NULL || json_object_set_new(root, SFT__METADATA_KEY, m) != 0) goto done;
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
    if (path == NULL) return sft__fail(err, errlen, SFT_EINVAL, "(null)", "no path");
    if (n > 0 && tensors == NULL) return sft__fail(err, errlen, SFT_EINVAL, path, "no tensors");
    if (nmeta > 0 && meta == NULL) return sft__fail(err, errlen, SFT_EINVAL, path, "no metadata");
    unsigned misalign = opts ? opts->data_misalign : 0;
    unsigned align = opts && opts->data_align ? opts->data_align : HEADER_ALIGN;
    if (misalign >= HEADER_ALIGN)
        return sft__fail(err, errlen, SFT_EINVAL, path, "data_misalign %u is not below %u",
                         misalign, HEADER_ALIGN);
    if ((align != HEADER_ALIGN && align != 64) || (align != HEADER_ALIGN && misalign != 0))
        return sft__fail(err, errlen, SFT_EINVAL, path,
                         "data_align %u: 8 or 64, and 64 only without data_misalign", align);

    sft_status rc = SFT_OK;
    size_t *order = calloc(n ? n : 1, sizeof *order);
    size_t *nbytes = calloc(n ? n : 1, sizeof *nbytes);
    char *text = NULL, *tmp = NULL, *dir = NULL;
    int fd = -1;
    if (order == NULL || nbytes == NULL) {
        rc = sft__fail(err, errlen, SFT_ENOMEM, path, "out of memory");
        goto done;
    }
    rc = validate_save(path, tensors, n, meta, nmeta, order, nbytes, err, errlen);
    if (rc != SFT_OK) goto done;
    text = build_header(tensors, n, meta, nmeta, order, nbytes);
    if (text == NULL) {
        rc = sft__fail(err, errlen, SFT_ENOMEM, path, "cannot build the header");
        goto done;
    }
    size_t len = strlen(text);
    size_t pad = (align + misalign - (8 + len) % align) % align;

    /* The temporary file sits beside the target: rename is atomic only within
     * one file system. Its name is unique by pid and clock, and O_EXCL makes
     * sure it is ours. */
    size_t plen = strlen(path);
    tmp = malloc(plen + 64);
    const char *slash = strrchr(path, '/');
    dir = slash == NULL ? strdup(".") : strndup(path, slash == path ? 1 : (size_t)(slash - path));
    if (tmp == NULL || dir == NULL) {
        rc = sft__fail(err, errlen, SFT_ENOMEM, path, "out of memory");
        goto done;
    }
    for (int attempt = 0; fd < 0; attempt++) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        snprintf(tmp, plen + 64, "%s.tmp.%ld.%lx", path, (long)getpid(),
                 (unsigned long)ts.tv_nsec ^ (unsigned long)attempt);
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 && (errno != EEXIST || attempt > 100)) {
            rc =
                sft__fail(err, errlen, SFT_EIO, path, "cannot create %s: %s", tmp, strerror(errno));
            free(tmp);
            tmp = NULL;
            goto done;
        }
    }

    unsigned char lenbuf[8];
    store_le64(lenbuf, (uint64_t)(len + pad));
    static const char spaces[65] =
        "                                                                ";
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
        rc = sft__fail(err, errlen, SFT_EIO, path, "rename from %s: %s", tmp, strerror(errno));
        goto done;
    }
    free(tmp);
    tmp = NULL; /* renamed: nothing left to remove */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || fsync(dfd) != 0) {
        rc = sft__fail(err, errlen, SFT_EIO, path, "fsync of directory %s: %s", dir,
                       strerror(errno));
        if (dfd >= 0) close(dfd);
        goto done;
    }
    close(dfd);
    goto done;

write_fail:
    rc = sft__fail(err, errlen, SFT_EIO, path, "writing %s: %s", tmp, strerror(errno));
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
