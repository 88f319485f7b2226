/* int8 matmul with a scale per block of 32 on both operands (llama.cpp's Q8_0 grid), x86 AVX-512
 * VNNI, or AVX2 where the CPU has no AVX-512 VNNI. Built and loaded by models/linear/block_kernel.py;
 * the layouts are documented there and in models/linear/block_int8.py, which packs the weights.
 *
 * out[m, n] = bias[n] + sum_b xs[m, b] * ws[n, b] * sum_{k in block b} xq[m, k] * wq[n, k]
 *
 * Activations are quantized here, per row and per block of 32: scale = the block's largest
 * magnitude / 127, codes round(x / scale) in -127..127 (int8). VNNI's dot product (vpdpbusd)
 * multiplies unsigned by signed bytes, so the weights' codes are stored shifted by 128 (uint8,
 * 1..255) and the shift's share, 128 * the sum of the activation block's codes, is computed with
 * the codes and starts each block's int32 sum negated. Every block's dot product is thus exact in
 * int32 (at most 32 * 255 * 127) before it is scaled in float, and the weights carry no
 * correction of their own.
 *
 * AVX2 has no vpdpbusd, and its u8 x s8 instruction (vpmaddubsw) adds pairs of products into
 * int16 with saturation: 2 x 255 x 127 would clip. So the AVX2 path takes the weights' codes back
 * to signed (xor 128: -127..127) and multiplies |x| (unsigned) by the weight with x's sign moved
 * onto it (vpsignb): a pair is at most 2 x 127 x 127 < 2^15, exact, then vpmaddwd with ones sums
 * pairs into int32. The same integers as the VNNI path, so the two agree bit for bit. (llama.cpp's
 * AVX2 Q8_0 dot product uses the same sign trick.)
 *
 * Weights arrive packed in panels of 16 output channels: for each panel and block, 8 groups of
 * 16 channels x 4 consecutive bytes (one 64-byte vector per group), the layout vpdpbusd sums
 * into 16 int32 lanes, one per channel, so no horizontal sums are needed (AVX2 takes the group as
 * two 32-byte halves of 8 channels).
 *
 * The vector functions carry their own target attributes: the file is compiled without -m flags,
 * so loading it on any x86-64 is safe and q8b_isa() says which entry point may be called.
 */
#include <immintrin.h>
#include <stdint.h>
#include <math.h>
#include <string.h>

#define BLOCK 32
#define PANEL 16
#define ROWS 4        /* rows per register tile: 2 panels x 4 rows = 8 int32 + 8 float accumulators */
#define ROW_CHUNK 64  /* rows a task takes: their codes stay in L1/L2 while a panel pair is swept */

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma")))

#define AVX2 __attribute__((target("avx2,fma")))

/* 2: AVX-512 VNNI (q8b_linear), 1: AVX2 (q8b_linear_avx2), 0: neither may be called here. */
int q8b_isa(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
        return 2;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 1;
    return 0;
}

int q8b_cpu_ok(void) { return q8b_isa() == 2; }

/* One row: k floats into kp/32 blocks of int8 codes, their scales and -128 x their sums.
 * Positions past k (the last block's padding) are zero. Division, not multiplication by the reciprocal, and
 * rounding half to even: the codes equal torch.round(x / scale), which the tests compare. */
AVX512 static void quantize_row(const float *x, int k, int kp, int8_t *codes, float *scales, int32_t *shifts) {
    for (int b = 0; b < kp / BLOCK; b++) {
        int start = b * BLOCK;
        int n0 = k - start;
        int n1 = k - start - PANEL;
        __mmask16 m0 = n0 >= PANEL ? 0xFFFF : (n0 <= 0 ? 0 : (__mmask16)((1u << n0) - 1));
        __mmask16 m1 = n1 >= PANEL ? 0xFFFF : (n1 <= 0 ? 0 : (__mmask16)((1u << n1) - 1));
        __m512 v0 = _mm512_maskz_loadu_ps(m0, x + start);
        __m512 v1 = _mm512_maskz_loadu_ps(m1, x + start + PANEL);
        __m512 amax = _mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1));
        float scale = _mm512_reduce_max_ps(amax) / 127.0f;
        scales[b] = scale;
        __m512i q0 = _mm512_setzero_si512(), q1 = _mm512_setzero_si512();
        if (scale > 0.0f) {
            __m512 s = _mm512_set1_ps(scale);
            const int round = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
            q0 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_div_ps(v0, s), round));
            q1 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_div_ps(v1, s), round));
        }
        shifts[b] = -128 * _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        _mm_storeu_si128((__m128i *)(codes + start), _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(codes + start + PANEL), _mm512_cvtepi32_epi8(q1));
    }
}

/* A register tile: R rows (R <= ROWS) against P panels (1 or 2), all blocks. */
AVX512 static inline __attribute__((always_inline)) void tile(
    int R, int P, const int8_t *xq, const float *xs, const int32_t *xc, int kp, int nb,
    const uint8_t *pw, const float *ps, int panel, const float *bias, float *out, int ldo, int n) {
    __m512 acc[ROWS][2];
    for (int r = 0; r < R; r++)
        for (int p = 0; p < P; p++) acc[r][p] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m512i dot[ROWS][2];
        __m512 wscale[2];
        const uint8_t *w[2];
        for (int p = 0; p < P; p++) {
            size_t at = (size_t)(panel + p) * nb + b;
            wscale[p] = _mm512_loadu_ps(ps + at * PANEL);
            w[p] = pw + at * PANEL * BLOCK;
        }
        for (int r = 0; r < R; r++) {
            __m512i shift = _mm512_set1_epi32(xc[(size_t)r * nb + b]);
            for (int p = 0; p < P; p++) dot[r][p] = shift;
        }
#pragma GCC unroll 8
        for (int g = 0; g < BLOCK / 4; g++) {
            __m512i wv[2];
            for (int p = 0; p < P; p++) wv[p] = _mm512_loadu_si512(w[p] + g * 64);
            for (int r = 0; r < R; r++) {
                int32_t four;
                memcpy(&four, xq + (size_t)r * kp + b * BLOCK + g * 4, 4);
                __m512i xv = _mm512_set1_epi32(four);
                for (int p = 0; p < P; p++) dot[r][p] = _mm512_dpbusd_epi32(dot[r][p], wv[p], xv);
            }
        }
        for (int r = 0; r < R; r++) {
            __m512 s = _mm512_set1_ps(xs[(size_t)r * nb + b]);
            for (int p = 0; p < P; p++)
                acc[r][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r][p]), _mm512_mul_ps(wscale[p], s), acc[r][p]);
        }
    }
    for (int p = 0; p < P; p++) {
        int col = (panel + p) * PANEL;
        int left = n - col;
        __mmask16 mask = left >= PANEL ? 0xFFFF : (__mmask16)((1u << left) - 1);
        __m512 bv = bias ? _mm512_maskz_loadu_ps(mask, bias + col) : _mm512_setzero_ps();
        for (int r = 0; r < R; r++) _mm512_mask_storeu_ps(out + (size_t)r * ldo + col, mask, _mm512_add_ps(acc[r][p], bv));
    }
}

#define TILE_CASE(R, P) tile(R, P, xq, xs, xc, kp, nb, pw, ps, panel, bias, out, n, n)

AVX512 static void tiles(int rows, int panels, const int8_t *xq, const float *xs, const int32_t *xc,
                         int kp, int nb, const uint8_t *pw, const float *ps, int panel,
                         const float *bias, float *out, int n) {
    for (int r = 0; r < rows; r += ROWS, xq += (size_t)ROWS * kp, xs += (size_t)ROWS * nb,
                              xc += (size_t)ROWS * nb, out += (size_t)ROWS * n) {
        int R = rows - r < ROWS ? rows - r : ROWS;
        if (panels == 2) {
            switch (R) {
                case 4: TILE_CASE(4, 2); break;
                case 3: TILE_CASE(3, 2); break;
                case 2: TILE_CASE(2, 2); break;
                default: TILE_CASE(1, 2); break;
            }
        } else {
            switch (R) {
                case 4: TILE_CASE(4, 1); break;
                case 3: TILE_CASE(3, 1); break;
                case 2: TILE_CASE(2, 1); break;
                default: TILE_CASE(1, 1); break;
            }
        }
    }
}

/* out (m x n, row-major) = x (m x k, row-major float32) times the packed weight (codes pw and
 * scales ps), plus bias (may be NULL). codes (m x kp bytes), xscales (m x kp/32 floats) and
 * xshifts (m x kp/32 int32) are scratch the caller owns. kp is k
 * rounded up to 32; the weight has ceil(n / 16) panels. threads: OpenMP threads to use (the
 * runtime is torch's own libgomp, so its pool is shared with torch's kernels). */
AVX512 void q8b_linear(const float *x, int m, int k, int kp, const uint8_t *pw, const float *ps, int n,
                       const float *bias, float *out, int8_t *codes, float *xscales, int32_t *xshifts,
                       int threads) {
    int nb = kp / BLOCK;
    int panels = (n + PANEL - 1) / PANEL;
    int pairs = (panels + 1) / 2;
    int chunks = (m + ROW_CHUNK - 1) / ROW_CHUNK;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
#pragma omp for schedule(static)
        for (int r = 0; r < m; r++)
            quantize_row(x + (size_t)r * k, k, kp, codes + (size_t)r * kp, xscales + (size_t)r * nb, xshifts + (size_t)r * nb);
#pragma omp for collapse(2) schedule(static)
        for (int c = 0; c < chunks; c++) {
            for (int pair = 0; pair < pairs; pair++) {
                int r0 = c * ROW_CHUNK;
                int rows = m - r0 < ROW_CHUNK ? m - r0 : ROW_CHUNK;
                int panel = pair * 2;
                int count = panels - panel >= 2 ? 2 : 1;
                tiles(rows, count, codes + (size_t)r0 * kp, xscales + (size_t)r0 * nb, xshifts + (size_t)r0 * nb,
                      kp, nb, pw, ps, panel, bias, out + (size_t)r0 * n, n);
            }
        }
    }
}

/* ---------------------------------------------------------------- AVX2 */

#define ROWS2 2  /* rows per AVX2 register tile: 2 rows x 2 halves = 4 int32 + 4 float accumulators (4 rows
                    measured no faster: the tile is bound by its 4 instructions per 32 products) */

/* One row's codes and scales, as quantize_row (the shifts are not needed: the weights are signed
 * here). Scalar: it is O(k) against the matmul's O(k x n). nearbyintf rounds half to even in the
 * default rounding mode, as torch.round does. */
AVX2 static void quantize_row_avx2(const float *x, int k, int kp, int8_t *codes, float *scales) {
    for (int b = 0; b < kp / BLOCK; b++) {
        int start = b * BLOCK;
        int n = k - start < BLOCK ? k - start : BLOCK;
        float amax = 0.0f;
        for (int i = 0; i < n; i++) {
            float a = x[start + i] < 0 ? -x[start + i] : x[start + i];
            amax = a > amax ? a : amax;
        }
        float scale = amax / 127.0f;
        scales[b] = scale;
        for (int i = 0; i < BLOCK; i++)
            codes[start + i] = (i < n && scale > 0.0f) ? (int8_t)nearbyintf(x[start + i] / scale) : 0;
    }
}

AVX2 static inline __attribute__((always_inline)) void tile_avx2(
    int R, const int8_t *xq, const float *xs, int kp, int nb, const uint8_t *pw, const float *ps, int panel,
    const float *bias, float *out, int ldo, int n) {
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    __m256 acc[ROWS2][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        size_t at = (size_t)panel * nb + b;
        const uint8_t *w = pw + at * PANEL * BLOCK;
        __m256i dot[ROWS2][2];
        for (int r = 0; r < R; r++) dot[r][0] = dot[r][1] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int g = 0; g < BLOCK / 4; g++) {
            __m256i w0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + g * 64)), flip);
            __m256i w1 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + g * 64 + 32)), flip);
            for (int r = 0; r < R; r++) {
                int32_t four;
                memcpy(&four, xq + (size_t)r * kp + b * BLOCK + g * 4, 4);
                __m256i xv = _mm256_set1_epi32(four);
                __m256i ax = _mm256_abs_epi8(xv);
                __m256i p0 = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(w0, xv));
                __m256i p1 = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(w1, xv));
                dot[r][0] = _mm256_add_epi32(dot[r][0], _mm256_madd_epi16(p0, ones));
                dot[r][1] = _mm256_add_epi32(dot[r][1], _mm256_madd_epi16(p1, ones));
            }
        }
        __m256 ws0 = _mm256_loadu_ps(ps + at * PANEL), ws1 = _mm256_loadu_ps(ps + at * PANEL + 8);
        for (int r = 0; r < R; r++) {
            __m256 s = _mm256_set1_ps(xs[(size_t)r * nb + b]);
            acc[r][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r][0]), _mm256_mul_ps(ws0, s), acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r][1]), _mm256_mul_ps(ws1, s), acc[r][1]);
        }
    }
    int col = panel * PANEL;
    int left = n - col < PANEL ? n - col : PANEL;
    for (int r = 0; r < R; r++) {
        float lanes[PANEL];
        _mm256_storeu_ps(lanes, acc[r][0]);
        _mm256_storeu_ps(lanes + 8, acc[r][1]);
        float *o = out + (size_t)r * ldo + col;
        for (int c = 0; c < left; c++) o[c] = lanes[c] + (bias ? bias[col + c] : 0.0f);
    }
}

/* As q8b_linear, on AVX2; xshifts is not written. */
AVX2 void q8b_linear_avx2(const float *x, int m, int k, int kp, const uint8_t *pw, const float *ps, int n,
                          const float *bias, float *out, int8_t *codes, float *xscales, int32_t *xshifts,
                          int threads) {
    (void)xshifts;
    int nb = kp / BLOCK;
    int panels = (n + PANEL - 1) / PANEL;
    int chunks = (m + ROW_CHUNK - 1) / ROW_CHUNK;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
#pragma omp for schedule(static)
        for (int r = 0; r < m; r++)
            quantize_row_avx2(x + (size_t)r * k, k, kp, codes + (size_t)r * kp, xscales + (size_t)r * nb);
#pragma omp for collapse(2) schedule(static)
        for (int c = 0; c < chunks; c++) {
            for (int panel = 0; panel < panels; panel++) {
                int r0 = c * ROW_CHUNK;
                int rows = m - r0 < ROW_CHUNK ? m - r0 : ROW_CHUNK;
                for (int r = 0; r < rows; r += ROWS2) {
                    const int8_t *xq = codes + (size_t)(r0 + r) * kp;
                    const float *xs = xscales + (size_t)(r0 + r) * nb;
                    float *o = out + (size_t)(r0 + r) * n;
                    if (rows - r >= 2)
                        tile_avx2(2, xq, xs, kp, nb, pw, ps, panel, bias, o, n, n);
                    else
                        tile_avx2(1, xq, xs, kp, nb, pw, ps, panel, bias, o, n, n);
                }
            }
        }
    }
}

/* ---------------------------------------------------------------- dequantization to bfloat16 */

/* The packed weight (codes pw, scales ps) back to bfloat16, row-major n x k (the padding past k
 * dropped): out[c, i] = (code - 128) x scale of c's block, rounded to nearest even. For a prefill
 * of many rows on a CPU whose bfloat16 matmul runs on AMX tiles, where one pass over the weights
 * into bfloat16 and the tiles' product beat the VNNI kernel (models/linear/block_int8.py). The
 * product is rounded to float32, then to bfloat16, as torch rounds `(codes * scales).bfloat16()`
 * (finite scales: a weight block with an inf or NaN is not a model). AVX-512 where `wide` asks for it and
 * q8b_isa() allows it (the tile path runs on AMX CPUs, which all have it), a plain loop elsewhere;
 * the two give the same bits. */
static void dequant_block_scalar(const uint8_t *codes, const float *scales, int channels, int width,
                                 uint16_t *out, int k) {
    for (int j = 0; j < channels; j++) {
        uint16_t *row = out + (size_t)j * k;
        for (int i = 0; i < width; i++) {
            float f = (float)((int)codes[((i >> 2) * PANEL + j) * 4 + (i & 3)] - 128) * scales[j];
            uint32_t u;
            memcpy(&u, &f, sizeof u);
            row[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
        }
    }
}

AVX512 static inline __m256i bf16_of(__m512 f) {
    __m512i u = _mm512_castps_si512(f);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    u = _mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16));
}

/* One (panel, block): channel j's 32 codes are 8 groups of 4 bytes, 64 bytes apart (the layout
 * vpdpbusd reads), gathered into one 32-byte vector in input order, widened, scaled, rounded and
 * stored as one row piece of 64 bytes. */
AVX512 static void dequant_block_avx512(const uint8_t *codes, const float *scales, int channels, int width,
                                        uint16_t *out, int k) {
    const __m256i groups = _mm256_setr_epi32(0, 64, 128, 192, 256, 320, 384, 448);
    const __m512i shift = _mm512_set1_epi32(128);
    __mmask16 lo_mask = width >= 16 ? 0xffff : (__mmask16)((1u << width) - 1);
    __mmask16 hi_mask = width >= 32 ? 0xffff : width <= 16 ? 0 : (__mmask16)((1u << (width - 16)) - 1);
    for (int j = 0; j < channels; j++) {
        __m256i v = _mm256_i32gather_epi32((const int *)(codes + j * 4), groups, 1);
        __m512 s = _mm512_set1_ps(scales[j]);
        __m512i lo = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(v)), shift);
        __m512i hi = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(v, 1)), shift);
        uint16_t *row = out + (size_t)j * k;
        _mm256_mask_storeu_epi16(row, lo_mask, bf16_of(_mm512_mul_ps(_mm512_cvtepi32_ps(lo), s)));
        _mm256_mask_storeu_epi16(row + 16, hi_mask, bf16_of(_mm512_mul_ps(_mm512_cvtepi32_ps(hi), s)));
    }
}

void q8b_dequant_bf16(const uint8_t *pw, const float *ps, int n, int k, int kp, uint16_t *out, int threads, int wide) {
    int nb = kp / BLOCK;
    int panels = (n + PANEL - 1) / PANEL;
    wide = wide && q8b_isa() == 2;
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads) if (threads > 1)
    for (int p = 0; p < panels; p++) {
        for (int b = 0; b < nb; b++) {
            const uint8_t *codes = pw + ((size_t)p * nb + b) * (BLOCK * PANEL);  /* [8 groups][16 ch][4] */
            const float *scales = ps + ((size_t)p * nb + b) * PANEL;
            int i0 = b * BLOCK;
            int width = k - i0 < BLOCK ? k - i0 : BLOCK;
            int channels = n - p * PANEL < PANEL ? n - p * PANEL : PANEL;
            uint16_t *dst = out + (size_t)p * PANEL * k + i0;
            if (wide)
                dequant_block_avx512(codes, scales, channels, width, dst, k);
            else
                dequant_block_scalar(codes, scales, channels, width, dst, k);
        }
    }
}
