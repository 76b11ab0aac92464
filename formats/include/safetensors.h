/*
 * formats/include/safetensors.h: a validating reader and an atomic writer for the
 * safetensors file format (https://huggingface.co/docs/safetensors).
 *
 * A model file comes from the internet and is treated as hostile: every
 * field of the header is checked (framing, JSON, UTF-8, dtypes, shapes,
 * offsets, exact tiling of the data section, BOOL bytes) before a byte of
 * tensor data is read, and every failure is a status plus a one-line message
 * that names the file, the tensor and the check. Nothing here prints, exits
 * or aborts on bad input.
 *
 * File layout:
 *   offset 0      8 bytes   N, unsigned 64-bit little-endian
 *   offset 8      N bytes   header: a UTF-8 JSON object, may end with spaces
 *   offset 8 + N  rest      data: tensors back to back, row-major, little-endian
 *
 * Prefix: sft_. Thread: every function may run on any thread; an sft_file is
 * immutable after sft_open, so any number of threads may read it at once.
 */
#ifndef GPT2D_FORMATS_SAFETENSORS_H
#define GPT2D_FORMATS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

/* Status codes; never renumbered. */
typedef enum {
    SFT_OK = 0,
    SFT_EIO = 1,     /* open/read/write/fsync/rename failed (errno in the message) */
    SFT_EFORMAT = 2, /* the bytes are not a valid safetensors file            */
    SFT_ETYPE = 3,   /* a dtype this reader does not know, or a wrong dtype    */
    SFT_ETOOBIG = 4, /* a header over SFT_MAX_HEADER, or a size past SIZE_MAX  */
    SFT_ENOMEM = 5,  /* an allocation or mmap failed                           */
    SFT_EINVAL = 6   /* the caller passed something invalid (writer input)     */
} sft_status;

/* The safetensors crate's bound on the header, which bounds the allocation
 * made before the JSON is parsed. */
#define SFT_MAX_HEADER 100000000u

/* Element types. Only these are read; any other dtype string is SFT_ETYPE. */
typedef enum {
    SFT_F32 = 0,
    SFT_F64,
    SFT_I64,
    SFT_BOOL,
    SFT_F16,
    SFT_BF16,
    SFT_I32,
    SFT_I16,
    SFT_I8,
    SFT_U8,
    SFT_DTYPE_COUNT
} sft_dtype;

/* How sft_open makes the tensor bytes available. */
typedef enum {
    SFT_LOAD_COPY = 0, /* read every tensor into one aligned heap slab          */
    SFT_LOAD_MMAP = 1  /* map the file read-only; tensors whose file position is
                        * aligned for their dtype point into the mapping, the
                        * others are copied once into an aligned slab          */
} sft_load_mode;

/* A view of one tensor. In a file returned by sft_open, every pointer is
 * valid while the file is open or while a reference from sft_data_ref is
 * held. As writer input (sft_save) every pointer is borrowed for the call. */
typedef struct {
    const char *name; /* NUL-terminated UTF-8                               */
    sft_dtype dtype;
    size_t ndim;          /* 0 for a scalar                                     */
    const int64_t *shape; /* ndim dimensions, each >= 0                         */
    const void *data;     /* nbytes bytes; NULL when nbytes == 0                */
    size_t nbytes;        /* numel * element size                               */
    uint64_t begin, end;  /* data_offsets, relative to the data section         */
    int mapped;           /* 1: data points into the file mapping; 0: a copy    */
} sft_tensor;

/* One __metadata__ entry. */
typedef struct {
    const char *key;
    const char *value;
} sft_meta;

typedef struct sft_file sft_file; /* an open, validated file (opaque)          */
typedef struct sft_data sft_data; /* the reference-counted tensor bytes         */

/* ---- Dtypes ------------------------------------------------------------- */

/* "F32", "BF16", ...; "?" for a value out of range. Thread: any. */
const char *sft_dtype_name(sft_dtype d);

/* Bytes per element (1 for BOOL); 0 for a value out of range. */
size_t sft_dtype_size(sft_dtype d);

/* The dtype for a name such as "F32"; returns SFT_ETYPE for unknown names. */
sft_status sft_dtype_parse(const char *name, sft_dtype *out);

/* Human-readable words for a status ("format error", ...). */
const char *sft_strerror(sft_status s);

/* ---- Reading ------------------------------------------------------------ */

/*
 * Opens and validates the file at path, then loads its tensors in the given
 * mode. On success *out is an open file (close with sft_close). On failure
 * *out is NULL, nothing is left allocated, and err holds one line naming the
 * path, the tensor and the failed check. Borrows path.
 *
 * In SFT_LOAD_MMAP mode the header is validated through ordinary reads
 * first; the file is mapped only after it passed, and only if fstat shows the
 * same size and modification time as at the start. Writes to a mapped page
 * fault (PROT_READ): weights are never modified in place.
 */
sft_status sft_open(const char *path, sft_load_mode mode, sft_file **out, char *err, size_t errlen);

/* Closes f; the tensor bytes live on while an sft_data reference is held.
 * Accepts NULL. */
void sft_close(sft_file *f);

/* Number of tensors (the __metadata__ entry is not a tensor). */
size_t sft_count(const sft_file *f);

/* The i-th tensor in name order (byte-wise strcmp), i < sft_count(f). The
 * view is valid until sft_close(f); its data pointer as long as the data is
 * referenced (see sft_data_ref). */
const sft_tensor *sft_tensor_at(const sft_file *f, size_t i);

/* The tensor called name, or NULL. Borrows name. Same lifetime as above. */
const sft_tensor *sft_find(const sft_file *f, const char *name);

/* Metadata entries in key order; *n receives their number. Valid until
 * sft_close(f). */
const sft_meta *sft_metadata(const sft_file *f, size_t *n);

/* The value of a metadata key, or NULL. */
const char *sft_metadata_get(const sft_file *f, const char *key);

/* Facts about the file itself. */
uint64_t sft_header_len(const sft_file *f); /* N                           */
uint64_t sft_data_start(const sft_file *f); /* 8 + N                       */
uint64_t sft_file_size(const sft_file *f);
sft_load_mode sft_mode(const sft_file *f);
size_t sft_copied_bytes(const sft_file *f); /* bytes held in the heap slab */
const char *sft_path(const sft_file *f);

/*
 * Returns a new reference to the tensor bytes of f (the mapping and the
 * aligned slab): every tensor's data pointer stays valid until the last
 * reference is released, even after sft_close(f). Release with
 * sft_data_unref. Thread: any (the count is atomic).
 */
sft_data *sft_data_ref(const sft_file *f);
void sft_data_unref(sft_data *d); /* accepts NULL */

/*
 * Converts the n elements of t to F32 into out (which must hold n floats, n
 * equal to the tensor's element count). Accepts F32 (a copy), F16, BF16 and
 * F64; other dtypes are SFT_ETYPE. F16 subnormals, infinities and NaNs are
 * converted exactly.
 */
sft_status sft_tensor_to_f32(const sft_tensor *t, float *out, size_t n, char *err, size_t errlen);

/* Element count of t (the shape's product; validated not to overflow). */
size_t sft_tensor_numel(const sft_tensor *t);

/* IEEE half / bfloat16 to float. */
float sft_f16_to_f32(uint16_t h);
float sft_bf16_to_f32(uint16_t h);
uint16_t sft_f32_to_f16(float f); /* round to nearest even */

/* ---- Writing ------------------------------------------------------------ */

/* Options for sft_save; zero-initialise for the defaults. */
typedef struct {
    /* 0: pad the header so the data starts at a multiple of 8 (the default,
     * every tensor aligned). 1..7: pad so that the data starts at 8k + this
     * value, as the published GPT-2 file (data at 14,291 = 4k + 3) does; only
     * for tests and `gpt2d synth --misaligned`. */
    unsigned data_misalign;
    /* 0 (or 8): the data starts at a multiple of 8; 64: at a multiple of 64
     * (a file whose tensors the kernels read with 64-byte aligned loads,
     * `gpt2d convert --layout pairs64`); with data_misalign 0 only. */
    unsigned data_align;
} sft_save_opts;

/*
 * Writes the n tensors and the nmeta metadata entries to path atomically:
 * keys sorted byte-wise, data in name order, the header padded with spaces,
 * the same bytes for the same input. Every input is validated before the
 * file system is touched (names unique, valid UTF-8, not "__metadata__";
 * shapes not overflowing; data present). The bytes go to a temporary file
 * in the target's directory, which is fsynced, renamed over path, and the
 * directory fsynced. On any failure the temporary file is removed and an
 * existing file at path is left untouched; a process that maps the old file
 * keeps its pages. For each tensor only name, dtype, ndim, shape and data
 * are read. Borrows everything. opts may be NULL.
 */
sft_status sft_save(const char *path, const sft_tensor *tensors, size_t n, const sft_meta *meta,
                    size_t nmeta, const sft_save_opts *opts, char *err, size_t errlen);

#endif
