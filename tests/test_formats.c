/*
 * tests/test_formats.c: formats/ (safetensors reader and writer).
 *
 * Expectations come from the format specification and the seed chapter: the
 * exact bytes of its worked example, its table of malformed headers, IEEE
 * half-precision values. Allocation failures are injected through the
 * linker's --wrap (see alloc_fail_* below), so every error path of the reader
 * and writer runs under ASan/LSan.
 */
#include "safetensors.h"
#include "wformat.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

/* ---- Allocation failure injection (curl's torture idea) ----------------- */

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_aligned_alloc(size_t a, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t m);
void *__wrap_aligned_alloc(size_t a, size_t n);

static long alloc_countdown = -1; /* -1: never fail; k: fail the k-th call from now */
static long alloc_calls;

static int alloc_should_fail(void)
{
    alloc_calls++;
    if (alloc_countdown < 0) return 0;
    return alloc_countdown-- == 0;
}

void *__wrap_malloc(size_t n)
{
    return alloc_should_fail() ? NULL : __real_malloc(n);
}
void *__wrap_calloc(size_t n, size_t m)
{
    return alloc_should_fail() ? NULL : __real_calloc(n, m);
}
void *__wrap_aligned_alloc(size_t a, size_t n)
{
    return alloc_should_fail() ? NULL : __real_aligned_alloc(a, n);
}

/* ---- Fixtures ----------------------------------------------------------- */

static char tmpdir[256];

static void setup_dir(void)
{
    mkdtemp_template(tmpdir, sizeof tmpdir, "/tmp/gpt2d-test-formats-");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void teardown_dir(void)
{
    DIR *d = opendir(tmpdir);
    if (d == NULL) return;
    struct dirent *e;
    char p[512];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(p, sizeof p, "%s/%s", tmpdir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(tmpdir);
}

static const char *tpath(const char *name)
{
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
    return buf[k];
}

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *fp = fopen(path, "wb");
    ck_assert_ptr_nonnull(fp);
    ck_assert_uint_eq(fwrite(p, 1, n, fp), n);
    ck_assert_int_eq(fclose(fp), 0);
}

static unsigned char *read_bytes(const char *path, size_t *n)
{
    FILE *fp = fopen(path, "rb");
    ck_assert_ptr_nonnull(fp);
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *p = malloc((size_t)len + 1);
    ck_assert_uint_eq(fread(p, 1, (size_t)len, fp), (size_t)len);
    fclose(fp);
    p[len] = 0;
    *n = (size_t)len;
    return p;
}

/* A file with the given header text (length prefix = its length) followed by
 * ndata bytes of value fill. */
static const char *raw_file(const char *name, const char *header, size_t hlen, size_t ndata,
                            unsigned char fill)
{
    size_t n = 8 + hlen + ndata;
    unsigned char *p = malloc(n);
    uint64_t len = hlen;
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(len >> (8 * i));
    memcpy(p + 8, header, hlen);
    memset(p + 8 + hlen, fill, ndata);
    const char *path = tpath(name);
    write_bytes(path, p, n);
    free(p);
    return path;
}

static const char *header_file(const char *header, size_t ndata)
{
    return raw_file("h.safetensors", header, strlen(header), ndata, 0);
}

/* Counts the entries of tmpdir whose name contains ".tmp". */
static int temp_files_left(void)
{
    DIR *d = opendir(tmpdir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strstr(e->d_name, ".tmp") != NULL) n++;
    closedir(d);
    return n;
}

/* ---- The seed's worked example: exact bytes ----------------------------- */

static const int64_t shape_3[] = {3};
static const int64_t shape_2x2[] = {2, 2};
static const int64_t arange3[] = {0, 1, 2};
static const float ones4[] = {1, 1, 1, 1};

START_TEST(sft_save_seed_example_has_exact_bytes)
{
    /* xxd of the chapter's t.safetensors: a = arange(3) I64, b = ones(2,2) F32. */
    static const char header[] =
        "{\"a\":{\"data_offsets\":[0,24],\"dtype\":\"I64\",\"shape\":[3]},"
        "\"b\":{\"data_offsets\":[24,40],\"dtype\":\"F32\",\"shape\":[2,2]}}";
    ck_assert_uint_eq(strlen(header), 112);
    unsigned char want[160] = {0x70};
    memcpy(want + 8, header, 112);
    for (int i = 0; i < 3; i++) want[120 + 8 * i] = (unsigned char)i;
    for (int i = 0; i < 4; i++) memcpy(want + 144 + 4 * i, "\x00\x00\x80\x3f", 4);

    /* Given in the opposite order: the writer sorts by name. */
    sft_tensor t[2] = {
        {.name = "b", .dtype = SFT_F32, .ndim = 2, .shape = shape_2x2, .data = ones4},
        {.name = "a", .dtype = SFT_I64, .ndim = 1, .shape = shape_3, .data = arange3},
    };
    char err[256];
    ck_assert_int_eq(sft_save(tpath("t.safetensors"), t, 2, NULL, 0, NULL, err, sizeof err),
                     SFT_OK);
    size_t n;
    unsigned char *got = read_bytes(tpath("t.safetensors"), &n);
    ck_assert_uint_eq(n, sizeof want);
    ck_assert_mem_eq(got, want, sizeof want);
    free(got);
}
END_TEST

START_TEST(sft_save_pads_header_to_8_bytes)
{
    static const int64_t s1[] = {1};
    static const float one = 1.0f;
    char name[16] = "x";
    char err[256];
    for (int len = 1; len <= 8; len++) {
        memset(name, 'x', (size_t)len);
        name[len] = '\0';
        sft_tensor t = {.name = name, .dtype = SFT_F32, .ndim = 1, .shape = s1, .data = &one};
        const sft_meta meta[] = {{"format", "pt"}};
        ck_assert_int_eq(sft_save(tpath("p.safetensors"), &t, 1, meta, 1, NULL, err, sizeof err),
                         SFT_OK);
        size_t n;
        unsigned char *got = read_bytes(tpath("p.safetensors"), &n);
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--) hl = (hl << 8) | got[i];
        ck_assert_uint_eq((8 + hl) % 8, 0);
        ck_assert_uint_eq(n, 8 + hl + 4);
        /* The padding is spaces after the closing brace. */
        size_t last = 8 + hl - 1;
        while (got[last] == ' ') last--;
        ck_assert_int_eq(got[last], '}');
        ck_assert_ptr_nonnull(strstr((char *)got + 8, "\"__metadata__\":{\"format\":\"pt\"}"));
        free(got);
    }
}
END_TEST

START_TEST(sft_save_misaligned_starts_data_at_8k_plus_3)
{
    static const float v[2] = {1.5f, -2.0f};
    static const int64_t s2[] = {2};
    sft_tensor t = {.name = "w", .dtype = SFT_F32, .ndim = 1, .shape = s2, .data = v};
    sft_save_opts o = {.data_misalign = 3};
    char err[256];
    ck_assert_int_eq(sft_save(tpath("m.safetensors"), &t, 1, NULL, 0, &o, err, sizeof err), SFT_OK);
    sft_file *f;
    ck_assert_int_eq(sft_open(tpath("m.safetensors"), SFT_LOAD_MMAP, &f, err, sizeof err), SFT_OK);
    ck_assert_uint_eq(sft_data_start(f) % 8, 3);
    const sft_tensor *w = sft_find(f, "w");
    ck_assert_int_eq(w->mapped, 0);
    ck_assert_uint_eq((uintptr_t)w->data % 64, 0);
    ck_assert_mem_eq(w->data, v, sizeof v);
    sft_close(f);
    o.data_misalign = 8;
    ck_assert_int_eq(sft_save(tpath("m.safetensors"), &t, 1, NULL, 0, &o, err, sizeof err),
                     SFT_EINVAL);
}
END_TEST

/* data_align 64 (a pairs64 file): the data starts at a multiple of 64, for
 * any header length; anything but 8 or 64, or 64 with data_misalign, is
 * refused before the file system is touched. */
START_TEST(sft_save_data_align_64_starts_data_at_64k)
{
    static const float v[2] = {1.5f, -2.0f};
    static const int64_t s2[] = {2};
    static const char *const names[] = {"w", "ww", "a_longer_name", "x.y.z.weight"};
    char err[256];
    sft_save_opts o = {.data_align = 64};
    for (size_t i = 0; i < 4; i++) {
        sft_tensor t = {.name = names[i], .dtype = SFT_F32, .ndim = 1, .shape = s2, .data = v};
        ck_assert_int_eq(sft_save(tpath("a.safetensors"), &t, 1, NULL, 0, &o, err, sizeof err),
                         SFT_OK);
        sft_file *f;
        ck_assert_int_eq(sft_open(tpath("a.safetensors"), SFT_LOAD_MMAP, &f, err, sizeof err),
                         SFT_OK);
        ck_assert_uint_eq(sft_data_start(f) % 64, 0);
        ck_assert_mem_eq(sft_find(f, names[i])->data, v, sizeof v);
        sft_close(f);
    }
    sft_tensor t = {.name = "w", .dtype = SFT_F32, .ndim = 1, .shape = s2, .data = v};
    o.data_align = 16;
    ck_assert_int_eq(sft_save(tpath("b.safetensors"), &t, 1, NULL, 0, &o, err, sizeof err),
                     SFT_EINVAL);
    o.data_align = 64;
    o.data_misalign = 3;
    ck_assert_int_eq(sft_save(tpath("b.safetensors"), &t, 1, NULL, 0, &o, err, sizeof err),
                     SFT_EINVAL);
    ck_assert_int_eq(access(tpath("b.safetensors"), F_OK), -1);
}
END_TEST

/* ---- Round trips -------------------------------------------------------- */

START_TEST(sft_open_round_trips_every_dtype)
{
    static const int64_t s23[] = {2, 3}, s0x3[] = {0, 3}, s4[] = {4};
    static const float f32[6] = {1.5f, -2, 0, 3.25f, 1e-30f, -1e30f};
    static const double f64[4] = {1.0 / 3, -0.0, 1e300, -2.5};
    static const int64_t i64[4] = {INT64_MIN, -1, 0, INT64_MAX};
    static const unsigned char bools[4] = {0, 1, 1, 0};
    static const uint16_t f16[4] = {0x3C00, 0xC000, 0x7BFF, 0x0001};
    static const uint16_t bf16[4] = {0x3F80, 0xC040, 0x0000, 0x7F80};
    static const int32_t i32[4] = {INT32_MIN, -7, 7, INT32_MAX};
    static const int16_t i16[4] = {INT16_MIN, -3, 3, INT16_MAX};
    static const int8_t i8[4] = {-128, -1, 1, 127};
    static const uint8_t u8[4] = {0, 1, 128, 255};
    static const float scalar = 42.0f;
    sft_tensor in[] = {
        {.name = "f32", .dtype = SFT_F32, .ndim = 2, .shape = s23, .data = f32},
        {.name = "f64", .dtype = SFT_F64, .ndim = 1, .shape = s4, .data = f64},
        {.name = "i64", .dtype = SFT_I64, .ndim = 1, .shape = s4, .data = i64},
        {.name = "bool", .dtype = SFT_BOOL, .ndim = 1, .shape = s4, .data = bools},
        {.name = "f16", .dtype = SFT_F16, .ndim = 1, .shape = s4, .data = f16},
        {.name = "bf16", .dtype = SFT_BF16, .ndim = 1, .shape = s4, .data = bf16},
        {.name = "i32", .dtype = SFT_I32, .ndim = 1, .shape = s4, .data = i32},
        {.name = "i16", .dtype = SFT_I16, .ndim = 1, .shape = s4, .data = i16},
        {.name = "i8", .dtype = SFT_I8, .ndim = 1, .shape = s4, .data = i8},
        {.name = "u8", .dtype = SFT_U8, .ndim = 1, .shape = s4, .data = u8},
        {.name = "scalar", .dtype = SFT_F32, .ndim = 0, .shape = NULL, .data = &scalar},
        {.name = "empty", .dtype = SFT_F32, .ndim = 2, .shape = s0x3, .data = NULL},
        {.name = "日本語 name", .dtype = SFT_U8, .ndim = 1, .shape = s4, .data = u8},
    };
    size_t nin = sizeof in / sizeof in[0];
    const sft_meta meta[] = {{"format", "pt"}, {"note", "ünïcödé"}, {"empty", ""}};
    char err[256];
    ck_assert_int_eq(sft_save(tpath("all.safetensors"), in, nin, meta, 3, NULL, err, sizeof err),
                     SFT_OK);
    for (int mode = 0; mode < 2; mode++) {
        sft_file *f = NULL;
        ck_assert_msg(sft_open(tpath("all.safetensors"), (sft_load_mode)mode, &f, err, sizeof err)
                          == SFT_OK,
                      "%s", err);
        ck_assert_uint_eq(sft_count(f), nin);
        for (size_t i = 0; i < nin; i++) {
            const sft_tensor *t = sft_find(f, in[i].name);
            ck_assert_msg(t != NULL, "missing %s", in[i].name);
            ck_assert_int_eq(t->dtype, in[i].dtype);
            ck_assert_uint_eq(t->ndim, in[i].ndim);
            size_t numel = 1;
            for (size_t d = 0; d < t->ndim; d++) {
                ck_assert_int_eq(t->shape[d], in[i].shape[d]);
                numel *= (size_t)in[i].shape[d];
            }
            ck_assert_uint_eq(t->nbytes, numel * sft_dtype_size(in[i].dtype));
            ck_assert_uint_eq(sft_tensor_numel(t), numel);
            if (t->nbytes)
                ck_assert_mem_eq(t->data, in[i].data, t->nbytes);
            else
                ck_assert_ptr_null(t->data);
        }
        size_t nm;
        const sft_meta *m = sft_metadata(f, &nm);
        ck_assert_uint_eq(nm, 3);
        ck_assert_str_eq(m[0].key, "empty"); /* key order */
        ck_assert_str_eq(sft_metadata_get(f, "note"), "ünïcödé");
        ck_assert_str_eq(sft_metadata_get(f, "format"), "pt");
        ck_assert_ptr_null(sft_metadata_get(f, "missing"));
        ck_assert_ptr_null(sft_find(f, "missing"));
        /* Name order. */
        for (size_t i = 1; i < sft_count(f); i++)
            ck_assert_int_lt(strcmp(sft_tensor_at(f, i - 1)->name, sft_tensor_at(f, i)->name), 0);
        sft_close(f);
    }
}
END_TEST

START_TEST(sft_save_is_deterministic)
{
    static const float v[3] = {1, 2, 3};
    sft_tensor t[2] = {{.name = "x", .dtype = SFT_F32, .ndim = 1, .shape = shape_3, .data = v},
                       {.name = "y", .dtype = SFT_F32, .ndim = 1, .shape = shape_3, .data = v}};
    sft_tensor r[2] = {t[1], t[0]};
    const sft_meta m1[] = {{"b", "2"}, {"a", "1"}}, m2[] = {{"a", "1"}, {"b", "2"}};
    char err[256];
    ck_assert_int_eq(sft_save(tpath("d1"), t, 2, m1, 2, NULL, err, sizeof err), SFT_OK);
    ck_assert_int_eq(sft_save(tpath("d2"), r, 2, m2, 2, NULL, err, sizeof err), SFT_OK);
    size_t n1, n2;
    unsigned char *a = read_bytes(tpath("d1"), &n1), *b = read_bytes(tpath("d2"), &n2);
    ck_assert_uint_eq(n1, n2);
    ck_assert_mem_eq(a, b, n1);
    free(a);
    free(b);
}
END_TEST

START_TEST(sft_open_accepts_header_padding)
{
    const char *h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}      ";
    sft_file *f;
    char err[256];
    ck_assert_int_eq(sft_open(header_file(h, 16), SFT_LOAD_COPY, &f, err, sizeof err), SFT_OK);
    ck_assert_uint_eq(sft_count(f), 1);
    sft_close(f);
}
END_TEST

/* ---- Malformed files ---------------------------------------------------- */

typedef struct {
    const char *what;
    const char *header; /* followed by 16 data bytes */
    sft_status status;
    const char *words; /* expected in the message */
} bad_header;

#define E(x) "{\"a\":" x "}"
#define T(d, s, o) "{\"dtype\":" d ",\"shape\":" s ",\"data_offsets\":" o "}"
static const bad_header bad_headers[] = {
    /* The seed chapter's BadHeader cases. */
    {"not JSON", "nope", SFT_EFORMAT, "start with '{'"},
    {"broken JSON", "{\"a\":", SFT_EFORMAT, "not valid JSON"},
    {"JSON array", "[1,2]", SFT_EFORMAT, "start with '{'"},
    {"missing dtype", E("{\"shape\":[4],\"data_offsets\":[0,16]}"), SFT_EFORMAT, "missing dtype"},
    {"missing shape", E("{\"dtype\":\"F32\",\"data_offsets\":[0,16]}"), SFT_EFORMAT,
     "missing shape"},
    {"missing offsets", E("{\"dtype\":\"F32\",\"shape\":[4]}"), SFT_EFORMAT,
     "missing data_offsets"},
    {"numeric dtype", E(T("1", "[4]", "[0,16]")), SFT_EFORMAT, "dtype is not a string"},
    {"null dtype", E(T("null", "[4]", "[0,16]")), SFT_EFORMAT, "dtype is not a string"},
    {"negative dimension", E(T("\"F32\"", "[-4]", "[0,16]")), SFT_EFORMAT, "shape[0]"},
    {"fractional dimension", E(T("\"F32\"", "[4.0]", "[0,16]")), SFT_EFORMAT, "shape[0]"},
    {"string dimension", E(T("\"F32\"", "[\"4\"]", "[0,16]")), SFT_EFORMAT, "shape[0]"},
    {"shape not an array", E(T("\"F32\"", "4", "[0,16]")), SFT_EFORMAT, "shape is not an array"},
    {"one offset", E(T("\"F32\"", "[4]", "[16]")), SFT_EFORMAT, "has 1 elements, not 2"},
    {"three offsets", E(T("\"F32\"", "[4]", "[0,8,16]")), SFT_EFORMAT, "has 3 elements"},
    {"offsets not an array", E(T("\"F32\"", "[4]", "16")), SFT_EFORMAT,
     "data_offsets is not an array"},
    {"negative offset", E(T("\"F32\"", "[4]", "[-16,0]")), SFT_EFORMAT, "non-negative"},
    {"float offsets", E(T("\"F32\"", "[4]", "[0.0,16.0]")), SFT_EFORMAT, "non-negative"},
    {"reversed offsets", E(T("\"F32\"", "[4]", "[16,0]")), SFT_EFORMAT, "end before"},
    {"size mismatch", E(T("\"F32\"", "[3]", "[0,16]")), SFT_EFORMAT, "needs 12"},
    {"gap at the start", E(T("\"F32\"", "[3]", "[4,16]")), SFT_EFORMAT, "a gap"},
    {"gap in the middle",
     "{\"a\":" T("\"F32\"", "[1]", "[0,4]") ",\"b\":" T("\"F32\"", "[2]", "[8,16]") "}",
     SFT_EFORMAT, "a gap"},
    {"overlap",
     "{\"a\":" T("\"F32\"", "[2]", "[0,8]") ",\"b\":" T("\"F32\"", "[2]", "[4,12]") ",\"c\":" T(
         "\"F32\"", "[1]", "[12,16]") "}",
     SFT_EFORMAT, "an overlap"},
    {"shape count overflows",
     E(T("\"F32\"", "[9223372036854775807,9223372036854775807]", "[0,16]")), SFT_EFORMAT,
     "overflows"},
    {"end offset 2^64-1", E(T("\"U8\"", "[16]", "[0,18446744073709551615]")), SFT_EFORMAT,
     "not valid JSON"},
    {"metadata not an object",
     "{\"__metadata__\":\"x\","
     "\"a\":" T("\"U8\"", "[16]", "[0,16]") "}",
     SFT_EFORMAT, "__metadata__ is not"},
    {"metadata value a number",
     "{\"__metadata__\":{\"k\":1},"
     "\"a\":" T("\"U8\"", "[16]", "[0,16]") "}",
     SFT_EFORMAT, "value of 'k'"},
    {"metadata nested",
     "{\"__metadata__\":{\"k\":{}},"
     "\"a\":" T("\"U8\"", "[16]", "[0,16]") "}",
     SFT_EFORMAT, "value of 'k'"},
    {"entry not an object", "{\"a\":5}", SFT_EFORMAT, "entry is not a JSON object"},
    /* gpt2d's additions. */
    {"unknown dtype", E(T("\"F8_E4M3\"", "[16]", "[0,16]")), SFT_ETYPE, "'F8_E4M3'"},
    {"lowercase dtype", E(T("\"f32\"", "[4]", "[0,16]")), SFT_ETYPE, "'f32'"},
    {"duplicate names",
     "{\"a\":" T("\"U8\"", "[8]", "[0,8]") ",\"a\":" T("\"U8\"", "[8]", "[8,16]") "}", SFT_EFORMAT,
     "duplicate"},
    {"trailing bytes", E(T("\"F32\"", "[3]", "[0,12]")), SFT_EFORMAT, "trailing"},
    {"end past the data", E(T("\"F32\"", "[8]", "[0,32]")), SFT_EFORMAT, "past the data"},
    {"end offset INT64_MAX", E(T("\"U8\"", "[9223372036854775807]", "[0,9223372036854775807]")),
     SFT_EFORMAT, "past the data"},
    {"NUL in a name", "{\"a\\u0000b\":" T("\"U8\"", "[16]", "[0,16]") "}", SFT_EFORMAT,
     "not valid JSON"},
    {"invalid UTF-8 name", "{\"a\xff\":" T("\"U8\"", "[16]", "[0,16]") "}", SFT_EFORMAT, "UTF-8"},
    {"overlong UTF-8", "{\"\xc0\xaf\":" T("\"U8\"", "[16]", "[0,16]") "}", SFT_EFORMAT, "UTF-8"},
    {"UTF-8 surrogate", "{\"\xed\xa0\x80\":" T("\"U8\"", "[16]", "[0,16]") "}", SFT_EFORMAT,
     "UTF-8"},
    {"empty header", "", SFT_EFORMAT, "start with '{'"},
    {"leading space", " {}", SFT_EFORMAT, "start with '{'"},
    {"no tensors but data", "{}", SFT_EFORMAT, "trailing"},
    {"text after the object", "{} x", SFT_EFORMAT, "not valid JSON"},
    /* jansson quotes the bad token: a raw newline and tab in it must not
     * reach the one-line message (found by fuzz_safetensors in CI). */
    {"raw newline in an escape", "{\"a\\\n\t\":" T("\"U8\"", "[16]", "[0,16]") "}", SFT_EFORMAT,
     "not valid JSON"},
};
#undef E
#undef T

START_TEST(sft_open_bad_header_is_rejected)
{
    const bad_header *b = &bad_headers[_i];
    for (int mode = 0; mode < 2; mode++) {
        sft_file *f = (sft_file *)1;
        char err[512];
        sft_status s =
            sft_open(header_file(b->header, 16), (sft_load_mode)mode, &f, err, sizeof err);
        ck_assert_msg(s == b->status, "%s: status %d, want %d (%s)", b->what, s, b->status, err);
        ck_assert_ptr_null(f);
        ck_assert_msg(strstr(err, b->words) != NULL, "%s: message '%s' lacks '%s'", b->what, err,
                      b->words);
        ck_assert_msg(strstr(err, tmpdir) != NULL, "%s: message '%s' lacks the path", b->what, err);
        for (const char *c = err; *c != '\0'; c++)
            ck_assert_msg((unsigned char)*c >= 0x20 && *c != 0x7f, "%s: control byte in '%s'",
                          b->what, err);
    }
}
END_TEST

START_TEST(sft_open_nesting_bomb_is_eformat)
{
    size_t depth = 100000;
    char *h = malloc(depth * 2 + 16);
    size_t n = 0;
    memcpy(h, "{\"a\":", 5);
    n += 5;
    for (size_t i = 0; i < depth; i++) h[n++] = '[';
    for (size_t i = 0; i < depth; i++) h[n++] = ']';
    h[n++] = '}';
    sft_file *f;
    char err[512];
    ck_assert_int_eq(sft_open(raw_file("bomb", h, n, 0, 0), SFT_LOAD_COPY, &f, err, sizeof err),
                     SFT_EFORMAT);
    ck_assert_ptr_nonnull(strstr(err, "not valid JSON"));
    free(h);
}
END_TEST

static const char *file_with_len(uint64_t len, size_t total)
{
    unsigned char *p = calloc(1, total);
    for (int i = 0; i < 8 && (size_t)i < total; i++) p[i] = (unsigned char)(len >> (8 * i));
    const char *path = tpath("len.safetensors");
    write_bytes(path, p, total);
    free(p);
    return path;
}

START_TEST(sft_open_framing_errors)
{
    sft_file *f;
    char err[512];
    ck_assert_int_eq(sft_open(tpath("missing"), SFT_LOAD_COPY, &f, err, sizeof err), SFT_EIO);
    ck_assert_ptr_nonnull(strstr(err, "No such file"));
    ck_assert_int_eq(sft_open(tmpdir, SFT_LOAD_COPY, &f, err, sizeof err), SFT_EIO);
    ck_assert_ptr_nonnull(strstr(err, "not a regular file"));
    ck_assert_int_eq(sft_open(file_with_len(0, 7), SFT_LOAD_COPY, &f, err, sizeof err),
                     SFT_EFORMAT);
    ck_assert_ptr_nonnull(strstr(err, "too short"));
    ck_assert_int_eq(sft_open(file_with_len(0, 0), SFT_LOAD_MMAP, &f, err, sizeof err),
                     SFT_EFORMAT);
    /* N = 100,000,001: over the cap whatever the file size. */
    ck_assert_int_eq(sft_open(file_with_len(100000001, 64), SFT_LOAD_COPY, &f, err, sizeof err),
                     SFT_ETOOBIG);
    ck_assert_ptr_nonnull(strstr(err, "100000001"));
    /* N = 2^64 - 1 must not wrap into "fits". */
    ck_assert_int_eq(sft_open(file_with_len(UINT64_MAX, 64), SFT_LOAD_COPY, &f, err, sizeof err),
                     SFT_ETOOBIG);
    /* A header claiming more than the file holds. */
    ck_assert_int_eq(sft_open(file_with_len(57, 64), SFT_LOAD_COPY, &f, err, sizeof err),
                     SFT_EFORMAT);
    ck_assert_ptr_nonnull(strstr(err, "does not fit"));
    ck_assert_int_eq(sft_open(file_with_len(56, 64), SFT_LOAD_COPY, &f, err, sizeof err),
                     SFT_EFORMAT); /* fits, but 56 NUL bytes are not JSON */
    ck_assert_ptr_null(f);
    ck_assert_int_eq(sft_open(tpath("x"), (sft_load_mode)7, &f, err, sizeof err), SFT_EINVAL);
}
END_TEST

START_TEST(sft_open_bool_bytes_must_be_0_or_1)
{
    const char *h = "{\"b\":{\"dtype\":\"BOOL\",\"shape\":[16],\"data_offsets\":[0,16]}}";
    for (int mode = 0; mode < 2; mode++) {
        sft_file *f;
        char err[512];
        const char *p = raw_file("bool", h, strlen(h), 16, 1);
        ck_assert_int_eq(sft_open(p, (sft_load_mode)mode, &f, err, sizeof err), SFT_OK);
        sft_close(f);
        p = raw_file("bool", h, strlen(h), 16, 2);
        ck_assert_int_eq(sft_open(p, (sft_load_mode)mode, &f, err, sizeof err), SFT_EFORMAT);
        ck_assert_ptr_nonnull(strstr(err, "tensor 'b': BOOL element 0 is 2"));
    }
}
END_TEST

/* ---- Mapped loading ----------------------------------------------------- */

/* Three F32 tensors of 1000 values each, aligned or starting at 8k+3. */
static const char *three_tensors(const char *name, unsigned misalign, float *vals)
{
    static const int64_t s1000[] = {1000};
    for (int i = 0; i < 3000; i++) vals[i] = (float)i * 0.5f - 7.0f;
    sft_tensor t[3] = {
        {.name = "a", .dtype = SFT_F32, .ndim = 1, .shape = s1000, .data = vals},
        {.name = "b", .dtype = SFT_F32, .ndim = 1, .shape = s1000, .data = vals + 1000},
        {.name = "c", .dtype = SFT_F32, .ndim = 1, .shape = s1000, .data = vals + 2000}};
    sft_save_opts o = {.data_misalign = misalign};
    char err[256];
    ck_assert_int_eq(sft_save(tpath(name), t, 3, NULL, 0, &o, err, sizeof err), SFT_OK);
    return tpath(name);
}

START_TEST(sft_open_mapped_equals_copied)
{
    static float vals[3000];
    for (unsigned mis = 0; mis < 8; mis += 3) {
        const char *p = three_tensors("eq.safetensors", mis, vals);
        sft_file *a, *b;
        char err[256];
        ck_assert_int_eq(sft_open(p, SFT_LOAD_COPY, &a, err, sizeof err), SFT_OK);
        ck_assert_int_eq(sft_open(p, SFT_LOAD_MMAP, &b, err, sizeof err), SFT_OK);
        ck_assert_uint_eq(sft_count(a), sft_count(b));
        for (size_t i = 0; i < sft_count(a); i++) {
            const sft_tensor *x = sft_tensor_at(a, i), *y = sft_tensor_at(b, i);
            ck_assert_str_eq(x->name, y->name);
            ck_assert_uint_eq(x->nbytes, y->nbytes);
            ck_assert_mem_eq(x->data, y->data, x->nbytes);
            ck_assert_mem_eq(x->data, vals + 1000 * i, x->nbytes);
            ck_assert_int_eq(x->mapped, 0);
        }
        sft_close(a);
        sft_close(b);
    }
}
END_TEST

START_TEST(sft_open_aligned_tensors_share_the_mapping)
{
    static float vals[3000];
    const char *p = three_tensors("al.safetensors", 0, vals);
    sft_file *f;
    char err[256];
    ck_assert_int_eq(sft_open(p, SFT_LOAD_MMAP, &f, err, sizeof err), SFT_OK);
    const sft_tensor *a = sft_find(f, "a"), *b = sft_find(f, "b"), *c = sft_find(f, "c");
    ck_assert(a->mapped && b->mapped && c->mapped);
    ck_assert_uint_eq(sft_copied_bytes(f), 0);
    /* One mapping: the pointers are exactly the data offsets apart. */
    ck_assert_int_eq((const char *)b->data - (const char *)a->data, (long)(b->begin - a->begin));
    ck_assert_int_eq((const char *)c->data - (const char *)a->data, (long)(c->begin - a->begin));
    ck_assert_uint_eq((uintptr_t)a->data % 4, 0);
    sft_close(f);
}
END_TEST

/* The Rss in kB of this process's mapping that holds addr (/proc/self/smaps),
 * or -1 if no mapping holds it. */
static long mapping_rss_kb(const void *addr)
{
    FILE *fp = fopen("/proc/self/smaps", "r");
    ck_assert_ptr_nonnull(fp);
    char line[512];
    int in = 0;
    long rss = -1;
    uintptr_t a = (uintptr_t)addr;
    while (rss < 0 && fgets(line, sizeof line, fp) != NULL) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, ':') > strchr(line, ' '))
            in = a >= lo && a < hi;
        else if (in && strncmp(line, "Rss:", 4) == 0)
            rss = strtol(line + 4, NULL, 10);
    }
    fclose(fp);
    return rss;
}

/* SFT_LOAD_MMAP maps the file lazily: opening it maps no page of the data
 * (`gpt2d inspect` and `convert` read headers and single tensors, and a
 * server's processes share only the pages their steps read: a populated
 * mapping put every page of every tensor, used or not, in each one's Pss;
 * tests/test_shared_weights.sh). */
START_TEST(sft_open_mmap_maps_no_data_page)
{
    enum { NF = 1 << 20 }; /* 4 MiB of F32 */
    char header[128];
    int hl =
        snprintf(header, sizeof header,
                 "{\"a\":{\"dtype\":\"F32\",\"shape\":[%d],\"data_offsets\":[0,%d]}}", NF, NF * 4);
    while ((8 + hl) % 64 != 0) header[hl++] = ' ';
    const char *p = raw_file("lazy.safetensors", header, (size_t)hl, (size_t)NF * 4, 1);
    sft_file *f;
    char err[256];
    ck_assert_int_eq(sft_open(p, SFT_LOAD_MMAP, &f, err, sizeof err), SFT_OK);
    const sft_tensor *a = sft_find(f, "a");
    ck_assert(a != NULL && a->mapped);
    long rss = mapping_rss_kb(a->data);
    ck_assert_msg(rss >= 0 && rss < 1024, "the 4 MiB mapping holds %ld kB after sft_open", rss);
    /* Reading the tensor maps it. */
    unsigned sum = 0;
    for (size_t i = 0; i < a->nbytes; i += 4096) sum += ((const unsigned char *)a->data)[i];
    ck_assert_uint_eq(sum, (unsigned)(a->nbytes / 4096));
    ck_assert_int_ge(mapping_rss_kb(a->data), 4096);
    sft_close(f);
}
END_TEST

START_TEST(sft_open_misaligned_tensors_are_copied_aligned)
{
    static float vals[3000];
    const char *p = three_tensors("mis.safetensors", 3, vals);
    sft_file *f;
    char err[256];
    ck_assert_int_eq(sft_open(p, SFT_LOAD_MMAP, &f, err, sizeof err), SFT_OK);
    ck_assert_uint_eq(sft_data_start(f) % 4, 3);
    for (size_t i = 0; i < 3; i++) {
        const sft_tensor *t = sft_tensor_at(f, i);
        ck_assert_int_eq(t->mapped, 0);
        ck_assert_uint_eq((uintptr_t)t->data % 64, 0);
        ck_assert_mem_eq(t->data, vals + 1000 * i, t->nbytes);
    }
    ck_assert_uint_ge(sft_copied_bytes(f), 3 * 4000);
    sft_close(f);
}
END_TEST

START_TEST(sft_data_ref_outlives_the_file_and_its_path)
{
    static float vals[3000];
    for (int mode = 0; mode < 2; mode++) {
        const char *p = three_tensors("life.safetensors", 0, vals);
        sft_file *f;
        char err[256];
        ck_assert_int_eq(sft_open(p, (sft_load_mode)mode, &f, err, sizeof err), SFT_OK);
        const float *c = sft_find(f, "c")->data;
        sft_data *d = sft_data_ref(f);
        ck_assert_ptr_nonnull(d);
        sft_close(f);
        ck_assert_int_eq(unlink(p), 0);
        for (int i = 0; i < 1000; i++) ck_assert_float_eq(c[i], vals[2000 + i]);
        sft_data_unref(d);
    }
    sft_data_unref(NULL);
    sft_close(NULL);
}
END_TEST

START_TEST(sft_save_over_a_mapped_file_keeps_the_old_mapping)
{
    static float vals[3000];
    const char *p = three_tensors("over.safetensors", 0, vals);
    sft_file *f;
    char err[256];
    ck_assert_int_eq(sft_open(p, SFT_LOAD_MMAP, &f, err, sizeof err), SFT_OK);
    const float *a = sft_find(f, "a")->data;
    ck_assert_int_eq(sft_find(f, "a")->mapped, 1);
    static const float other[2] = {9, 9};
    static const int64_t s2[] = {2};
    sft_tensor t = {.name = "a", .dtype = SFT_F32, .ndim = 1, .shape = s2, .data = other};
    ck_assert_int_eq(sft_save(p, &t, 1, NULL, 0, NULL, err, sizeof err), SFT_OK);
    for (int i = 0; i < 1000; i++) ck_assert_float_eq(a[i], vals[i]);
    sft_close(f);
    ck_assert_int_eq(sft_open(p, SFT_LOAD_MMAP, &f, err, sizeof err), SFT_OK);
    ck_assert_uint_eq(sft_count(f), 1);
    ck_assert_float_eq(((const float *)sft_find(f, "a")->data)[1], 9.0f);
    sft_close(f);
    ck_assert_int_eq(temp_files_left(), 0);
}
END_TEST

START_TEST(sft_open_mapped_weights_are_read_only)
{
    static float vals[3000];
    const char *p = three_tensors("ro.safetensors", 0, vals);
    sft_file *f;
    char err[256];
    ck_assert_int_eq(sft_open(p, SFT_LOAD_MMAP, &f, err, sizeof err), SFT_OK);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL);
        *(volatile float *)sft_find(f, "a")->data = 1.0f; /* must fault */
        _exit(0);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV,
                  "a write to a mapped tensor did not fault (status %d)", status);
    sft_close(f);
}
END_TEST

/* ---- Atomic save failures ----------------------------------------------- */

static void assert_untouched(const char *p, const unsigned char *old, size_t n)
{
    size_t m;
    unsigned char *now = read_bytes(p, &m);
    ck_assert_uint_eq(m, n);
    ck_assert_mem_eq(now, old, n);
    free(now);
    ck_assert_int_eq(temp_files_left(), 0);
}

START_TEST(sft_save_rejected_input_leaves_the_target_untouched)
{
    static float vals[3000];
    const char *p = three_tensors("keep.safetensors", 0, vals);
    size_t n;
    unsigned char *old = read_bytes(p, &n);
    static const float v[3] = {1, 2, 3};
    char err[256];
    sft_tensor t = {
        .name = "__metadata__", .dtype = SFT_F32, .ndim = 1, .shape = shape_3, .data = v};
    ck_assert_int_eq(sft_save(p, &t, 1, NULL, 0, NULL, err, sizeof err), SFT_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "__metadata__"));
    assert_untouched(p, old, n);

    t.name = "bad\xff";
    ck_assert_int_eq(sft_save(p, &t, 1, NULL, 0, NULL, err, sizeof err), SFT_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "UTF-8"));
    assert_untouched(p, old, n);

    sft_tensor two[2] = {t, t};
    two[0].name = two[1].name = "same";
    ck_assert_int_eq(sft_save(p, two, 2, NULL, 0, NULL, err, sizeof err), SFT_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "duplicate tensor name 'same'"));
    assert_untouched(p, old, n);

    t.name = "ok";
    const sft_meta badmeta[] = {{"k", "\xc3"}};
    ck_assert_int_eq(sft_save(p, &t, 1, badmeta, 1, NULL, err, sizeof err), SFT_EINVAL);
    const sft_meta dupmeta[] = {{"k", "1"}, {"k", "2"}};
    ck_assert_int_eq(sft_save(p, &t, 1, dupmeta, 2, NULL, err, sizeof err), SFT_EINVAL);
    t.data = NULL;
    ck_assert_int_eq(sft_save(p, &t, 1, NULL, 0, NULL, err, sizeof err), SFT_EINVAL);
    static const int64_t huge[] = {INT64_MAX, 4};
    t.shape = huge;
    t.ndim = 2;
    t.data = v;
    ck_assert_int_eq(sft_save(p, &t, 1, NULL, 0, NULL, err, sizeof err), SFT_ETOOBIG);
    t.dtype = (sft_dtype)99;
    ck_assert_int_eq(sft_save(p, &t, 1, NULL, 0, NULL, err, sizeof err), SFT_ETYPE);
    assert_untouched(p, old, n);
    free(old);
}
END_TEST

START_TEST(sft_save_write_failure_midway_leaves_the_target_untouched)
{
    /* A real failure after the temporary file is partly written: the file
     * size limit makes write() fail with EFBIG once 64 KiB are on disk. */
    static float vals[3000];
    const char *p = three_tensors("fsize.safetensors", 0, vals);
    size_t n;
    unsigned char *old = read_bytes(p, &n);
    size_t count = 1 << 16;
    float *big = calloc(count, sizeof *big);
    int64_t shape[] = {(int64_t)count};
    sft_tensor t = {.name = "big", .dtype = SFT_F32, .ndim = 1, .shape = shape, .data = big};

    struct rlimit saved, lim;
    ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &saved), 0);
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    lim = saved;
    lim.rlim_cur = 64 * 1024;
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    char err[256];
    sft_status s = sft_save(p, &t, 1, NULL, 0, NULL, err, sizeof err);
    setrlimit(RLIMIT_FSIZE, &saved);
    signal(SIGXFSZ, prev);

    ck_assert_int_eq(s, SFT_EIO);
    ck_assert_msg(strstr(err, "File too large") != NULL, "%s", err);
    assert_untouched(p, old, n);
    free(big);
    free(old);
}
END_TEST

START_TEST(sft_save_into_a_missing_directory_is_eio)
{
    static const float v[3] = {1, 2, 3};
    sft_tensor t = {.name = "x", .dtype = SFT_F32, .ndim = 1, .shape = shape_3, .data = v};
    char err[256];
    ck_assert_int_eq(sft_save(tpath("nodir/x.safetensors"), &t, 1, NULL, 0, NULL, err, sizeof err),
                     SFT_EIO);
    ck_assert_ptr_nonnull(strstr(err, "cannot create"));
    ck_assert_int_eq(sft_save(NULL, &t, 1, NULL, 0, NULL, err, sizeof err), SFT_EINVAL);
}
END_TEST

/* ---- Allocation failures ------------------------------------------------- */

START_TEST(sft_open_and_save_survive_every_allocation_failure)
{
    static float vals[3000];
    const char *p = three_tensors("oom.safetensors", (unsigned)(3 * _i), vals);
    const char *q = tpath("oom-out.safetensors");
    char err[256];
    for (int mode = 0; mode < 2; mode++) {
        int saw_enomem = 0;
        for (long k = 0;; k++) {
            sft_file *f = NULL;
            alloc_countdown = k;
            sft_status s = sft_open(p, (sft_load_mode)mode, &f, err, sizeof err);
            int fired = alloc_countdown < 0;
            alloc_countdown = -1;
            if (!fired) {
                ck_assert_int_eq(s, SFT_OK);
                sft_close(f);
                break;
            }
            ck_assert_msg(s == SFT_ENOMEM, "k=%ld: status %d (%s)", k, s, err);
            ck_assert_ptr_null(f);
            saw_enomem = 1;
        }
        ck_assert(saw_enomem);
    }
    sft_file *f;
    ck_assert_int_eq(sft_open(p, SFT_LOAD_COPY, &f, err, sizeof err), SFT_OK);
    for (long k = 0;; k++) {
        sft_tensor t[3];
        for (size_t i = 0; i < 3; i++) t[i] = *sft_tensor_at(f, i);
        alloc_countdown = k;
        sft_status s = sft_save(q, t, 3, NULL, 0, NULL, err, sizeof err);
        int fired = alloc_countdown < 0;
        alloc_countdown = -1;
        if (!fired) {
            ck_assert_int_eq(s, SFT_OK);
            break;
        }
        ck_assert_msg(s == SFT_ENOMEM, "k=%ld: status %d (%s)", k, s, err);
        ck_assert_int_eq(temp_files_left(), 0);
    }
    sft_close(f);
}
END_TEST

/* ---- Conversions --------------------------------------------------------- */

START_TEST(sft_f16_to_f32_known_values)
{
    ck_assert_float_eq(sft_f16_to_f32(0x3C00), 1.0f);
    ck_assert_float_eq(sft_f16_to_f32(0xC000), -2.0f);
    ck_assert_float_eq(sft_f16_to_f32(0x7BFF), 65504.0f);
    ck_assert_float_eq(sft_f16_to_f32(0x0001), ldexpf(1.0f, -24)); /* smallest subnormal */
    ck_assert_float_eq(sft_f16_to_f32(0x03FF), ldexpf(1023.0f, -24));
    ck_assert_float_eq(sft_f16_to_f32(0x0400), ldexpf(1.0f, -14)); /* smallest normal */
    ck_assert_float_eq(sft_f16_to_f32(0x3555), 0.333251953125f);
    ck_assert(isinf(sft_f16_to_f32(0x7C00)) && sft_f16_to_f32(0x7C00) > 0);
    ck_assert(isinf(sft_f16_to_f32(0xFC00)) && sft_f16_to_f32(0xFC00) < 0);
    ck_assert(isnan(sft_f16_to_f32(0x7E00)));
    ck_assert(signbit(sft_f16_to_f32(0x8000)) && sft_f16_to_f32(0x8000) == 0.0f);
    ck_assert_float_eq(sft_bf16_to_f32(0x3F80), 1.0f);
    ck_assert_float_eq(sft_bf16_to_f32(0xC040), -3.0f);
    /* f32 -> f16 -> f32 is the identity on every finite half. */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF)) continue; /* NaN payloads */
        ck_assert_uint_eq(sft_f32_to_f16(sft_f16_to_f32((uint16_t)h)), h);
    }
    ck_assert_uint_eq(sft_f32_to_f16(1e10f), 0x7C00);          /* overflow to inf */
    ck_assert_uint_eq(sft_f32_to_f16(1.00048828125f), 0x3C00); /* tie to even */
}
END_TEST

START_TEST(sft_tensor_to_f32_converts_half_types)
{
    static const uint16_t h[4] = {0x3C00, 0xC000, 0x3800, 0x0000};
    static const uint16_t b[4] = {0x3F80, 0xC000, 0x3F00, 0x8000};
    static const double d[4] = {1.0, -2.0, 0.5, 0.0};
    static const int64_t s4[] = {4};
    const float want[4] = {1.0f, -2.0f, 0.5f, 0.0f};
    float out[4];
    char err[256];
    sft_tensor t = {.name = "h", .dtype = SFT_F16, .ndim = 1, .shape = s4, .data = h, .nbytes = 8};
    ck_assert_int_eq(sft_tensor_to_f32(&t, out, 4, err, sizeof err), SFT_OK);
    ck_assert_mem_eq(out, want, sizeof want);
    t.dtype = SFT_BF16;
    t.data = b;
    ck_assert_int_eq(sft_tensor_to_f32(&t, out, 4, err, sizeof err), SFT_OK);
    for (int i = 0; i < 4; i++) ck_assert_float_eq(out[i], want[i]);
    t.dtype = SFT_F64;
    t.data = d;
    t.nbytes = 32;
    ck_assert_int_eq(sft_tensor_to_f32(&t, out, 4, err, sizeof err), SFT_OK);
    ck_assert_mem_eq(out, want, sizeof want);
    ck_assert_int_eq(sft_tensor_to_f32(&t, out, 3, err, sizeof err), SFT_EINVAL);
    t.dtype = SFT_I64;
    ck_assert_int_eq(sft_tensor_to_f32(&t, out, 4, err, sizeof err), SFT_ETYPE);
    ck_assert_ptr_nonnull(strstr(err, "I64"));
}
END_TEST

START_TEST(sft_dtype_names_round_trip)
{
    for (int i = 0; i < SFT_DTYPE_COUNT; i++) {
        sft_dtype d;
        ck_assert_int_eq(sft_dtype_parse(sft_dtype_name((sft_dtype)i), &d), SFT_OK);
        ck_assert_int_eq(d, i);
        ck_assert_uint_gt(sft_dtype_size(d), 0);
    }
    sft_dtype d;
    ck_assert_int_eq(sft_dtype_parse("U16", &d), SFT_ETYPE);
    ck_assert_str_eq(sft_dtype_name((sft_dtype)99), "?");
    ck_assert_uint_eq(sft_dtype_size((sft_dtype)99), 0);
    for (int s = 0; s <= SFT_EINVAL; s++)
        ck_assert_str_ne(sft_strerror((sft_status)s), "unknown status");
}
END_TEST

/* ---- wf_detect: the weight formats ---------------------------------------- */

/* A file of the given tensors and metadata; wf_detect's verdict on it:
 * the format name, or the error text (SFT_EFORMAT). */
static const char *detect(const sft_tensor *t, size_t n, const sft_meta *meta, size_t nmeta,
                          char *err, size_t errlen)
{
    const char *p = tpath("wf.safetensors");
    ck_assert_int_eq(sft_save(p, t, n, meta, nmeta, NULL, err, errlen), SFT_OK);
    sft_file *f;
    ck_assert_int_eq(sft_open(p, SFT_LOAD_COPY, &f, err, errlen), SFT_OK);
    const char *name = NULL;
    sft_status s = wf_detect(f, &name, err, errlen);
    sft_close(f);
    return s == SFT_OK ? name : NULL;
}

static const int64_t shape_64x32[] = {64, 32}, shape_2x32[] = {2, 32}, shape_64x1[] = {64, 1};
static const int64_t shape_64x40[] = {64, 40}, shape_4[] = {4};
static float wf_f32[64 * 40];
static int8_t wf_i8[64 * 40];
static uint16_t wf_u16[64 * 40];

START_TEST(wf_detect_names_every_format)
{
    char err[256];
    sft_tensor t[3] = {
        {.name = "h.0.mlp.c_fc.weight",
         .dtype = SFT_F32,
         .ndim = 2,
         .shape = shape_64x32,
         .data = wf_f32},
        {.name = "h.0.mlp.c_fc.bias",
         .dtype = SFT_F32,
         .ndim = 1,
         .shape = shape_4,
         .data = wf_f32},
        {.name = "wte.weight", .dtype = SFT_F32, .ndim = 2, .shape = shape_64x32, .data = wf_f32}};
    ck_assert_str_eq(detect(t, 3, NULL, 0, err, sizeof err), "f32");
    t[0].dtype = t[2].dtype = SFT_BF16;
    t[0].data = t[2].data = wf_u16;
    ck_assert_str_eq(detect(t, 3, NULL, 0, err, sizeof err), "bf16"); /* F32 vectors allowed */
    t[2].dtype = SFT_F16;
    ck_assert_str_eq(detect(t, 3, NULL, 0, err, sizeof err), "mixed");
    t[0].dtype = SFT_F16;
    ck_assert_str_eq(detect(t, 3, NULL, 0, err, sizeof err), "f16");
    /* q8: matrices I8, scales [ceil(64/32), 32] down the rows, [64, 1] along wte's. */
    sft_tensor q[5] = {
        {.name = "h.0.mlp.c_fc.weight",
         .dtype = SFT_I8,
         .ndim = 2,
         .shape = shape_64x32,
         .data = wf_i8},
        {.name = "h.0.mlp.c_fc.weight.q8_scale",
         .dtype = SFT_F32,
         .ndim = 2,
         .shape = shape_2x32,
         .data = wf_f32},
        {.name = "h.0.mlp.c_fc.bias",
         .dtype = SFT_F32,
         .ndim = 1,
         .shape = shape_4,
         .data = wf_f32},
        {.name = "wte.weight", .dtype = SFT_I8, .ndim = 2, .shape = shape_64x32, .data = wf_i8},
        {.name = "wte.weight.q8_scale",
         .dtype = SFT_F32,
         .ndim = 2,
         .shape = shape_64x1,
         .data = wf_f32}};
    sft_meta meta[2] = {{"gpt2d.format", "q8"}, {"gpt2d.q8_block", "32"}};
    ck_assert_str_eq(detect(q, 5, meta, 2, err, sizeof err), "q8");
    /* The scales of wte the other way round are wrong. */
    q[4].shape = shape_2x32;
    ck_assert_ptr_null(detect(q, 5, meta, 2, err, sizeof err));
    ck_assert_msg(strstr(err, "q8 scale 'wte.weight.q8_scale' must be F32 [64, 1]") != NULL, "%s",
                  err);
    q[4].shape = shape_64x1;
    /* A float matrix left in a q8 file. */
    q[3].dtype = SFT_F32;
    q[3].data = wf_f32;
    ck_assert_ptr_null(detect(q, 4, meta, 2, err, sizeof err));
    ck_assert_msg(strstr(err, "matrix 'wte.weight' is F32, expected I8") != NULL, "%s", err);
    /* A scale tensor without its I8 matrix. */
    q[3] = q[4];
    ck_assert_ptr_null(detect(q, 4, meta, 2, err, sizeof err));
    ck_assert_msg(strstr(err, "q8 scale 'wte.weight.q8_scale' has no I8 tensor 'wte.weight'")
                      != NULL,
                  "%s", err);
    /* wte's width must be a multiple of the block. */
    q[3] = (sft_tensor){
        .name = "wte.weight", .dtype = SFT_I8, .ndim = 2, .shape = shape_64x40, .data = wf_i8};
    ck_assert_ptr_null(detect(q, 4, meta, 2, err, sizeof err));
    ck_assert_msg(strstr(err, "40 columns are not a multiple of the block 32") != NULL, "%s", err);
    /* An unknown format name in the metadata. */
    sft_meta other = {"gpt2d.format", "q4"};
    ck_assert_ptr_null(detect(t, 3, &other, 1, err, sizeof err));
    ck_assert_msg(strstr(err, "metadata gpt2d.format is \"q4\"") != NULL, "%s", err);
}
END_TEST

/* ---- The panel64 layout ---------------------------------------------------- */

START_TEST(wf_is_projection_names_the_four_matrices)
{
    ck_assert_int_eq(wf_is_projection("h.0.attn.c_attn.weight"), 1);
    ck_assert_int_eq(wf_is_projection("h.11.attn.c_proj.weight"), 1);
    ck_assert_int_eq(wf_is_projection("h.3.mlp.c_fc.weight"), 1);
    ck_assert_int_eq(wf_is_projection("transformer.h.3.mlp.c_proj.weight"), 1);
    ck_assert_int_eq(wf_is_projection("h.0.attn.c_attn.bias"), 0);
    ck_assert_int_eq(wf_is_projection("h.0.mlp.c_fc.weight.q8_scale"), 0);
    ck_assert_int_eq(wf_is_projection("h.0.attn.bias"), 0);
    ck_assert_int_eq(wf_is_projection("wte.weight"), 0);
    ck_assert_int_eq(wf_is_projection("wpe.weight"), 0);
    ck_assert_int_eq(wf_is_projection("lm_head.weight"), 0);
    ck_assert_int_eq(wf_is_projection(""), 0);
    /* The suffix must be whole components. */
    ck_assert_int_eq(wf_is_projection("attn.c_attn.weight"), 1);
    ck_assert_int_eq(wf_is_projection("h.0.crossattn.c_attn.weight"), 0);
    ck_assert_int_eq(wf_is_projection("h.0.xmlp.c_fc.weight"), 0);
}
END_TEST

/* wf_layout of a one-vector file with the given metadata (NULL: none). */
static sft_status layout_of(const sft_meta *meta, int *panel, char *err, size_t errlen)
{
    const char *p = tpath("layout.safetensors");
    sft_tensor t = {
        .name = "ln_f.bias", .dtype = SFT_F32, .ndim = 1, .shape = shape_4, .data = wf_f32};
    ck_assert_int_eq(sft_save(p, &t, 1, meta, meta ? 1 : 0, NULL, err, errlen), SFT_OK);
    sft_file *f;
    ck_assert_int_eq(sft_open(p, SFT_LOAD_COPY, &f, err, errlen), SFT_OK);
    *panel = -1;
    sft_status s = wf_layout(f, panel, err, errlen);
    sft_close(f);
    return s;
}

START_TEST(wf_layout_reads_the_metadata_key)
{
    char err[256];
    int panel;
    ck_assert_int_eq(layout_of(NULL, &panel, err, sizeof err), SFT_OK);
    ck_assert_int_eq(panel, 0);
    sft_meta m = {WF_META_LAYOUT, WF_LAYOUT_PANEL};
    ck_assert_str_eq(m.key, "gpt2d.layout");
    ck_assert_int_eq(layout_of(&m, &panel, err, sizeof err), SFT_OK);
    ck_assert_int_eq(panel, 1);
    m.value = "panel32";
    ck_assert_int_eq(layout_of(&m, &panel, err, sizeof err), SFT_EFORMAT);
    ck_assert_msg(
        strstr(err, "metadata gpt2d.layout is \"panel32\"; expected \"panel64\" or \"pairs64\"")
            != NULL,
        "%s", err);
    m.value = "hf"; /* the hf layout is the key's absence, never a value */
    ck_assert_int_eq(layout_of(&m, &panel, err, sizeof err), SFT_EFORMAT);
    ck_assert_msg(strstr(err, "gpt2d.layout is \"hf\"") != NULL, "%s", err);
    m.value = "a\nb"; /* one line */
    ck_assert_int_eq(layout_of(&m, &panel, err, sizeof err), SFT_EFORMAT);
    ck_assert_ptr_null(strchr(err, '\n'));
}
END_TEST

/* wf_about_get of a one-vector file with meta[0..n). */
static sft_status about_of(const sft_meta *meta, size_t n, wf_about *a, char *err, size_t errlen)
{
    const char *p = tpath("about.safetensors");
    sft_tensor t = {
        .name = "ln_f.bias", .dtype = SFT_F32, .ndim = 1, .shape = shape_4, .data = wf_f32};
    ck_assert_int_eq(sft_save(p, &t, 1, meta, n, NULL, err, errlen), SFT_OK);
    sft_file *f;
    ck_assert_int_eq(sft_open(p, SFT_LOAD_COPY, &f, err, errlen), SFT_OK);
    sft_status s = wf_about_get(f, a, err, errlen);
    /* The strings are the file's: compare them before it closes. */
    static char name[WF_NAME_MAX], owner[WF_NAME_MAX], desc[WF_DESCRIPTION_MAX];
    if (s == SFT_OK) {
        snprintf(name, sizeof name, "%s", a->name ? a->name : "(null)");
        snprintf(owner, sizeof owner, "%s", a->owned_by ? a->owned_by : "(null)");
        snprintf(desc, sizeof desc, "%s", a->description ? a->description : "(null)");
        a->name = name;
        a->owned_by = owner;
        a->description = desc;
    }
    sft_close(f);
    return s;
}

START_TEST(wf_about_reads_and_checks_the_checkpoints_words)
{
    char err[256];
    wf_about a;
    ck_assert_int_eq(about_of(NULL, 0, &a, err, sizeof err), SFT_OK);
    ck_assert_str_eq(a.name, "(null)");
    ck_assert_str_eq(a.weights, "unknown");
    const sft_meta good[] = {
        {"gpt2d.model_name", "gpt2d-tiny"},
        {"gpt2d.owned_by", "gpt2d"},
        {"gpt2d.description", "gpt2d-tiny: small; not OpenAI\xe2\x80\x99s GPT-2"},
        {"gpt2d.weights", "trained"},
        {"format", "pt"}};
    ck_assert_int_eq(about_of(good, 5, &a, err, sizeof err), SFT_OK);
    ck_assert_str_eq(a.name, "gpt2d-tiny");
    ck_assert_str_eq(a.owned_by, "gpt2d");
    ck_assert_str_eq(a.description, "gpt2d-tiny: small; not OpenAI\xe2\x80\x99s GPT-2");
    ck_assert_str_eq(a.weights, "trained");
    const sft_meta random[] = {{"gpt2d.weights", "random"}};
    ck_assert_int_eq(about_of(random, 1, &a, err, sizeof err), SFT_OK);
    ck_assert_str_eq(a.weights, "random");
    /* Each rule refused, naming the key: a typo must not pass for a label. */
    static char long_name[200], long_desc[1100];
    memset(long_name, 'a', sizeof long_name - 1);
    memset(long_desc, 'a', sizeof long_desc - 1);
    const struct {
        sft_meta m;
        const char *want;
    } bad[] = {
        {{"gpt2d.weights", "rnd"}, "metadata gpt2d.weights must be \"random\" or \"trained\""},
        {{"gpt2d.model_name", "has space"}, "metadata gpt2d.model_name must be 1 to 127"},
        {{"gpt2d.model_name", long_name}, "metadata gpt2d.model_name must be 1 to 127"},
        {{"gpt2d.owned_by", ""}, "metadata gpt2d.owned_by must be 1 to 127"},
        {{"gpt2d.description", "two\nlines"}, "metadata gpt2d.description must be one line"},
        {{"gpt2d.description", long_desc}, "metadata gpt2d.description must be one line"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(about_of(&bad[i].m, 1, &a, err, sizeof err), SFT_EFORMAT);
        ck_assert_msg(strstr(err, bad[i].want) != NULL, "%zu: %s", i, err);
        ck_assert_ptr_null(strchr(err, '\n'));
    }
    /* The tools' check: the same rules, and the format keys are convert's. */
    ck_assert_int_eq(wf_meta_ok("gpt2d.weights", "random", err, sizeof err), 1);
    ck_assert_int_eq(wf_meta_ok("format", "anything", err, sizeof err), 1);
    ck_assert_int_eq(wf_meta_ok("gpt2d.layout", "panel64", err, sizeof err), 0);
    ck_assert_int_eq(wf_meta_ok("gpt2d.nmae", "x", err, sizeof err), 0);
    ck_assert_msg(strstr(err, "not a key gpt2d knows") != NULL, "%s", err);
}
END_TEST

/* Panel shapes: c_fc [K=40, N=128] stored [2, 40, 64], its q8 scales
 * [ceil(40/32)=2, 128] stored [2, 2, 64]; c_proj [128, 64] as [1, 128, 64]. */
static const int64_t pshape_fc[] = {2, 40, 64}, pshape_fc_scale[] = {2, 2, 64};
static const int64_t pshape_proj[] = {1, 128, 64}, pshape_proj_scale[] = {1, 4, 64};
static const int64_t pshape_fc_2d[] = {40, 128}, pshape_fc_scale_2d[] = {2, 128};
static const int64_t pshape_fc_bad[] = {4, 40, 32}, pshape_fc_scale_bad[] = {2, 1, 64};
static float wp_f32[2 * 40 * 64 * 2];
static int8_t wp_i8[2 * 40 * 64 * 2];
static uint16_t wp_u16[2 * 40 * 64 * 2];

START_TEST(wf_detect_accepts_panel64_files)
{
    char err[256];
    sft_meta panel = {WF_META_LAYOUT, WF_LAYOUT_PANEL};
    sft_tensor t[4] = {{.name = "transformer.h.0.mlp.c_fc.weight",
                        .dtype = SFT_F32,
                        .ndim = 3,
                        .shape = pshape_fc,
                        .data = wp_f32},
                       {.name = "transformer.h.0.mlp.c_proj.weight",
                        .dtype = SFT_F32,
                        .ndim = 3,
                        .shape = pshape_proj,
                        .data = wp_f32},
                       {.name = "transformer.h.0.attn.bias", /* a 4-D mask buffer stays as it is */
                        .dtype = SFT_F32,
                        .ndim = 4,
                        .shape = (const int64_t[]){1, 1, 4, 4},
                        .data = wp_f32},
                       {.name = "transformer.wte.weight",
                        .dtype = SFT_F32,
                        .ndim = 2,
                        .shape = shape_64x32,
                        .data = wp_f32}};
    ck_assert_str_eq(detect(t, 4, &panel, 1, err, sizeof err), "f32");
    for (int i = 0; i < 4; i++) t[i].data = wp_u16;
    t[0].dtype = t[1].dtype = t[3].dtype = SFT_BF16;
    ck_assert_str_eq(detect(t, 4, &panel, 1, err, sizeof err), "bf16");
    t[3].dtype = SFT_F16; /* the panels count as matrices: bf16 and f16 mix */
    ck_assert_str_eq(detect(t, 4, &panel, 1, err, sizeof err), "mixed");
    /* q8: panel I8 matrices with panel scales, wte with its row scales. */
    sft_tensor q[6] = {
        {.name = "h.0.mlp.c_fc.weight",
         .dtype = SFT_I8,
         .ndim = 3,
         .shape = pshape_fc,
         .data = wp_i8},
        {.name = "h.0.mlp.c_fc.weight.q8_scale",
         .dtype = SFT_F32,
         .ndim = 3,
         .shape = pshape_fc_scale,
         .data = wp_f32},
        {.name = "h.0.mlp.c_proj.weight",
         .dtype = SFT_I8,
         .ndim = 3,
         .shape = pshape_proj,
         .data = wp_i8},
        {.name = "h.0.mlp.c_proj.weight.q8_scale",
         .dtype = SFT_F32,
         .ndim = 3,
         .shape = pshape_proj_scale,
         .data = wp_f32},
        {.name = "wte.weight", .dtype = SFT_I8, .ndim = 2, .shape = shape_64x32, .data = wp_i8},
        {.name = "wte.weight.q8_scale",
         .dtype = SFT_F32,
         .ndim = 2,
         .shape = shape_64x1,
         .data = wp_f32}};
    sft_meta meta[3] = {
        {"gpt2d.format", "q8"}, {"gpt2d.layout", "panel64"}, {"gpt2d.q8_block", "32"}};
    ck_assert_str_eq(detect(q, 6, meta, 3, err, sizeof err), "q8");
}
END_TEST

/* A q8 panel file whose projection declares [0, INT64_MAX, 64]: no bytes,
 * so the parser takes it, and the scale shape's ceil(K / 32) must not
 * overflow (UBSan runs this in scripts/test.sh); the scales [0, 1, 64]
 * do not match it and the file is refused. */
START_TEST(wf_detect_huge_panel_dimension_is_refused_without_overflow)
{
    char err[256];
    static const int64_t huge[] = {0, INT64_MAX, 64}, huge_scale[] = {0, 1, 64};
    sft_tensor q[4] = {
        {.name = "h.0.attn.c_attn.weight",
         .dtype = SFT_I8,
         .ndim = 3,
         .shape = huge,
         .data = wp_i8},
        {.name = "h.0.attn.c_attn.weight.q8_scale",
         .dtype = SFT_F32,
         .ndim = 3,
         .shape = huge_scale,
         .data = wp_f32},
        {.name = "wte.weight", .dtype = SFT_I8, .ndim = 2, .shape = shape_64x32, .data = wp_i8},
        {.name = "wte.weight.q8_scale",
         .dtype = SFT_F32,
         .ndim = 2,
         .shape = shape_64x1,
         .data = wp_f32}};
    sft_meta meta[3] = {
        {"gpt2d.format", "q8"}, {"gpt2d.layout", "panel64"}, {"gpt2d.q8_block", "32"}};
    ck_assert_ptr_null(detect(q, 4, meta, 3, err, sizeof err));
    ck_assert_msg(strstr(err, "h.0.attn.c_attn.weight.q8_scale") != NULL, "%s", err);
}
END_TEST

START_TEST(wf_detect_refuses_each_broken_layout_rule)
{
    char err[256];
    sft_meta panel = {WF_META_LAYOUT, WF_LAYOUT_PANEL};
    sft_tensor t[2] = {
        {.name = "h.0.mlp.c_fc.weight",
         .dtype = SFT_F32,
         .ndim = 3,
         .shape = pshape_fc,
         .data = wp_f32},
        {.name = "wte.weight", .dtype = SFT_F32, .ndim = 2, .shape = shape_64x32, .data = wp_f32}};
    /* A 3-D projection in an hf file (no layout key). */
    ck_assert_ptr_null(detect(t, 2, NULL, 0, err, sizeof err));
    ck_assert_msg(strstr(err, "3-D projection 'h.0.mlp.c_fc.weight' in a file without "
                              "gpt2d.layout \"panel64\" or \"pairs64\" metadata")
                      != NULL,
                  "%s", err);
    /* An unknown layout value. */
    sft_meta other = {WF_META_LAYOUT, "panel128"};
    ck_assert_ptr_null(detect(t, 2, &other, 1, err, sizeof err));
    ck_assert_msg(strstr(err, "metadata gpt2d.layout is \"panel128\"") != NULL, "%s", err);
    /* A 2-D projection in a panel64 file. */
    t[0].ndim = 2;
    t[0].shape = pshape_fc_2d;
    ck_assert_ptr_null(detect(t, 2, &panel, 1, err, sizeof err));
    ck_assert_msg(strstr(err, "panel64 file: projection 'h.0.mlp.c_fc.weight' is 2-D, expected "
                              "3-D [N/64, K, 64]")
                      != NULL,
                  "%s", err);
    /* A last dimension other than 64. */
    t[0].ndim = 3;
    t[0].shape = pshape_fc_bad;
    ck_assert_ptr_null(detect(t, 2, &panel, 1, err, sizeof err));
    ck_assert_msg(strstr(err, "projection 'h.0.mlp.c_fc.weight' has last dimension 32, expected "
                              "64")
                      != NULL,
                  "%s", err);
    /* A 3-D tensor that is not a projection. */
    t[0].shape = pshape_fc;
    t[1].ndim = 3;
    t[1].shape = pshape_fc;
    ck_assert_ptr_null(detect(t, 2, &panel, 1, err, sizeof err));
    ck_assert_msg(strstr(err, "panel64 file: 3-D tensor 'wte.weight' is not a projection") != NULL,
                  "%s", err);
    /* q8 in panels: the scales' shape is [N/64, ceil(K/32), 64]. */
    sft_tensor q[2] = {{.name = "h.0.mlp.c_fc.weight",
                        .dtype = SFT_I8,
                        .ndim = 3,
                        .shape = pshape_fc,
                        .data = wp_i8},
                       {.name = "h.0.mlp.c_fc.weight.q8_scale",
                        .dtype = SFT_F32,
                        .ndim = 3,
                        .shape = pshape_fc_scale_bad,
                        .data = wp_f32}};
    sft_meta meta[3] = {
        {"gpt2d.format", "q8"}, {"gpt2d.layout", "panel64"}, {"gpt2d.q8_block", "32"}};
    ck_assert_ptr_null(detect(q, 2, meta, 3, err, sizeof err));
    ck_assert_msg(strstr(err, "q8 scale 'h.0.mlp.c_fc.weight.q8_scale' must be F32 [2, 2, 64]")
                      != NULL,
                  "%s", err);
    /* A scale left in the hf shape in a panel64 file. */
    q[1].ndim = 2;
    q[1].shape = pshape_fc_scale_2d;
    ck_assert_ptr_null(detect(q, 2, meta, 3, err, sizeof err));
    ck_assert_msg(strstr(err, "projection 'h.0.mlp.c_fc.weight.q8_scale' is 2-D") != NULL, "%s",
                  err);
    /* A panel scale in an hf q8 file (both tensors 3-D: the projection is
     * named first). */
    q[1].ndim = 3;
    q[1].shape = pshape_fc_scale;
    sft_meta hfq8[2] = {{"gpt2d.format", "q8"}, {"gpt2d.q8_block", "32"}};
    ck_assert_ptr_null(detect(q, 2, hfq8, 2, err, sizeof err));
    ck_assert_msg(strstr(err, "3-D projection 'h.0.mlp.c_fc.weight' in a file without") != NULL,
                  "%s", err);
    /* The hf q8 matrix with a panel scale. */
    q[0].ndim = 2;
    q[0].shape = pshape_fc_2d;
    ck_assert_ptr_null(detect(q, 2, hfq8, 2, err, sizeof err));
    ck_assert_msg(strstr(err, "3-D projection 'h.0.mlp.c_fc.weight.q8_scale' in a file without")
                      != NULL,
                  "%s", err);
}
END_TEST

static Suite *sft_suite(void)
{
    Suite *s = suite_create("formats");
    TCase *tc;

    tc = tcase_create("sft_save");
    tcase_add_checked_fixture(tc, setup_dir, teardown_dir);
    tcase_add_test(tc, sft_save_seed_example_has_exact_bytes);
    tcase_add_test(tc, sft_save_pads_header_to_8_bytes);
    tcase_add_test(tc, sft_save_misaligned_starts_data_at_8k_plus_3);
    tcase_add_test(tc, sft_save_data_align_64_starts_data_at_64k);
    tcase_add_test(tc, sft_save_is_deterministic);
    tcase_add_test(tc, sft_save_rejected_input_leaves_the_target_untouched);
    tcase_add_test(tc, sft_save_write_failure_midway_leaves_the_target_untouched);
    tcase_add_test(tc, sft_save_into_a_missing_directory_is_eio);
    tcase_add_test(tc, sft_save_over_a_mapped_file_keeps_the_old_mapping);
    suite_add_tcase(s, tc);

    tc = tcase_create("sft_open");
    tcase_add_checked_fixture(tc, setup_dir, teardown_dir);
    tcase_add_test(tc, sft_open_round_trips_every_dtype);
    tcase_add_test(tc, sft_open_accepts_header_padding);
    tcase_add_loop_test(tc, sft_open_bad_header_is_rejected, 0,
                        (int)(sizeof bad_headers / sizeof bad_headers[0]));
    tcase_add_test(tc, sft_open_nesting_bomb_is_eformat);
    tcase_add_test(tc, sft_open_framing_errors);
    tcase_add_test(tc, sft_open_bool_bytes_must_be_0_or_1);
    tcase_add_test(tc, sft_open_mapped_equals_copied);
    tcase_add_test(tc, sft_open_aligned_tensors_share_the_mapping);
    tcase_add_test(tc, sft_open_mmap_maps_no_data_page);
    tcase_add_test(tc, sft_open_misaligned_tensors_are_copied_aligned);
    tcase_add_test(tc, sft_open_mapped_weights_are_read_only);
    tcase_add_test(tc, sft_data_ref_outlives_the_file_and_its_path);
    tcase_add_loop_test(tc, sft_open_and_save_survive_every_allocation_failure, 0, 2);
    suite_add_tcase(s, tc);

    tc = tcase_create("wf_detect");
    tcase_add_checked_fixture(tc, setup_dir, teardown_dir);
    tcase_add_test(tc, wf_detect_names_every_format);
    tcase_add_test(tc, wf_is_projection_names_the_four_matrices);
    tcase_add_test(tc, wf_layout_reads_the_metadata_key);
    tcase_add_test(tc, wf_about_reads_and_checks_the_checkpoints_words);
    tcase_add_test(tc, wf_detect_accepts_panel64_files);
    tcase_add_test(tc, wf_detect_huge_panel_dimension_is_refused_without_overflow);
    tcase_add_test(tc, wf_detect_refuses_each_broken_layout_rule);
    suite_add_tcase(s, tc);
    tc = tcase_create("sft_convert");
    tcase_add_test(tc, sft_f16_to_f32_known_values);
    tcase_add_test(tc, sft_tensor_to_f32_converts_half_types);
    tcase_add_test(tc, sft_dtype_names_round_trip);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(sft_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
