/* Hearth's CPU kernels, variants.py's "avx512" variant (engine thread; OpenMP threads inside each call). Built by
   setup.py (or native/build.py in a source checkout) with AVX-512 (F, BW, VL, VNNI, VBMI), the AMX functions for
   their own target, and loaded with ctypes; every pointer is a contiguous tensor's data. */

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <omp.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kernels_common.h"

#define ROW_TILE 2        /* activation rows per pass over a block: their sums fill the registers */

static inline __m512 bf16_in_low_half(__m512i pairs) { return _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16)); }

static inline __m512 bf16_in_high_half(__m512i pairs) {
    return _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32((int)0xFFFF0000)));
}

/* The KV cache holds bf16 (uint16 storage): a value's fp32 is its 16 bits above 16 zero bits. */
static inline __m512 bf16_load(const uint16_t *values) {  /* 16 consecutive values */
    return bf16_in_low_half(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)values)));
}

static inline void bf16_widen(const uint16_t *values, int count, float *out) {  /* count a multiple of 16 */
    for (int i = 0; i < count; i += 16) _mm512_storeu_ps(out + i, bf16_load(values + i));
}

/* Values 16v .. 16v + 15 of a K/V row (kv_row_bytes) as fp32: bf16 widened, or int8 codes times their fp16 scale. */
static inline __attribute__((always_inline)) __m512 kv_load(const uint8_t *row, int v, int head_dim, int int8) {
    if (!int8) return bf16_load((const uint16_t *)row + 16 * v);
    __m512 codes = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(row + 16 * v))));
    return _mm512_mul_ps(codes, _mm512_set1_ps(_cvtsh_ss(((const uint16_t *)(row + head_dim))[v / 2])));
}

/* n consecutive K/V rows (kv_row_bytes each) as fp32 [n, head_dim]. */
static void kv_widen(const uint8_t *rows, int n, int head_dim, int int8, float *out) {
    if (!int8) {
        bf16_widen((const uint16_t *)rows, n * head_dim, out);
        return;
    }
    const size_t row = kv_row_bytes(head_dim, 1);
    for (int p = 0; p < n; p++)
        for (int v = 0; v < head_dim / 16; v++)
            _mm512_storeu_ps(out + (size_t)p * head_dim + 16 * v, kv_load(rows + p * row, v, head_dim, 1));
}

/* x [head_dim] as an int8 K/V row (quantize_kv_row), its scales rounded to fp16 to nearest even. */
static void kv_store_int8(uint8_t *row, const float *x, int head_dim) {
    float scales[MAX_HEAD_DIM / KV_GROUP];
    quantize_kv_row(x, head_dim, (int8_t *)row, scales);
    for (int g = 0; g < head_dim / KV_GROUP; g++)
        ((uint16_t *)(row + head_dim))[g] = _cvtss_sh(scales[g], _MM_FROUND_TO_NEAREST_INT);
}

/* 16 fp32 values as bf16, rounded to nearest even as PyTorch rounds (a NaN stays a NaN). */
static inline void bf16_store(uint16_t *target, __m512 x) {
    __m512i bits = _mm512_castps_si512(x);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    rounded = _mm512_mask_or_epi32(rounded, nan, bits, _mm512_set1_epi32(0x00400000));  /* quiet, not rounded */
    _mm256_storeu_si256((__m256i *)target, _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16)));
}

/* Group g's scales and offsets of a block's rows 16j .. 16j + 15 (kernels_common.h's int4 scales, the block's
   from block_scales): w = (q - 8) * scale + zero = q * scale + offset. */
static inline __attribute__((always_inline)) void group_scale_and_offset(const uint8_t *block_scales, int g, int j,
                                                                         __m512 *scale, __m512 *offset) {
    __m512i factors = _mm512_loadu_si512((const void *)(run_factors(block_scales, g) + 32 * j));
    __m512i codes = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(group_codes(block_scales, g) + 32 * j)));
    __m512 c = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(codes, 24), 24));  /* a lane's low byte */
    __m512 z = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(codes, 16), 24));  /* its second */
    *scale = _mm512_mul_ps(bf16_in_low_half(factors), c);
    *offset = _mm512_fnmadd_ps(_mm512_set1_ps(8.0f), *scale, _mm512_mul_ps(bf16_in_high_half(factors), z));
}

/* Byte indices that gather four columns (k .. k + 3, two 64-byte loads) of 16 rows into one 32-bit lane a row. */
static inline __m512i lane_gather(int first_row) {
    uint8_t index[64];
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 4; c++) index[4 * r + c] = (uint8_t)(32 * c + first_row + r);
    return _mm512_loadu_si512(index);
}

/* Four columns of `count` (1 or ROW_TILE) activation rows' codes against four vectors of weight codes (codes[j]:
   the columns of 16 rows, a 32-bit lane a row), summed into sums[m][j]. */
static inline __attribute__((always_inline)) void dot_four_columns(
        int count, const int8_t *x_codes, int width, size_t column, const __m512i codes[4],
        __m512i sums[ROW_TILE][4]) {
    for (int m = 0; m < count; m++) {
        __m512i x = _mm512_set1_epi32(*(const int32_t *)(x_codes + (size_t)m * width + column));
        for (int j = 0; j < 4; j++) sums[m][j] = _mm512_dpbusd_epi32(sums[m][j], codes[j], x);
    }
}

static inline __attribute__((always_inline)) void zero_sums(int count, __m512i sums[ROW_TILE][4]) {
    for (int m = 0; m < count; m++)
        for (int j = 0; j < 4; j++) sums[m][j] = _mm512_setzero_si512();
}

/* A group's dot product in units of the activation scale: the high codes' sums, and with two codes the low ones'
   over LOW_STEPS. */
static inline __attribute__((always_inline)) __m512 code_dot(__m512i high_sums, __m512i low_sums, int two_codes) {
    __m512 high = _mm512_cvtepi32_ps(high_sums);
    return two_codes ? _mm512_fmadd_ps(_mm512_cvtepi32_ps(low_sums), _mm512_set1_ps(1.0f / LOW_STEPS), high) : high;
}

static inline __attribute__((always_inline)) void zero_totals(int count, __m512 total[ROW_TILE][4]) {
    for (int m = 0; m < count; m++)
        for (int j = 0; j < 4; j++) total[m][j] = _mm512_setzero_ps();
}

/* One block of 64 weight rows against `count` (1 or ROW_TILE) activation rows, one code a value or two (`low`
   read only then): y[m, row0 .. row0 + 63]. read_ahead: the call's first pass over the block, which asks for its
   bytes ahead (prefetch_ahead); later passes find them in cache. */
static inline __attribute__((always_inline)) void int4_block(
        int count, int two_codes, const int8_t *high, const int8_t *low, const float *scales, const float *code_totals,
        int width, const uint8_t *block, const uint8_t *block_scales, int rows, int group, float *y, int row0,
        int read_ahead) {
    const __m512i nibble = _mm512_set1_epi8(0x0F), first = lane_gather(0), second = lane_gather(16);
    const int groups = width / group;
    __m512 total[ROW_TILE][4];
    zero_totals(count, total);
    for (int g = 0; g < groups; g++) {
        __m512i high_sums[ROW_TILE][4], low_sums[ROW_TILE][4];
        zero_sums(count, high_sums);
        if (two_codes) zero_sums(count, low_sums);
        const uint8_t *bytes = block + (size_t)g * group * 32;
        for (int k = 0; k < group; k += 4) {
            if (read_ahead) prefetch_ahead(bytes + k * 32, 2);
            __m512i two = _mm512_loadu_si512(bytes + k * 32), next = _mm512_loadu_si512(bytes + k * 32 + 64);
            __m512i rows_a = _mm512_permutex2var_epi8(two, first, next);   /* rows 0-15 low, 32-47 high nibbles */
            __m512i rows_b = _mm512_permutex2var_epi8(two, second, next);  /* rows 16-31 low, 48-63 high */
            __m512i codes[4] = {_mm512_and_si512(rows_a, nibble), _mm512_and_si512(rows_b, nibble),
                                _mm512_and_si512(_mm512_srli_epi16(rows_a, 4), nibble),
                                _mm512_and_si512(_mm512_srli_epi16(rows_b, 4), nibble)};
            dot_four_columns(count, high, width, (size_t)g * group + k, codes, high_sums);
            if (two_codes) dot_four_columns(count, low, width, (size_t)g * group + k, codes, low_sums);
        }
        for (int j = 0; j < 4; j++) {  /* codes[j] held rows 16j .. 16j + 15 */
            __m512 scale, offset;
            group_scale_and_offset(block_scales, g, j, &scale, &offset);
            for (int m = 0; m < count; m++) {
                size_t at = (size_t)m * groups + g;
                __m512 dot = code_dot(high_sums[m][j], low_sums[m][j], two_codes);
                __m512 x_scale = _mm512_set1_ps(scales[at]);
                dot = _mm512_fmadd_ps(offset, _mm512_set1_ps(code_totals[at]), _mm512_mul_ps(dot, scale));
                total[m][j] = _mm512_fmadd_ps(dot, x_scale, total[m][j]);
            }
        }
    }
    for (int m = 0; m < count; m++)
        for (int j = 0; j < 4; j++) _mm512_storeu_ps(y + (size_t)m * rows + row0 + 16 * j, total[m][j]);
}

/* Calls of STRIP_ROWS activation rows or more (prompt chunks) take the weights a strip of 32 rows at a time: half a
   block, rows 16h .. 16h + 15 in the low nibbles of one byte gather and 32 + 16h .. 47 + 16h in its high ones. A pass
   over a strip takes STRIP_TILE activation rows (one code a value; STRIP_TILE_TWO with two), so each gather and
   mask serves that many rows' dot products, and a strip (K * 16 bytes) stays in a core's L2 cache across passes. */
#define STRIP_ROWS 16
#define STRIP_TILE 6
#define STRIP_TILE_TWO 4

/* Half `half` of a block's scales (kernels_common.h's int4 scales, the block's from block_scales) as floats
   [groups, 2, 2, 16]: for group g and j (rows 16 half + 32 j ..), 16 scales, then their 16 offsets. Decoded once for
   all of a call's tiles. */
static void unpack_strip_scales(const uint8_t *block_scales, int groups, int half, float *floats) {
    for (int g = 0; g < groups; g++)
        for (int j = 0; j < 2; j++) {
            __m512 scale, offset;
            group_scale_and_offset(block_scales, g, half + 2 * j, &scale, &offset);
            _mm512_storeu_ps(floats + (size_t)(2 * g + j) * 32, scale);
            _mm512_storeu_ps(floats + (size_t)(2 * g + j) * 32 + 16, offset);
        }
}

/* Half `half` of a block against `count` (at most STRIP_TILE) activation rows, one code a value or two:
   y[m, row0 + 16 half ..] and y[m, row0 + 32 + 16 half ..], 16 each. strip_floats: that half's scales and offsets
   (unpack_strip_scales). */
static inline __attribute__((always_inline)) void int4_half_block(
        int count, int two_codes, const int8_t *high, const int8_t *low, const float *scales, const float *code_totals,
        int width, const uint8_t *block, const float *strip_floats, int rows, int group, float *y, int row0,
        int half) {
    const __m512i nibble = _mm512_set1_epi8(0x0F), gather = lane_gather(16 * half);
    const int groups = width / group;
    __m512 total[STRIP_TILE][2];
    for (int m = 0; m < count; m++) total[m][0] = total[m][1] = _mm512_setzero_ps();
    for (int g = 0; g < groups; g++) {
        __m512i high_sums[STRIP_TILE][2], low_sums[STRIP_TILE][2];
        for (int m = 0; m < count; m++) {
            high_sums[m][0] = high_sums[m][1] = _mm512_setzero_si512();
            if (two_codes) low_sums[m][0] = low_sums[m][1] = _mm512_setzero_si512();
        }
        const uint8_t *bytes = block + (size_t)g * group * 32;
        const size_t first_column = (size_t)g * group;
        for (int k = 0; k < group; k += 4) {
            __m512i both = _mm512_permutex2var_epi8(_mm512_loadu_si512(bytes + k * 32), gather,
                                                    _mm512_loadu_si512(bytes + k * 32 + 64));
            __m512i codes[2] = {_mm512_and_si512(both, nibble), _mm512_and_si512(_mm512_srli_epi16(both, 4), nibble)};
            for (int m = 0; m < count; m++) {
                __m512i x = _mm512_set1_epi32(*(const int32_t *)(high + (size_t)m * width + first_column + k));
                high_sums[m][0] = _mm512_dpbusd_epi32(high_sums[m][0], codes[0], x);
                high_sums[m][1] = _mm512_dpbusd_epi32(high_sums[m][1], codes[1], x);
                if (two_codes) {
                    __m512i x_low = _mm512_set1_epi32(*(const int32_t *)(low + (size_t)m * width + first_column + k));
                    low_sums[m][0] = _mm512_dpbusd_epi32(low_sums[m][0], codes[0], x_low);
                    low_sums[m][1] = _mm512_dpbusd_epi32(low_sums[m][1], codes[1], x_low);
                }
            }
        }
        for (int j = 0; j < 2; j++) {  /* j = 0: rows 16 half + i; j = 1: rows 32 + 16 half + i */
            const __m512 scale = _mm512_loadu_ps(strip_floats + (size_t)(2 * g + j) * 32);
            const __m512 offset = _mm512_loadu_ps(strip_floats + (size_t)(2 * g + j) * 32 + 16);
            for (int m = 0; m < count; m++) {
                size_t at = (size_t)m * groups + g;
                __m512 dot = code_dot(high_sums[m][j], two_codes ? low_sums[m][j] : high_sums[m][j], two_codes);
                dot = _mm512_fmadd_ps(offset, _mm512_set1_ps(code_totals[at]), _mm512_mul_ps(dot, scale));
                total[m][j] = _mm512_fmadd_ps(dot, _mm512_set1_ps(scales[at]), total[m][j]);
            }
        }
    }
    for (int m = 0; m < count; m++)
        for (int j = 0; j < 2; j++)
            _mm512_storeu_ps(y + (size_t)m * rows + row0 + 16 * half + 32 * j, total[m][j]);
}

/* int4_matmul's product for many rows, the activations already in codes: OpenMP over strips of 32 weight rows, each
   meeting every activation row STRIP_TILE (or STRIP_TILE_TWO) at a time. */
static void int4_matmul_strips(int count, int width, const int8_t *high, const int8_t *low, const float *scales,
                               const float *code_totals, const uint8_t *packed, const uint8_t *group_scales,
                               int rows, int group, float *y) {
    const int strips = rows / (BLOCK_ROWS / 2), groups = width / group, tile = low ? STRIP_TILE_TWO : STRIP_TILE;
    #pragma omp parallel
    {
        float *strip_floats = malloc((size_t)groups * 4 * 16 * sizeof(float));
        #pragma omp for schedule(static)
        for (int s = 0; s < strips; s++) {
            const int b = s / 2, half = s % 2;
            const uint8_t *block = packed + (size_t)b * BLOCK_ROWS * (width / 2);
            unpack_strip_scales(group_scales + (size_t)b * int4_scale_bytes(groups), groups, half, strip_floats);
            for (int m = 0; m < count; m += tile) {
                const int n = count - m < tile ? count - m : tile;
                size_t x_at = (size_t)m * width, group_at = (size_t)m * groups;
                #define STRIP_PASS(tile_rows, two) int4_half_block(tile_rows, two, high + x_at, two ? low + x_at : NULL, \
                                                                   scales + group_at, code_totals + group_at, width, \
                                                                   block, strip_floats, rows, group, \
                                                                   y + (size_t)m * rows, b * BLOCK_ROWS, half)
                if (low) {
                    switch (n) {
                        case 4: STRIP_PASS(4, 1); break;
                        case 3: STRIP_PASS(3, 1); break;
                        case 2: STRIP_PASS(2, 1); break;
                        default: STRIP_PASS(1, 1);
                    }
                } else {
                    switch (n) {
                        case 6: STRIP_PASS(6, 0); break;
                        case 5: STRIP_PASS(5, 0); break;
                        case 4: STRIP_PASS(4, 0); break;
                        case 3: STRIP_PASS(3, 0); break;
                        case 2: STRIP_PASS(2, 0); break;
                        default: STRIP_PASS(1, 0);
                    }
                }
                #undef STRIP_PASS
            }
        }
        free(strip_floats);
    }
}

/* y [M, N] = x [M, K] . W^T for W [N, K] in the int4 layout (N a multiple of 64, K of group, group of 4);
   group_scales: each block's (kernels_common.h's int4 scales) in turn, read in order as its codes are. codes: 1 or
   2 int8 codes an activation (quantize_activations). scratch: M * (2K + 8K / group) bytes. */
void int4_matmul(const float *x, int count, int width, const uint8_t *packed, const uint8_t *group_scales,
                 int rows, int group, int codes, void *scratch, float *y) {
    const int blocks = rows / BLOCK_ROWS, groups = width / group, two_codes = codes == 2;
    int8_t *high = (int8_t *)scratch, *low = high + (size_t)count * width;
    float *scales = (float *)(low + (size_t)count * width), *code_totals = scales + (size_t)count * groups;
    if (count >= STRIP_ROWS) {
        #pragma omp parallel for schedule(static)
        for (int m = 0; m < count; m++)
            quantize_activations(x + (size_t)m * width, 1, width, group, high + (size_t)m * width,
                                 two_codes ? low + (size_t)m * width : NULL, scales + (size_t)m * groups,
                                 code_totals + (size_t)m * groups);
        int4_matmul_strips(count, width, high, two_codes ? low : NULL, scales, code_totals, packed, group_scales,
                           rows, group, y);
        return;
    }
    quantize_activations(x, count, width, group, high, two_codes ? low : NULL, scales, code_totals);
    #pragma omp parallel for schedule(dynamic, blocks_a_take(blocks)) if (blocks > 1)
    for (int b = 0; b < blocks; b++) {
        const uint8_t *block = packed + (size_t)b * BLOCK_ROWS * (width / 2);
        const uint8_t *block_scales = group_scales + (size_t)b * int4_scale_bytes(groups);
        for (int m = 0; m < count; m += ROW_TILE) {
            size_t x_at = (size_t)m * width, group_at = (size_t)m * groups;
            const int8_t *row_low = two_codes ? low + x_at : NULL;
            float *out = y + (size_t)m * rows;
            #define INT4_ROWS(tile, two) int4_block(tile, two, high + x_at, row_low, scales + group_at, \
                                                    code_totals + group_at, width, block, block_scales, rows, group, \
                                                    out, b * BLOCK_ROWS, m == 0)
            if (count - m >= ROW_TILE) {
                if (two_codes) INT4_ROWS(ROW_TILE, 1); else INT4_ROWS(ROW_TILE, 0);
            } else {
                if (two_codes) INT4_ROWS(1, 1); else INT4_ROWS(1, 0);
            }
            #undef INT4_ROWS
        }
    }
}

/* One block of 64 int8 weight rows against `count` (1 or ROW_TILE) activation rows, one code a value or two (`low`
   read only then): y[m, row0 .. row0 + 63]. code_totals [M, K / 32]: each group's codes summed, which take the
   offset out. read_ahead: as int4_block's. */
static inline __attribute__((always_inline)) void int8_block(
        int count, int two_codes, const int8_t *high, const int8_t *low, const float *scales, const float *code_totals,
        int width, const uint8_t *block, const uint16_t *weight_scales, int rows, float *y, int read_ahead) {
    const int groups = width / INT8_GROUP;
    __m512 total[ROW_TILE][4];
    zero_totals(count, total);
    for (int g = 0; g < groups; g++) {
        __m512i high_sums[ROW_TILE][4], low_sums[ROW_TILE][4];
        zero_sums(count, high_sums);
        zero_sums(count, low_sums);  /* also with one code: the compiler cannot tell they then go unread */
        const uint8_t *bytes = block + (size_t)g * INT8_GROUP * BLOCK_ROWS;
        for (int k = 0; k < INT8_GROUP; k += 4) {
            __m512i codes[4];  /* codes[j]: columns k .. k + 3 of rows 16j .. 16j + 15, a 32-bit lane a row */
            if (read_ahead) prefetch_ahead(bytes + (size_t)k * BLOCK_ROWS, 4);
            for (int j = 0; j < 4; j++) codes[j] = _mm512_loadu_si512(bytes + (size_t)k * BLOCK_ROWS + 64 * j);
            dot_four_columns(count, high, width, (size_t)g * INT8_GROUP + k, codes, high_sums);
            if (two_codes) dot_four_columns(count, low, width, (size_t)g * INT8_GROUP + k, codes, low_sums);
        }
        const uint16_t *group_scales = weight_scales + (size_t)g * BLOCK_ROWS;
        for (int j = 0; j < 4; j++) {
            __m512 scale = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(group_scales + 16 * j)));
            for (int m = 0; m < count; m++) {
                size_t at = (size_t)m * groups + g;
                __m512 dot = code_dot(high_sums[m][j], low_sums[m][j], two_codes);
                dot = _mm512_sub_ps(dot, _mm512_set1_ps(INT8_OFFSET * code_totals[at]));
                total[m][j] = _mm512_fmadd_ps(dot, _mm512_mul_ps(scale, _mm512_set1_ps(scales[at])), total[m][j]);
            }
        }
    }
    for (int m = 0; m < count; m++)
        for (int j = 0; j < 4; j++) _mm512_storeu_ps(y + (size_t)m * rows + 16 * j, total[m][j]);
}

/* y [M, N] = x [M, K] . W^T for W [N, K] in the int8 layout (N a multiple of 64, K of 32): packed [N / 64, K / 4,
   4, 16, 4] uint8 holds q + 128 (block, four columns, 16 rows of the block's four, a row's four columns) and
   weight_scales [N / 64, K / 32, 64] fp16, w = q * scale. codes: 1 or 2 int8 codes an activation (int4_matmul's).
   scratch: M * (2K + 8K / 32) bytes. */
void int8_matmul(const float *x, int count, int width, const uint8_t *packed, const uint16_t *weight_scales,
                 int rows, int codes, void *scratch, float *y) {
    const int blocks = rows / BLOCK_ROWS, groups = width / INT8_GROUP, two_codes = codes == 2;
    int8_t *high = (int8_t *)scratch, *low = high + (size_t)count * width;
    float *scales = (float *)(low + (size_t)count * width), *code_totals = scales + (size_t)count * groups;
    quantize_activations(x, count, width, INT8_GROUP, high, two_codes ? low : NULL, scales, code_totals);
    #pragma omp parallel for schedule(dynamic, blocks_a_take(blocks)) if (blocks > 1)
    for (int b = 0; b < blocks; b++) {
        const uint8_t *block = packed + (size_t)b * BLOCK_ROWS * width;
        const uint16_t *block_scales = weight_scales + (size_t)b * groups * BLOCK_ROWS;
        for (int m = 0; m < count; m += ROW_TILE) {
            size_t x_at = (size_t)m * width, group_at = (size_t)m * groups;
            float *out = y + (size_t)m * rows + (size_t)b * BLOCK_ROWS;
            if (count - m >= ROW_TILE)
                int8_block(ROW_TILE, two_codes, high + x_at, low + x_at, scales + group_at, code_totals + group_at,
                           width, block, block_scales, rows, out, m == 0);
            else
                int8_block(1, two_codes, high + x_at, low + x_at, scales + group_at, code_totals + group_at, width,
                           block, block_scales, rows, out, m == 0);
        }
    }
}

/* e^x for x <= 0, to fp32's precision: 2^(x log2 e) as 2^n (vscalefps) times a degree-6 polynomial of 2^f, |f| <= 1/2
   (the Taylor series of e^(f ln 2): its first term left out is below 2e-7 of the result). */
static inline __m512 exp_of_negative(__m512 x) {
    __m512 t = _mm512_mul_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.0f)), _mm512_set1_ps(1.44269504089f));
    __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(t, n);
    static const float terms[] = {1.540353e-4f, 1.3333558e-3f, 9.6181291e-3f, 5.5504109e-2f, 0.24022651f, 0.69314718f, 1.0f};
    __m512 power = _mm512_set1_ps(terms[0]);
    for (int i = 1; i < 7; i++) power = _mm512_fmadd_ps(power, f, _mm512_set1_ps(terms[i]));
    return _mm512_scalef_ps(power, n);
}

/* Decode row i's attention for kv head h (decode_attention's arguments), its K/V rows bf16 or, with int8, int8 rows
   (kv_row_bytes): inlined with int8 a constant, so each format's loop is its own. */
static inline __attribute__((always_inline)) void decode_task(
        const float *q, float *out, const uint8_t *layer, const int32_t *rows, const int32_t *first_run,
        const int32_t *runs, int heads, int kv_heads, int head_dim, int64_t positions, const float *sinks,
        int i, int h, int int8) {
    const int groups = heads / kv_heads, vectors = head_dim / 16;
    const size_t row = kv_row_bytes(head_dim, int8);
    const float *queries = q + ((size_t)rows[i] * heads + (size_t)h * groups) * head_dim;
    const uint8_t *keys = layer + (size_t)h * positions * row;
    const uint8_t *values = layer + ((size_t)kv_heads + h) * positions * row;
    __m512 query[MAX_GROUPS][MAX_HEAD_DIM / 16], acc[MAX_GROUPS][MAX_HEAD_DIM / 16];
    float best[MAX_GROUPS], weight_sum[MAX_GROUPS], score[MAX_GROUPS][POSITIONS];
    for (int g = 0; g < groups; g++) {
        best[g] = -INFINITY;
        weight_sum[g] = 0.0f;
        for (int v = 0; v < vectors; v++) {
            query[g][v] = _mm512_loadu_ps(queries + (size_t)g * head_dim + 16 * v);
            acc[g][v] = _mm512_setzero_ps();
        }
    }
    for (int j = first_run[i]; j < first_run[i + 1]; j++)
        for (int64_t start = runs[2 * j]; start < runs[2 * j + 1]; start += POSITIONS) {
            int count = (int)(runs[2 * j + 1] - start < POSITIONS ? runs[2 * j + 1] - start : POSITIONS);
            for (int p = 0; p < count; p++) {
                const uint8_t *key_row = keys + (size_t)(start + p) * row;
                __m512 key[MAX_HEAD_DIM / 16];
                for (int v = 0; v < vectors; v++) key[v] = kv_load(key_row, v, head_dim, int8);
                for (int g = 0; g < groups; g++) {
                    __m512 dot = _mm512_mul_ps(query[g][0], key[0]);
                    for (int v = 1; v < vectors; v++) dot = _mm512_fmadd_ps(query[g][v], key[v], dot);
                    score[g][p] = _mm512_reduce_add_ps(dot);
                }
            }
            for (int g = 0; g < groups; g++) {
                float most = best[g];
                for (int p = 0; p < count; p += 16) {
                    __mmask16 valid = _cvtu32_mask16(count - p >= 16 ? 0xFFFFu : (1u << (count - p)) - 1);
                    most = fmaxf(most, _mm512_mask_reduce_max_ps(valid, _mm512_maskz_loadu_ps(valid, score[g] + p)));
                }
                float kept = expf(best[g] - most);  /* 0 at the first tile */
                __m512 tile_sum = _mm512_setzero_ps();
                for (int p = 0; p < count; p += 16) {
                    __mmask16 valid = _cvtu32_mask16(count - p >= 16 ? 0xFFFFu : (1u << (count - p)) - 1);
                    __m512 weight = exp_of_negative(_mm512_sub_ps(_mm512_maskz_loadu_ps(valid, score[g] + p),
                                                                  _mm512_set1_ps(most)));
                    _mm512_mask_storeu_ps(score[g] + p, valid, weight);
                    tile_sum = _mm512_mask_add_ps(tile_sum, valid, tile_sum, weight);
                }
                weight_sum[g] = weight_sum[g] * kept + _mm512_reduce_add_ps(tile_sum);
                for (int v = 0; v < vectors; v++) acc[g][v] = _mm512_mul_ps(acc[g][v], _mm512_set1_ps(kept));
                best[g] = most;
            }
            for (int p = 0; p < count; p++) {
                const uint8_t *value = values + (size_t)(start + p) * row;
                for (int v = 0; v < vectors; v++) {
                    __m512 part = kv_load(value, v, head_dim, int8);
                    for (int g = 0; g < groups; g++)
                        acc[g][v] = _mm512_fmadd_ps(_mm512_set1_ps(score[g][p]), part, acc[g][v]);
                }
            }
        }
    for (int g = 0; g < groups; g++) {
        float *target = out + ((size_t)rows[i] * heads + (size_t)h * groups + g) * head_dim;
        __m512 inverse = _mm512_set1_ps(softmax_inverse(best[g], weight_sum[g], sinks, h * groups + g));
        for (int v = 0; v < vectors; v++) _mm512_storeu_ps(target + 16 * v, _mm512_mul_ps(acc[g][v], inverse));
    }
}

/* Decode attention over a block pool's layer [2, Hkv, P, hd] bf16 (keys, then values; hd a multiple of 16): query row
   rows[i] of q [R, H, hd] (already scaled) attends to the positions runs[2j] .. runs[2j + 1] - 1 for first_run[i]
   <= j < first_run[i + 1], in order; query head h uses kv head h / (H / Hkv). out [R, H, hd]. The softmax runs
   over tiles of positions with a running maximum, so every position is read once; sinks [H] (NULL: none) join its
   denominator (softmax_inverse). */
void decode_attention(const float *q, float *out, const uint16_t *layer, const int32_t *rows, int row_count,
                      const int32_t *first_run, const int32_t *runs, int heads, int kv_heads, int head_dim,
                      int64_t positions, const float *sinks) {
    #pragma omp parallel for collapse(2) schedule(static) if (row_count * kv_heads > 1)
    for (int i = 0; i < row_count; i++)
        for (int h = 0; h < kv_heads; h++)
            decode_task(q, out, (const uint8_t *)layer, rows, first_run, runs, heads, kv_heads, head_dim, positions,
                        sinks, i, h, 0);
}

/* decode_attention over an int8 pool's layer [2, Hkv, P, row] (kv_row_bytes; hd a multiple of 32): each row's codes
   times its scales in fp32 as they are read, the sums in fp32. */
void decode_attention_q8(const float *q, float *out, const uint8_t *layer, const int32_t *rows, int row_count,
                         const int32_t *first_run, const int32_t *runs, int heads, int kv_heads, int head_dim,
                         int64_t positions, const float *sinks) {
    #pragma omp parallel for collapse(2) schedule(static) if (row_count * kv_heads > 1)
    for (int i = 0; i < row_count; i++)
        for (int h = 0; h < kv_heads; h++)
            decode_task(q, out, layer, rows, first_run, runs, heads, kv_heads, head_dim, positions, sinks, i, h, 1);
}

/* out [M, K] = x [M, K] over each row's root mean square (the norm's own weight is the next matmul's). */
void rms_norm(const float *x, int rows, int width, float eps, float *out) {
    #pragma omp parallel for schedule(static) if (rows >= 64)
    for (int m = 0; m < rows; m++) {
        const float *row = x + (size_t)m * width;
        float squares = 0.0f;
        #pragma omp simd reduction(+ : squares)
        for (int k = 0; k < width; k++) squares += row[k] * row[k];
        float scale = 1.0f / sqrtf(squares / (float)width + eps);
        #pragma omp simd
        for (int k = 0; k < width; k++) out[(size_t)m * width + k] = row[k] * scale;
    }
}

/* 16 values of x (8 pairs) times their complex numbers turns [8, 2] (cos, sin), pair by pair:
   (x0 cos - x1 sin, x1 cos + x0 sin). */
static inline __m512 rotated_pairs(const float *x, const float *turns) {
    __m512 v = _mm512_loadu_ps(x), turn = _mm512_loadu_ps(turns);
    __m512 swapped_sin = _mm512_mul_ps(_mm512_permute_ps(v, 0xB1), _mm512_movehdup_ps(turn));  /* x1 s, x0 s */
    return _mm512_fmaddsub_ps(v, _mm512_moveldup_ps(turn), swapped_sin);
}

/* A step row's queries [heads, hd] rotated in place by its turns [hd] (rotated_pairs). */
static inline void rotate_queries(float *row, const float *turn, int heads, int head_dim) {
    for (int h = 0; h < heads; h++)
        for (int k = 0; k < head_dim; k += 16)
            _mm512_storeu_ps(row + (size_t)h * head_dim + k, rotated_pairs(row + (size_t)h * head_dim + k, turn + k));
}

/* A step's new rows: qkv [S, H + 2Hkv, hd] (each row's queries, keys and values), turns [S, hd / 2, 2], slots [S]
   (each row's position in the layer's pool). The queries are rotated in place, the keys rotated into layer
   [2, Hkv, P, hd] bf16 (its keys, then its values) at their slots and the values stored there, both rounded to
   nearest even: one pass where PyTorch took a complex multiply and a strided copy. */
void rotate_and_store(float *qkv, const float *turns, int rows, int heads, int kv_heads, int head_dim, uint16_t *layer,
                      int64_t positions, const int64_t *slots) {
    const int width = (heads + 2 * kv_heads) * head_dim;
    #pragma omp parallel for schedule(static) if (rows >= 16)
    for (int s = 0; s < rows; s++) {
        float *row = qkv + (size_t)s * width;
        const float *turn = turns + (size_t)s * head_dim;
        rotate_queries(row, turn, heads, head_dim);
        for (int h = 0; h < kv_heads; h++) {
            size_t at = ((size_t)h * positions + (size_t)slots[s]) * head_dim;
            const float *key = row + (size_t)(heads + h) * head_dim, *value = key + (size_t)kv_heads * head_dim;
            uint16_t *values = layer + (size_t)kv_heads * positions * head_dim;
            for (int k = 0; k < head_dim; k += 16) {
                bf16_store(layer + at + k, rotated_pairs(key + k, turn + k));
                bf16_store(values + at + k, _mm512_loadu_ps(value + k));
            }
        }
    }
}

/* rotate_and_store into an int8 pool's layer [2, Hkv, P, row] (kv_row_bytes; hd a multiple of 32): the rotated keys
   and the values quantized to int8 rows (quantize_kv_row), their scales rounded to fp16. */
void rotate_and_store_q8(float *qkv, const float *turns, int rows, int heads, int kv_heads, int head_dim,
                         uint8_t *layer, int64_t positions, const int64_t *slots) {
    const int width = (heads + 2 * kv_heads) * head_dim;
    const size_t row_bytes = kv_row_bytes(head_dim, 1);
    #pragma omp parallel for schedule(static) if (rows >= 16)
    for (int s = 0; s < rows; s++) {
        float *row = qkv + (size_t)s * width;
        const float *turn = turns + (size_t)s * head_dim;
        rotate_queries(row, turn, heads, head_dim);
        for (int h = 0; h < kv_heads; h++) {
            size_t at = ((size_t)h * positions + (size_t)slots[s]) * row_bytes;
            const float *key = row + (size_t)(heads + h) * head_dim, *value = key + (size_t)kv_heads * head_dim;
            float rotated[MAX_HEAD_DIM];
            for (int k = 0; k < head_dim; k += 16) _mm512_storeu_ps(rotated + k, rotated_pairs(key + k, turn + k));
            kv_store_int8(layer + at, rotated, head_dim);
            kv_store_int8(layer + (size_t)kv_heads * positions * row_bytes + at, value, head_dim);
        }
    }
}

/* out [M, F] = g * sigmoid(alpha g) * (u + shift) for gate_up [M, 2F] (each row its gate, then its up; F a multiple
   of 16), g its gate clamped from above at limit, u its up clamped to [-limit, limit]: SwiGLU with limit = inf,
   alpha = 1, shift = 0; gpt-oss's clamped gate otherwise (family.Clamp, shift = 1). sigmoid(a) = 1 / (1 + e^-a), or
   e^a / (1 + e^a) for a < 0, so e's argument is never positive. A NaN stays a NaN. */
void swiglu(const float *gate_up, int rows, int width, float limit, float alpha, float shift, float *out) {
    const __m512 high = _mm512_set1_ps(limit), low = _mm512_set1_ps(-limit);
    #pragma omp parallel for schedule(static) if (rows >= 16)
    for (int m = 0; m < rows; m++) {
        const float *gate = gate_up + (size_t)m * 2 * width, *up = gate + width;
        for (int k = 0; k < width; k += 16) {
            __m512 g = _mm512_min_ps(high, _mm512_loadu_ps(gate + k));  /* the second operand where one is NaN */
            __m512 a = _mm512_mul_ps(g, _mm512_set1_ps(alpha));
            __m512 e = exp_of_negative(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(a)));  /* e^-|a| */
            __mmask16 negative = _mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_LT_OQ);
            __m512 numerator = _mm512_mask_blend_ps(negative, _mm512_set1_ps(1.0f), e);
            __m512 sigmoid = _mm512_div_ps(numerator, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
            __m512 u = _mm512_max_ps(low, _mm512_min_ps(high, _mm512_loadu_ps(up + k)));
            _mm512_storeu_ps(out + (size_t)m * width + k,
                             _mm512_mul_ps(_mm512_mul_ps(g, sigmoid), _mm512_add_ps(u, _mm512_set1_ps(shift))));
        }
    }
}

#define CHUNK_QUERIES 32  /* a chunk task's queries (rows times query heads of one kv head): two vectors */
#define KEYS_AT_ONCE 8    /* positions scored together: 16 running sums beside the two query vectors */
#define DIMS_AT_ONCE 8    /* value dimensions summed together, likewise */

/* The scores of `m` (at most KEYS_AT_ONCE) consecutive keys against a chunk task's queries: sums[p][v]. Inlined
   with m a constant for whole groups of keys, so that the sums stay in registers. */
static inline __attribute__((always_inline)) void score_keys(const float *keys, int m, int head_dim,
                                                             const float (*qt)[CHUNK_QUERIES],
                                                             __m512 sums[KEYS_AT_ONCE][2]) {
    for (int p = 0; p < KEYS_AT_ONCE; p++) sums[p][0] = sums[p][1] = _mm512_setzero_ps();
    for (int d = 0; d < head_dim; d++) {
        __m512 q0 = _mm512_load_ps(qt[d]), q1 = _mm512_load_ps(qt[d] + 16);
        for (int p = 0; p < m; p++) {
            __m512 k = _mm512_set1_ps(keys[p * head_dim + d]);
            sums[p][0] = _mm512_fmadd_ps(q0, k, sums[p][0]);
            sums[p][1] = _mm512_fmadd_ps(q1, k, sums[p][1]);
        }
    }
}

/* Runs a chunk task's score and value sums over the positions slot .. slot + n - 1 (logical positions logical ..),
   their keys and values (bf16, or int8 rows) widened to fp32 once (a broadcast from bf16 in the inner loops costs
   twice the time). qt [hd][32]: the task's queries, transposed; acc [hd][32]: its weighted values; best, total: per
   query. */
static void chunk_tile(const uint8_t *key_rows, const uint8_t *value_rows, int int8, int64_t slot, int n,
                       int64_t logical, int head_dim, const float (*qt)[CHUNK_QUERIES], float (*acc)[CHUNK_QUERIES],
                       const __m512i limit[2], const __m512i low[2], __m512 best[2], __m512 total[2]) {
    float keys[POSITIONS * MAX_HEAD_DIM], values[POSITIONS * MAX_HEAD_DIM];  /* the tile's, widened once */
    const size_t row = kv_row_bytes(head_dim, int8);
    kv_widen(key_rows + slot * row, n, head_dim, int8, keys);
    kv_widen(value_rows + slot * row, n, head_dim, int8, values);
    __m512 score[POSITIONS][2];
    for (int p0 = 0; p0 < n; p0 += KEYS_AT_ONCE) {
        int m = n - p0 < KEYS_AT_ONCE ? n - p0 : KEYS_AT_ONCE;
        __m512 sums[KEYS_AT_ONCE][2];
        if (m == KEYS_AT_ONCE)
            score_keys(keys + p0 * head_dim, KEYS_AT_ONCE, head_dim, qt, sums);
        else
            score_keys(keys + p0 * head_dim, m, head_dim, qt, sums);
        for (int p = 0; p < m; p++)
            for (int v = 0; v < 2; v++) {  /* a query sees the positions from its low on, before its limit */
                __m512i position = _mm512_set1_epi32((int)(logical + p0 + p));
                __mmask16 seen = _mm512_mask_cmpgt_epi32_mask(_mm512_cmple_epi32_mask(low[v], position), limit[v],
                                                              position);
                score[p0 + p][v] = _mm512_mask_blend_ps(seen, _mm512_set1_ps(-INFINITY), sums[p][v]);
            }
    }
    __m512 kept[2];
    for (int v = 0; v < 2; v++) {
        __m512 most = best[v];
        for (int p = 0; p < n; p++) most = _mm512_max_ps(most, score[p][v]);
        kept[v] = exp_of_negative(_mm512_sub_ps(best[v], most));  /* 0 at the first tile */
        total[v] = _mm512_mul_ps(total[v], kept[v]);
        for (int p = 0; p < n; p++) {
            score[p][v] = exp_of_negative(_mm512_sub_ps(score[p][v], most));
            total[v] = _mm512_add_ps(total[v], score[p][v]);
        }
        best[v] = most;
    }
    for (int d0 = 0; d0 < head_dim; d0 += DIMS_AT_ONCE) {  /* 16 running sums: 8 dimensions of both vectors */
        __m512 sums[DIMS_AT_ONCE][2];
        for (int i = 0; i < DIMS_AT_ONCE; i++)
            for (int v = 0; v < 2; v++) sums[i][v] = _mm512_mul_ps(_mm512_load_ps(acc[d0 + i] + 16 * v), kept[v]);
        for (int p = 0; p < n; p++) {
            const float *value = values + p * head_dim + d0;
            for (int i = 0; i < DIMS_AT_ONCE; i++) {
                __m512 part = _mm512_set1_ps(value[i]);
                sums[i][0] = _mm512_fmadd_ps(score[p][0], part, sums[i][0]);
                sums[i][1] = _mm512_fmadd_ps(score[p][1], part, sums[i][1]);
            }
        }
        for (int i = 0; i < DIMS_AT_ONCE; i++)
            for (int v = 0; v < 2; v++) _mm512_store_ps(acc[d0 + i] + 16 * v, sums[i][v]);
    }
}

/* A prompt chunk's attention over a block pool's layer [2, Hkv, P, hd] bf16 (with int8, int8 rows: kv_row_bytes):
   rows first_row .. first_row + count - 1 of q [R, H, hd] (already scaled), row r at position start + r counted from
   the first position the runs hold, each attending to the positions up to its own (with window > 0 only the last
   `window` of them), which lie in the runs runs[2j] .. runs[2j + 1] - 1 (j < run_count, in order). Each task takes
   one kv head and a few rows, its queries in the lanes of two vectors: a key's value is broadcast against all of
   them, so nothing is transposed and the causal limit (and the window's start) is a compare per lane. */
static void chunk_attention_rows(const float *q, float *out, const uint8_t *layer, int int8, int first_row, int count,
                                 int start, const int32_t *runs, int run_count, int heads, int kv_heads, int head_dim,
                                 int64_t positions, int window) {
    const int groups = heads / kv_heads;
    const int rows_per_task = CHUNK_QUERIES / groups;
    const int blocks = (count + rows_per_task - 1) / rows_per_task;
    const size_t row = kv_row_bytes(head_dim, int8);
    #pragma omp parallel for collapse(2) schedule(static)
    for (int h = 0; h < kv_heads; h++)
        for (int b = 0; b < blocks; b++) {
            const int r0 = b * rows_per_task, r1 = r0 + rows_per_task < count ? r0 + rows_per_task : count;
            const int queries = (r1 - r0) * groups;
            const uint8_t *keys = layer + (size_t)h * positions * row;
            const uint8_t *values = layer + ((size_t)kv_heads + h) * positions * row;
            float qt[MAX_HEAD_DIM][CHUNK_QUERIES] __attribute__((aligned(64)));
            float acc[MAX_HEAD_DIM][CHUNK_QUERIES] __attribute__((aligned(64)));
            int32_t limits[CHUNK_QUERIES] __attribute__((aligned(64)));
            int32_t lows[CHUNK_QUERIES] __attribute__((aligned(64)));
            for (int j = 0; j < CHUNK_QUERIES; j++) {
                const float *query = q + ((size_t)(first_row + r0 + j / groups) * heads + (size_t)h * groups
                                          + j % groups) * head_dim;
                for (int d = 0; d < head_dim; d++) {
                    qt[d][j] = j < queries ? query[d] : 0.0f;
                    acc[d][j] = 0.0f;
                }
                limits[j] = j < queries ? start + r0 + j / groups + 1 : 1 << 30;  /* padding lanes see everything */
                lows[j] = j < queries && window > 0 ? limits[j] - window : -(1 << 30);
            }
            __m512i limit[2] = {_mm512_load_si512(limits), _mm512_load_si512(limits + 16)};
            __m512i low[2] = {_mm512_load_si512(lows), _mm512_load_si512(lows + 16)};
            __m512 best[2] = {_mm512_set1_ps(-INFINITY), _mm512_set1_ps(-INFINITY)};
            __m512 total[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
            const int64_t seen = start + r1;  /* positions the block's last row sees */
            int64_t logical = window_skip(runs, run_count, window > 0 ? start + r0 + 1 - window : 0);
            for (int j = 0; j < run_count && logical < seen; j++)
                for (int64_t slot = run_slot(runs, j, logical); slot < runs[2 * j + 1] && logical < seen;
                     slot += POSITIONS) {
                    int64_t n = runs[2 * j + 1] - slot;
                    n = n < POSITIONS ? n : POSITIONS;
                    n = n < seen - logical ? n : seen - logical;
                    chunk_tile(keys, values, int8, slot, (int)n, logical, head_dim,
                               (const float (*)[CHUNK_QUERIES])qt, acc, limit, low, best, total);
                    logical += n;
                }
            float totals[CHUNK_QUERIES] __attribute__((aligned(64)));
            _mm512_store_ps(totals, total[0]);
            _mm512_store_ps(totals + 16, total[1]);
            for (int j = 0; j < queries; j++) {
                float *target = out + ((size_t)(first_row + r0 + j / groups) * heads + (size_t)h * groups
                                       + j % groups) * head_dim;
                for (int d = 0; d < head_dim; d++) target[d] = acc[d][j] / totals[j];
            }
        }
}

void chunk_attention(const float *q, float *out, const uint16_t *layer, int first_row, int count, int start,
                     const int32_t *runs, int run_count, int heads, int kv_heads, int head_dim, int64_t positions,
                     int window) {
    chunk_attention_rows(q, out, (const uint8_t *)layer, 0, first_row, count, start, runs, run_count, heads, kv_heads,
                         head_dim, positions, window);
}

/* chunk_attention over an int8 pool's layer [2, Hkv, P, row] (kv_row_bytes; hd a multiple of 32): each tile's rows
   dequantized to fp32 once (codes times their scales), the sums in fp32. The AMX chunk kernel takes bf16 pools only:
   it would round these values to bf16 a second time. */
void chunk_attention_q8(const float *q, float *out, const uint8_t *layer, int first_row, int count, int start,
                        const int32_t *runs, int run_count, int heads, int kv_heads, int head_dim, int64_t positions,
                        int window) {
    chunk_attention_rows(q, out, layer, 1, first_row, count, start, runs, run_count, heads, kv_heads, head_dim,
                         positions, window);
}

/* Byte indices that take, from two vectors of 16 rows' four bytes (a 32-bit lane a row, bytes t0 .. t0 + 3, rows 0-15
   and then 16-31), bytes t0 + pair and t0 + pair + 1 of all 32 rows: 32 bytes a byte position, row by row. */
static inline __m512i rows_of_two_bytes(int pair) {
    uint8_t index[64];
    for (int k = 0; k < 64; k++) {
        int t = pair + k / 32, j = k % 32;
        index[k] = (uint8_t)(j < 16 ? 4 * j + t : 64 + 4 * (j - 16) + t);
    }
    return _mm512_loadu_si512(index);
}

/* A 4-bit GGUF type's nibble bytes of `rows` rows (a multiple of 64) into the CPU int4 layout (cpu_int4_layout.py):
   byte i of run r of a row (at row * row_stride + r * run_stride + i) holds its code 2Lr + i in the low nibble and
   2Lr + L + i in the high one; out [rows, K / 2] holds, per block of 64 rows, [K, 32] bytes, byte (k, j) row j's
   code k low and row j + 32's high (L a multiple of 4). One pass, a block at a time (its bytes stay in
   cache): four bytes of 32 rows in two gathers, laid out in four permutes. */
void int4_layout_from_nibbles(const uint8_t *nibbles, int rows, int runs, int length, int64_t row_stride,
                              int64_t run_stride, uint8_t *out) {
    const int blocks = rows / BLOCK_ROWS, half = BLOCK_ROWS / 2, width = runs * 2 * length;
    const __m512i low_nibbles = _mm512_set1_epi8(0x0F), high_nibbles = _mm512_set1_epi8((char)0xF0);
    const __m512i first_pair = rows_of_two_bytes(0), second_pair = rows_of_two_bytes(2);
    __m512i row_offsets = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                             _mm512_set1_epi32((int)row_stride));
    #pragma omp parallel for schedule(static)
    for (int b = 0; b < blocks; b++) {
        const uint8_t *low_rows = nibbles + (int64_t)b * BLOCK_ROWS * row_stride;
        const uint8_t *high_rows = low_rows + (int64_t)half * row_stride;
        uint8_t *block = out + (size_t)b * BLOCK_ROWS * (width / 2);
        for (int r = 0; r < runs; r++)
            for (int i = 0; i < length; i += 4) {  /* bytes i .. i + 3 of the run, 32 rows at a time in two gathers */
                const uint8_t *low_at = low_rows + r * run_stride + i, *high_at = high_rows + r * run_stride + i;
                __m512i low[2], high[2];
                for (int g = 0; g < 2; g++) {
                    low[g] = _mm512_i32gather_epi32(row_offsets, low_at + (int64_t)16 * g * row_stride, 1);
                    high[g] = _mm512_i32gather_epi32(row_offsets, high_at + (int64_t)16 * g * row_stride, 1);
                }
                __m512i first[2], second[2];  /* codes 2Lr + i ..: low nibbles of both rows; 2Lr + L + i ..: high */
                for (int g = 0; g < 2; g++) {
                    first[g] = _mm512_or_si512(_mm512_and_si512(low[g], low_nibbles),
                                               _mm512_and_si512(_mm512_slli_epi16(high[g], 4), high_nibbles));
                    second[g] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(low[g], 4), low_nibbles),
                                                _mm512_and_si512(high[g], high_nibbles));
                }
                uint8_t *first_out = block + ((size_t)r * 2 * length + i) * half;
                uint8_t *second_out = first_out + (size_t)length * half;
                _mm512_storeu_si512(first_out, _mm512_permutex2var_epi8(first[0], first_pair, first[1]));
                _mm512_storeu_si512(first_out + 64, _mm512_permutex2var_epi8(first[0], second_pair, first[1]));
                _mm512_storeu_si512(second_out, _mm512_permutex2var_epi8(second[0], first_pair, second[1]));
                _mm512_storeu_si512(second_out + 64, _mm512_permutex2var_epi8(second[0], second_pair, second[1]));
            }
    }
}

/* AMX's bf16 tiles (where the CPU has them, compiled with GCC 11+ or clang 12+): a 16-row tile of 64 bytes a row,
   eight tiles; tdpbf16ps adds A [16, 32] bf16 times B [32, 16] bf16 (two rows of B in each 32-bit lane, "VNNI"
   pairs) to C [16, 16] fp32. */
#define AMX_ROWS 16   /* activation rows a tile holds */
#define AMX_DEPTH 32  /* columns of x one tdpbf16ps sums: a tile row of bf16 */
#define STRIP 32      /* weight rows (output columns) a pass dequantizes: two B tiles wide */
#define TILE_VALUES 512  /* bf16 values a tile holds */
#define TILES_CACHE_BYTES (512 << 10)  /* a strip's dequantized tiles a pass over the strips keeps: 8 192 columns */

#if (defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11) || (defined(__clang__) && __clang_major__ >= 12)
#define HAS_AMX 1
#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512bf16")))
#else
#define AMX_TARGET
#endif

/* Asks Linux for the tile state (once a process, for every thread): 0 where granted, else -1 (no AMX, an older
   kernel, or a compiler without AMX). */
int amx_enable(void) {
#ifdef HAS_AMX
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0 ? 0 : -1;
#else
    return -1;
#endif
}

#ifdef HAS_AMX
typedef struct __attribute__((aligned(64))) {
    uint8_t palette, start_row, reserved[14];
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
} tile_config;

/* Every tile 16 rows of 64 bytes: 0-3 sums (C), 4-5 activations (A), 6-7 weights (B). */
static AMX_TARGET void configure_tiles(void) {
    tile_config config;
    memset(&config, 0, sizeof config);
    config.palette = 1;
    for (int t = 0; t < 8; t++) config.bytes_per_row[t] = 64, config.rows[t] = AMX_ROWS;
    _tile_loadconfig(&config);
}

/* Two fp32 vectors as one of bf16 pairs: lane i holds (a[i], b[i]), a in the low half. */
static inline __attribute__((always_inline)) AMX_TARGET __m512i bf16_pairs(__m512 a, __m512 b) {
    uint16_t index[32];
    for (int i = 0; i < 16; i++) index[2 * i] = (uint16_t)i, index[2 * i + 1] = (uint16_t)(16 + i);
    return _mm512_permutexvar_epi16(_mm512_loadu_si512(index), (__m512i)_mm512_cvtne2ps_pbh(b, a));
}

/* The weights of one strip: rows 32 * half .. + 31 of a block (the low nibbles of its bytes, or the high). */
typedef struct {
    const uint8_t *block;
    const uint8_t *block_scales;
    int group, half;
} weight_strip;

/* Columns 32t .. 32t + 31 of strip s (weight rows 32s .. 32s + 31) of a weight in some format as two B tiles,
   tiles [2, 16, 32] bf16: tile c holds the strip's rows 16c .. 16c + 15, column pairs (2r, 2r + 1) in row r, a
   32-bit lane a weight row. `weights`: the format's own description of the weight. */
typedef void (*strip_step)(const void *weights, int s, int t, uint16_t *tiles);

/* Columns 32t .. 32t + 31 of a strip as two B tiles, tiles [2, 16, 32] bf16: tile c holds the strip's rows
   16c .. 16c + 15, column pairs (2r, 2r + 1) in row r, a 32-bit lane a weight row. A code goes straight into a
   float's mantissa (one byte permute puts each row's byte where its nibble lies below the exponent, one ternary
   op keeps the nibble and sets the exponent of 1): f - 1 = q / unit exactly, so (f - 1) * (unit * scale) +
   offset is q * scale + offset in fp32 as before, each weight rounded once to bf16; with no
   integer-to-float conversion, no pair shuffle and one load for both tiles, SmolLM2-135M's 120 matmuls at 16
   rows took 0.75 times as long. The lanes of each fp32 half come in pairs (row i's two columns), so converting
   two halves to bf16 gives the tile's order. */
static inline __attribute__((always_inline)) AMX_TARGET void step_to_tiles(weight_strip strip, int t,
                                                                          uint16_t *tiles) {
    const float unit = strip.half ? 2048.0f : 128.0f;  /* the low nibble lies at bits 16-19, the high at 12-15 */
    const __m512i code_bits = _mm512_set1_epi32(strip.half ? 0xF000 : 0xF0000), one = _mm512_set1_epi32(0x3F800000);
    const int g = t * AMX_DEPTH / strip.group;
    __m512i bytes[2][2];
    __m512 scale[2][2], offset[2][2];  /* [c][rows 16c .. +7, or 16c + 8 .. +15], in lane pairs */
    for (int c = 0; c < 2; c++) {
        __m512 row_scale, row_offset;
        group_scale_and_offset(strip.block_scales, g, 2 * strip.half + c, &row_scale, &row_offset);
        for (int h = 0; h < 2; h++) {
            uint8_t index[64];
            int32_t rows[16];
            for (int lane = 0; lane < 16; lane++) {
                rows[lane] = 8 * h + lane / 2;
                for (int b = 0; b < 4; b++) index[4 * lane + b] = (uint8_t)(32 * (lane % 2) + 16 * c + rows[lane]);
            }
            bytes[c][h] = _mm512_loadu_si512(index);
            const __m512i row_of_lane = _mm512_loadu_si512(rows);
            scale[c][h] = _mm512_mul_ps(_mm512_permutexvar_ps(row_of_lane, row_scale), _mm512_set1_ps(unit));
            offset[c][h] = _mm512_permutexvar_ps(row_of_lane, row_offset);
        }
    }
    for (int r = 0; r < AMX_ROWS; r++) {
        const __m512i columns = _mm512_loadu_si512(strip.block + (size_t)(t * AMX_DEPTH + 2 * r) * 32);
        for (int c = 0; c < 2; c++) {
            __m512 w[2];
            for (int h = 0; h < 2; h++) {
                __m512i f = _mm512_permutexvar_epi8(bytes[c][h], columns);
                f = _mm512_ternarylogic_epi32(f, code_bits, one, 0xEA);  /* (f & code_bits) | one */
                const __m512 code = _mm512_sub_ps(_mm512_castsi512_ps(f), _mm512_castsi512_ps(one));  /* q / unit */
                w[h] = _mm512_fmadd_ps(code, scale[c][h], offset[c][h]);
            }
            _mm512_storeu_si512(tiles + c * TILE_VALUES + 32 * r, (__m512i)_mm512_cvtne2ps_pbh(w[1], w[0]));
        }
    }
}

/* Sums tile `tile` into y rows row0 .. row0 + 15 (those below `count`), columns col0 .. col0 + 15. */
#define STORE_SUMS(tile, row0, col0)                                                                          \
    do {                                                                                                      \
        if ((row0) + AMX_ROWS <= count) {                                                                     \
            _tile_stored(tile, y + (size_t)(row0) * rows + (col0), rows * 4);                                 \
        } else {                                                                                              \
            float sums[AMX_ROWS * 16];                                                                        \
            _tile_stored(tile, sums, 64);                                                                     \
            for (int i = 0; i < count - (row0); i++)                                                          \
                memcpy(y + (size_t)((row0) + i) * rows + (col0), sums + 16 * i, 64);                          \
        }                                                                                                     \
    } while (0)

/* Tile `tile` from what STORE_SUMS left in y (zero rows past `count`). */
#define LOAD_SUMS(tile, row0, col0)                                                                           \
    do {                                                                                                      \
        if ((row0) + AMX_ROWS <= count) {                                                                     \
            _tile_loadd(tile, y + (size_t)(row0) * rows + (col0), rows * 4);                                  \
        } else {                                                                                              \
            float sums[AMX_ROWS * 16] = {0};                                                                  \
            for (int i = 0; i < count - (row0); i++)                                                          \
                memcpy(sums + 16 * i, y + (size_t)((row0) + i) * rows + (col0), 64);                          \
            _tile_loadd(tile, sums, 64);                                                                      \
        }                                                                                                     \
    } while (0)

/* y [count, rows] columns col0 .. col0 + 31 (+)= x [count, K] (bf16, its rows padded to a multiple of 32 and
   readable) times one strip over columns k0 .. k1 - 1 of K: 32 rows at a time, or 16 for the last few; from k0 = 0
   the sums start at zero, past it from what the previous columns left in y (fp32 both ways: the same sums as one
   pass). The first pass dequantizes each step's tiles (`step`) just before it multiplies them (the vector units'
   work beside the tiles'), into `tiles` [(k1 - k0) / 32, 2, 16, 32], where the later passes find them. */
static AMX_TARGET void strip_product(const uint16_t *x, int count, int width, int k0, int k1, strip_step step,
                                     const void *weights, int s, uint16_t *tiles, float *y, int rows, int col0) {
    const size_t stride = (size_t)width * 2;
    for (int m = 0; m < count; m += 2 * AMX_ROWS) {
        const uint16_t *x_rows = x + (size_t)m * width;
        const int two = count - m > AMX_ROWS;  /* a second tile of rows */
        if (k0 == 0) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
        } else {
            LOAD_SUMS(0, m, col0);
            LOAD_SUMS(1, m, col0 + 16);
            if (two) {
                LOAD_SUMS(2, m + AMX_ROWS, col0);
                LOAD_SUMS(3, m + AMX_ROWS, col0 + 16);
            }
        }
        for (int t = k0 / AMX_DEPTH; t < k1 / AMX_DEPTH; t++) {
            uint16_t *b_tiles = tiles + (size_t)(t - k0 / AMX_DEPTH) * 2 * TILE_VALUES;
            if (m == 0) step(weights, s, t, b_tiles);
            _tile_loadd(4, x_rows + t * AMX_DEPTH, stride);
            _tile_loadd(6, b_tiles, 64);
            _tile_loadd(7, b_tiles + TILE_VALUES, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            if (two) {
                _tile_loadd(5, x_rows + AMX_ROWS * width + t * AMX_DEPTH, stride);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
        }
        STORE_SUMS(0, m, col0);
        STORE_SUMS(1, m, col0 + 16);
        if (two) {
            STORE_SUMS(2, m + AMX_ROWS, col0);
            STORE_SUMS(3, m + AMX_ROWS, col0 + 16);
        }
    }
}
#undef STORE_SUMS
#undef LOAD_SUMS

/* Columns of K a pass over every strip takes: as many whole steps as keep a strip's dequantized tiles within
   TILES_CACHE_BYTES (with a pass of activation rows beside them in a core's cache), in equal passes. */
static int columns_a_pass(int width) {
    const int most = TILES_CACHE_BYTES / (STRIP * 2), passes = (width + most - 1) / most;
    return ((width / AMX_DEPTH + passes - 1) / passes) * AMX_DEPTH;
}

/* rows[i] lane j becomes rows[j] lane i (16 x 16 32-bit lanes): three rounds of interleaving. */
static inline __attribute__((always_inline)) void transpose_16x16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xDD);
        t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xDD);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
        r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
        r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xDD);
        r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xDD);
    }
}

/* 32 fp32 values as bf16, in order: one tile row. */
static inline __attribute__((always_inline)) AMX_TARGET __m512i bf16_row(const float *values) {
    return (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(values + 16), _mm512_loadu_ps(values));
}

/* 16 bf16 values, each in the low half of a 32-bit lane. */
static inline __attribute__((always_inline)) __m512i bf16_lanes(const uint16_t *values) {
    return _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)values));
}

#define ATT_BLOCK 32      /* positions a block of the tile attention takes: a tile row of bf16 */
#define ATT_MAX_TILES 8   /* query tiles (16 queries each) of one kv head a task takes */
#define ATT_MAX_DIM 128   /* head dimensions the tile attention takes */

/* A task's queries: tile i's lane j is query (tile0 + i) * 16 + j of the kv head, that is query head h * groups +
   its index % groups of row first_row + its index / groups; a lane past the chunk's queries is zero. */
typedef struct {
    uint32_t transposed[ATT_MAX_TILES][ATT_MAX_DIM / 32][16][16];  /* B tiles: (q[2r], q[2r + 1]) at [c][r][lane] */
    float sums[ATT_MAX_TILES][ATT_MAX_DIM][16];  /* the weighted values, transposed: [dimension][lane] */
    __m512 best[ATT_MAX_TILES], total[ATT_MAX_TILES];
    __m512i limit[ATT_MAX_TILES], low[ATT_MAX_TILES];  /* positions each lane sees: from low, before limit */
} tile_queries;

/* Where query `index` of kv head h lies in q [R, H, hd] and out: row first_row + index / groups, query head
   h * groups + index % groups. */
static inline size_t query_at(int index, int first_row, int heads, int groups, int h, int head_dim) {
    return ((size_t)(first_row + index / groups) * heads + (size_t)h * groups + index % groups) * head_dim;
}

static AMX_TARGET void load_tile_queries(const float *q, int first_row, int count, int start, int window, int heads,
                                         int groups, int h, int head_dim, int tile0, int tiles, tile_queries *queries) {
    for (int i = 0; i < tiles; i++) {
        int32_t limits[16], lows[16];
        for (int j = 0; j < 16; j++) {
            const int row = ((tile0 + i) * 16 + j) / groups;
            limits[j] = row < count ? start + row + 1 : 1 << 30;  /* padding lanes see everything */
            lows[j] = row < count && window > 0 ? limits[j] - window : -(1 << 30);
        }
        for (int c = 0; c < head_dim / 32; c++) {
            __m512i rows[16];
            for (int j = 0; j < 16; j++) {
                const int index = (tile0 + i) * 16 + j;
                rows[j] = index / groups < count
                              ? bf16_row(q + query_at(index, first_row, heads, groups, h, head_dim) + 32 * c)
                              : _mm512_setzero_si512();
            }
            transpose_16x16(rows);
            for (int r = 0; r < 16; r++) _mm512_storeu_si512(queries->transposed[i][c][r], rows[r]);
        }
        queries->limit[i] = _mm512_loadu_si512(limits);
        queries->low[i] = _mm512_loadu_si512(lows);
        queries->best[i] = _mm512_set1_ps(-INFINITY);
        queries->total[i] = _mm512_setzero_ps();
        memset(queries->sums[i], 0, sizeof queries->sums[i]);
    }
}

/* One block of up to 32 positions (slots[p], logical positions logical + p; n of them) for a task's query tiles:
   its keys (bf16, as the cache holds them) as A tiles [16 positions, 32 dims] and its values transposed, A tiles
   [16 dims, 32 positions]; then
   per tile the scores (keys times the transposed queries, [position][lane]), the running softmax, and the weighted
   values (values transposed times the weights' pairs). */
static AMX_TARGET void attend_block(const uint16_t *keys, const uint16_t *values, const int64_t *slots, int n,
                                    int64_t logical, int head_dim, int tiles, tile_queries *queries) {
    uint16_t key_rows[ATT_BLOCK][ATT_MAX_DIM] __attribute__((aligned(64)));
    uint32_t values_t[ATT_MAX_DIM / 16][16][16] __attribute__((aligned(64)));
    for (int p = 0; p < ATT_BLOCK; p++)
        for (int c = 0; c < head_dim / 32; c++) {
            __m512i row = p < n ? _mm512_loadu_si512(keys + slots[p] * head_dim + 32 * c) : _mm512_setzero_si512();
            _mm512_store_si512(key_rows[p] + 32 * c, row);
        }
    for (int d0 = 0; d0 < head_dim / 16; d0++) {
        __m512i rows[16];
        for (int k = 0; k < 16; k++) {
            __m512i even = 2 * k < n ? bf16_lanes(values + slots[2 * k] * head_dim + 16 * d0) : _mm512_setzero_si512();
            __m512i odd = 2 * k + 1 < n ? bf16_lanes(values + slots[2 * k + 1] * head_dim + 16 * d0)
                                        : _mm512_setzero_si512();
            rows[k] = _mm512_or_si512(even, _mm512_slli_epi32(odd, 16));  /* (even, odd) pairs, even in the low half */
        }
        transpose_16x16(rows);
        for (int d = 0; d < 16; d++) _mm512_store_si512(values_t[d0][d], rows[d]);
    }
    for (int i = 0; i < tiles; i++) {
        float scores[ATT_BLOCK][16] __attribute__((aligned(64)));
        for (int half = 0; half < 2; half++) {
            _tile_zero(1);
            for (int c = 0; c < head_dim / 32; c++) {
                _tile_loadd(2, key_rows[16 * half] + 32 * c, ATT_MAX_DIM * 2);
                _tile_loadd(3, queries->transposed[i][c], 64);
                _tile_dpbf16ps(1, 2, 3);
            }
            _tile_stored(1, scores[16 * half], 64);
        }
        __m512 weight[ATT_BLOCK], most = queries->best[i];
        for (int p = 0; p < ATT_BLOCK; p++) {
            __m512i position = _mm512_set1_epi32((int)(logical + p));
            __mmask16 seen = p < n ? _mm512_mask_cmpgt_epi32_mask(_mm512_cmple_epi32_mask(queries->low[i], position),
                                                                  queries->limit[i], position)
                                   : 0;
            weight[p] = _mm512_mask_blend_ps(seen, _mm512_set1_ps(-INFINITY), _mm512_load_ps(scores[p]));
            most = _mm512_max_ps(most, weight[p]);
        }
        __m512 kept = exp_of_negative(_mm512_sub_ps(queries->best[i], most));  /* 0 at the first block */
        __m512 total = _mm512_mul_ps(queries->total[i], kept);
        for (int p = 0; p < ATT_BLOCK; p++) {
            weight[p] = exp_of_negative(_mm512_sub_ps(weight[p], most));
            total = _mm512_add_ps(total, weight[p]);
        }
        queries->best[i] = most;
        queries->total[i] = total;
        uint32_t weight_pairs[16][16] __attribute__((aligned(64)));
        for (int k = 0; k < 16; k++) _mm512_store_si512(weight_pairs[k], bf16_pairs(weight[2 * k], weight[2 * k + 1]));
        _tile_loadd(7, weight_pairs, 64);
        for (int d0 = 0; d0 < head_dim / 16; d0++) {
            float part[16][16] __attribute__((aligned(64)));
            _tile_zero(0);
            _tile_loadd(6, values_t[d0], 64);
            _tile_dpbf16ps(0, 6, 7);
            _tile_stored(0, part, 64);
            for (int d = 0; d < 16; d++) {
                float *sums = queries->sums[i][16 * d0 + d];
                _mm512_storeu_ps(sums, _mm512_fmadd_ps(_mm512_loadu_ps(sums), kept, _mm512_load_ps(part[d])));
            }
        }
    }
}

#endif

/* chunk_attention on AMX's bf16 tiles (head_dim a multiple of 32, at most 128): queries and the softmax's weights
   rounded to bf16, keys and values as the cache holds them, sums in fp32. Each task takes one kv head and a few tiles of 16 of its
   queries (rows times the query heads that share it), whose keys and values are converted once a block of 32
   positions. Call only where amx_enable() returned 0. */
AMX_TARGET void chunk_attention_amx(const float *q, float *out, const uint16_t *layer, int first_row, int count,
                                    int start, const int32_t *runs, int run_count, int heads, int kv_heads,
                                    int head_dim, int64_t positions, int window) {
#ifdef HAS_AMX
    const int groups = heads / kv_heads, tiles = (count * groups + 15) / 16, threads = omp_get_max_threads();
    int per_head = (2 * threads + kv_heads - 1) / kv_heads;  /* tasks a kv head: two a thread or more */
    int tiles_per_task = (tiles + per_head - 1) / per_head;
    tiles_per_task = tiles_per_task < ATT_MAX_TILES ? tiles_per_task : ATT_MAX_TILES;
    per_head = (tiles + tiles_per_task - 1) / tiles_per_task;
    #pragma omp parallel
    {
        configure_tiles();
        #pragma omp for collapse(2) schedule(static)
        for (int h = 0; h < kv_heads; h++)
            for (int t = 0; t < per_head; t++) {
                const int tile0 = t * tiles_per_task;
                const int task_tiles = tiles - tile0 < tiles_per_task ? tiles - tile0 : tiles_per_task;
                tile_queries queries;
                load_tile_queries(q, first_row, count, start, window, heads, groups, h, head_dim, tile0, task_tiles,
                                  &queries);
                const uint16_t *keys = layer + (size_t)h * positions * head_dim;
                const uint16_t *values = layer + ((size_t)kv_heads + h) * positions * head_dim;
                const int last_row = ((tile0 + task_tiles) * 16 - 1) / groups;
                const int64_t seen = start + (last_row < count ? last_row : count - 1) + 1;
                const int first_seen = tile0 * 16 / groups;  /* the task's first row */
                const int64_t from = window > 0 ? start + first_seen + 1 - window : 0;  /* where its window starts */
                int64_t slots[ATT_BLOCK], logical = window_skip(runs, run_count, from);
                int n = 0;
                for (int j = 0; j < run_count && logical + n < seen; j++)
                    for (int64_t slot = run_slot(runs, j, logical + n); slot < runs[2 * j + 1] && logical + n < seen;
                         slot++) {
                        slots[n++] = slot;
                        if (n == ATT_BLOCK) {
                            attend_block(keys, values, slots, n, logical, head_dim, task_tiles, &queries);
                            logical += n;
                            n = 0;
                        }
                    }
                if (n > 0) attend_block(keys, values, slots, n, logical, head_dim, task_tiles, &queries);
                for (int i = 0; i < task_tiles; i++) {
                    float totals[16];
                    _mm512_storeu_ps(totals, queries.total[i]);
                    for (int j = 0; j < 16; j++) {
                        const int index = (tile0 + i) * 16 + j;
                        if (index / groups >= count) break;
                        float *target = out + query_at(index, first_row, heads, groups, h, head_dim);
                        for (int d = 0; d < head_dim; d++) target[d] = queries.sums[i][d][j] / totals[j];
                    }
                }
            }
        _tile_release();
    }
#endif
}

#ifdef HAS_AMX
/* x [count, K] fp32 as bf16 rows (rounded to nearest even) in `activations`, zero rows after them up to a
   multiple of 32: what a pass of tile products reads. Called inside a parallel region; a barrier follows. */
static AMX_TARGET void activations_to_bf16(const float *x, int count, int width, uint16_t *activations) {
    const int padded = (count + 2 * AMX_ROWS - 1) / (2 * AMX_ROWS) * (2 * AMX_ROWS);
    #pragma omp for schedule(static)
    for (int m = 0; m < padded; m++) {
        uint16_t *row = activations + (size_t)m * width;
        for (int k = 0; k < width; k += 32)
            _mm512_storeu_si512(row + k, m < count ? bf16_row(x + (size_t)m * width + k) : _mm512_setzero_si512());
    }
}

/* y [count, N] fp32 = x [count, K] fp32 . W^T on AMX's bf16 tiles, N and K multiples of 32, W's strips turned
   into tiles by `step`. x is rounded to bf16 into `activations` (K * 2 bytes for each of count rows rounded up to a
   multiple of 32). A strip of 32 weight rows at a time is dequantized once into a thread's tiles in cache (a step of
   32 columns just before its first tile products) and meets every activation row there: no weight goes to memory,
   and nothing needs reordering. scratch: K * 64 bytes for each of `threads` threads. */
static AMX_TARGET void tiles_matmul(const float *x, int count, int width, uint16_t *activations, strip_step step,
                                    const void *weights, int rows, int threads, uint16_t *scratch, float *y) {
    const int strips = rows / STRIP, columns = columns_a_pass(width);
    #pragma omp parallel num_threads(threads)
    {
        activations_to_bf16(x, count, width, activations);
        uint16_t *tiles = scratch + (size_t)omp_get_thread_num() * width * STRIP;
        configure_tiles();
        for (int k0 = 0; k0 < width; k0 += columns) {
            const int k1 = k0 + columns < width ? k0 + columns : width;
            #pragma omp for schedule(static)
            for (int s = 0; s < strips; s++)
                strip_product(activations, count, width, k0, k1, step, weights, s, tiles, y, rows, s * STRIP);
        }
        _tile_release();
    }
}

typedef struct {
    const uint8_t *packed;
    const uint8_t *group_scales;
    int width, group;
} int4_weights;

static AMX_TARGET void int4_strip_step(const void *weights, int s, int t, uint16_t *tiles) {
    const int4_weights *w = weights;
    const int b = s / 2;
    const weight_strip strip = {w->packed + (size_t)b * BLOCK_ROWS * (w->width / 2),
                                w->group_scales + (size_t)b * int4_scale_bytes(w->width / w->group), w->group,
                                s % 2};
    step_to_tiles(strip, t, tiles);
}
#endif

/* y [count, N] fp32 = x [count, K] fp32 . W^T on AMX's bf16 tiles (tiles_matmul), W [N, K] in the int4 layout
   (int4_matmul's arguments; group and K multiples of 32). Call only where amx_enable() returned 0. */
AMX_TARGET void int4_matmul_amx(const float *x, int count, int width, uint16_t *activations, const uint8_t *packed,
                                const uint8_t *group_scales, int rows, int group, int threads,
                                uint16_t *scratch, float *y) {
#ifdef HAS_AMX
    const int4_weights weights = {packed, group_scales, width, group};
    tiles_matmul(x, count, width, activations, int4_strip_step, &weights, rows, threads, scratch, y);
#endif
}

/* gpt-oss's experts: mxfp4_matmul, mxfp4_experts and mxfp4_strips_from_rows are kernels_common.h's, over the
   weights in strips of 8 rows. */

#ifdef HAS_AMX
typedef struct {
    const uint8_t *blocks;
    const float *scale_of;
    int per_row;
} mxfp4_weights;

/* An MXFP4 strip's step (strip_step): block t of each of its 32 rows (4 strips of 8: mxfp4_strips_from_rows) is one
   step's columns. Each block becomes a vector of its 32 weights in bf16, in order (HALVES through vpermps, times the
   block's power of two: exact), so a 32-bit lane holds a column pair; 16 rows' vectors transposed are a tile's rows. */
static AMX_TARGET void mxfp4_strip_step(const void *weights, int s, int t, uint16_t *tiles) {
    const mxfp4_weights *w = weights;
    const __m512 table = _mm512_setr_ps(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m128i quads = _mm_setr_epi32(0, 32, 64, 96);  /* a row's four code runs in its strip block */
    for (int c = 0; c < 2; c++) {
        __m512i rows[16];
        for (int j = 0; j < 16; j++) {
            const int row = STRIP * s + 16 * c + j, r = row % MXFP4_STRIP;
            const uint8_t *block = w->blocks + ((size_t)(row / MXFP4_STRIP) * w->per_row + t) * MXFP4_STRIP_BYTES;
            const __m128i bytes = _mm_i32gather_epi32((const int *)(block + MXFP4_STRIP + 4 * r), quads, 1);
            const __m512i codes = _mm512_cvtepu8_epi32(bytes);  /* code bytes 0-15 of the row's block */
            const __m512 scale = _mm512_set1_ps(w->scale_of[block[r]]);
            const __m512 low = _mm512_mul_ps(_mm512_permutexvar_ps(codes, table), scale);  /* weights 0-15 */
            const __m512 high = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(codes, 4), table), scale);
            rows[j] = (__m512i)_mm512_cvtne2ps_pbh(high, low);
        }
        transpose_16x16(rows);
        for (int r = 0; r < 16; r++) _mm512_storeu_si512(tiles + c * TILE_VALUES + 32 * r, rows[r]);
    }
}
#endif

/* y [count, N] fp32 = x [count, K] fp32 . W^T on AMX's bf16 tiles (tiles_matmul), W [N, K] in MXFP4 strips
   (mxfp4_matmul's; N a multiple of 32), without a bias: the weights exact in bf16, the activations rounded to it.
   Call only where amx_enable() returned 0. */
AMX_TARGET void mxfp4_matmul_amx(const float *x, int count, int width, uint16_t *activations, const uint8_t *blocks,
                                 int rows, int threads, uint16_t *scratch, float *y) {
#ifdef HAS_AMX
    float scale_of[256];
    mxfp4_scales(scale_of);
    const mxfp4_weights weights = {blocks, scale_of, width / MXFP4_BLOCK};
    tiles_matmul(x, count, width, activations, mxfp4_strip_step, &weights, rows, threads, scratch, y);
#endif
}
