/*
 * engine/op_w_panels.c: the panel copy of a projection stored in the
 * Hugging Face layout, built at load (engine/model.c), so that a fine-tune
 * as Hugging Face writes it decodes at the speed of its panel64
 * conversion without a manual `gpt2d convert`.
 *
 * Why: the AVX-512 kernels of op_matmul.c stream a thread's columns of a
 * panel64 W as one contiguous run (mm_panels_1row_avx512 for one row,
 * mm_panels_rows_avx512_t for five and more), where the row-major layout
 * makes every k a separate short run the prefetchers follow less well:
 * docs/benchmarks.md ("A fine-tune as fast as the stock model") has the
 * measurements. Panels move elements, never values or the order they are
 * summed in (kernels.h, op_w), so the copy gives the bits of the file.
 *
 * Which: F32 and F16 projections only. BF16 at "avx512-bf16" and Q8 at
 * "avx512-vnni" already read their own copies (pairs, quads), built from
 * either layout; BF16 or Q8 below those levels was opted out of copies
 * (GPT2D_KERNELS=avx512) and keeps the file's pages. Below AVX-512 (with
 * AVX512BW, which the one-row panel kernel needs) no kernel reads panels
 * faster, so no copy is built.
 *
 * A pairs64 file's projections (BF16, stored as the avx512-bf16 kernels
 * read them) get one too below that level, whatever GPT2D_PANEL_COPY says:
 * no other kernel reads that layout.
 *
 * Cost: private memory the size of the projections (GPT-2 small F32:
 * 340 MB; F16: 170 MB), in place of the file's pages for them, which are
 * read once, here.
 */
#include "kernels.h"

#include <string.h>

size_t op_w_panels_bytes(const op_w *w, size_t K, size_t N)
{
    if (w->panel == OP_PANEL_PAIRS) return w->pairs != NULL ? 0 : K * N * sizeof(uint16_t);
    if (w->panel || (w->dt != OP_F32 && w->dt != OP_F16) || K == 0 || N == 0 || N % OP_PANEL != 0
        || !op_use_avx512bw())
        return 0;
    return K * N * (w->dt == OP_F32 ? sizeof(float) : sizeof(uint16_t));
}

/* W[k][n] from k * N + n to ((n / 64) * K + k) * 64 + n % 64: each panel
 * row is 64 contiguous elements in both, so one copy of 64 a row. */
void op_w_panels_write(op_w *w, void *dst, size_t K, size_t N)
{
    if (w->panel == OP_PANEL_PAIRS) { /* (k, n) from pairs64's place (wformat.h) */
        const uint16_t *src = w->p;
        uint16_t *o = dst;
        for (size_t n = 0; n < N; n++)
            for (size_t k = 0; k < K; k++)
                o[((n / OP_PANEL) * K + k) * OP_PANEL + n % OP_PANEL] =
                    src[((n / OP_PANEL) * (K / 2) + k / 2) * 2 * OP_PANEL + (n % OP_PANEL) * 2
                        + k % 2];
        w->p = dst;
        w->panel = 1;
        return;
    }
    const size_t es = w->dt == OP_F32 ? sizeof(float) : sizeof(uint16_t);
    const size_t run = OP_PANEL * es;
    const char *src = w->p;
    char *o = dst;
    for (size_t p = 0; p < N / OP_PANEL; p++)
        for (size_t k = 0; k < K; k++, o += run) memcpy(o, src + (k * N + p * OP_PANEL) * es, run);
    w->p = dst;
    w->panel = 1;
}
