/* Hearth's CPU kernels for AVX2 with FMA and F16C (variants.py's "avx2": most laptops' CPUs, Intel's since Haswell and
   AMD's before Zen 4), with kernels.c's exported functions and arguments (engine thread; OpenMP threads inside each
   call). Where kernels.c multiplies int8 codes with AVX-512's vpdpbusd, these use llama.cpp's AVX2 products: vpmaddubsw
   (unsigned by signed bytes, adjacent pairs summed in int16) and vpmaddwd (int16 pairs summed in int32); built with
   AVX-VNNI (variants.py's "avx2vnni", __AVXVNNI__), the matmuls take its 256-bit vpdpbusd instead. The K/V cache
   is bf16 (uint16 storage): a value's fp32 is its 16 bits above 16 zero bits; or int8 rows (the _q8 functions,
   kv_row_bytes: codes, then an fp16 scale per 32). No AMX here: amx_enable says so. */

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_common.h"

#define HALF_ROWS 32      /* a block's rows one nibble of its bytes holds (cpu_int4_layout) */

static inline float sum_of(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* e^x for x <= 0: 2^(x log2 e) as 2^n (built in the exponent's bits) times a degree-6 polynomial of 2^f, |f| <= 1/2;
   x is first raised to -87, where 2^n is still a normal float (e^-87 ~ 1.6e-38 stands for anything smaller). */
static inline __m256 exp_of_negative(__m256 x) {
    __m256 t = _mm256_mul_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(1.44269504089f));
    __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(t, n);
    static const float terms[] = {1.540353e-4f, 1.3333558e-3f, 9.6181291e-3f, 5.5504109e-2f, 0.24022651f,
                                  0.69314718f, 1.0f};
    __m256 power = _mm256_set1_ps(terms[0]);
    for (int i = 1; i < 7; i++) power = _mm256_fmadd_ps(power, f, _mm256_set1_ps(terms[i]));
    __m256i two_to_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(power, _mm256_castsi256_ps(two_to_n));
}

/* 8 consecutive bf16 values as fp32. */
static inline __m256 bf16_load(const uint16_t *values) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)values)), 16));
}

static inline __m256 bf16_broadcast(const uint16_t *value) {
    return _mm256_castsi256_ps(_mm256_set1_epi32((int)((uint32_t)*value << 16)));
}

/* Values 8v .. 8v + 7 of a K/V row (kv_row_bytes) as fp32: bf16 widened, or int8 codes times their fp16 scale. */
static inline __attribute__((always_inline)) __m256 kv_load(const uint8_t *row, int v, int head_dim, int int8) {
    if (!int8) return bf16_load((const uint16_t *)row + 8 * v);
    __m256 codes = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(row + 8 * v))));
    return _mm256_mul_ps(codes, _mm256_set1_ps(_cvtsh_ss(((const uint16_t *)(row + head_dim))[v / 4])));
}

/* x [head_dim] as an int8 K/V row (quantize_kv_row), its scales rounded to fp16 to nearest even. */
static void kv_store_int8(uint8_t *row, const float *x, int head_dim) {
    float scales[MAX_HEAD_DIM / KV_GROUP];
    quantize_kv_row(x, head_dim, (int8_t *)row, scales);
    for (int g = 0; g < head_dim / KV_GROUP; g++)
        ((uint16_t *)(row + head_dim))[g] = _cvtss_sh(scales[g], _MM_FROUND_TO_NEAREST_INT);
}

/* 8 fp32 values as bf16, rounded to nearest even as PyTorch rounds (a NaN stays a NaN). */
static inline void bf16_store(uint16_t *target, __m256 x) {
    __m256i bits = _mm256_castps_si256(x);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF)));
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    rounded = _mm256_blendv_epi8(rounded, _mm256_or_si256(bits, _mm256_set1_epi32(0x00400000)), nan);
    rounded = _mm256_srli_epi32(rounded, 16);
    _mm_storeu_si128((__m128i *)target,
                     _mm_packus_epi32(_mm256_castsi256_si128(rounded), _mm256_extracti128_si256(rounded, 1)));
}

/* ------------------------------------------------------------------------------------------------------------------
   int4: a block of 64 rows is [K, 32] bytes, byte (k, j) row j's code k in its low nibble and row j + 32's in its
   high one. Four columns' 32 bytes, interleaved by vpunpck{l,h}bw and then {l,h}wd, put a row's four bytes in one
   32-bit lane, both nibbles at once (one shuffle a vector, where unpacking each nibble's apart takes two): a block
   takes two passes, pass p (vpunpcklbw, then vpunpckhbw) giving vectors j = 2p and 2p + 1 of each nibble, vector j
   holding rows 4j .. 4j + 3 in lanes 0-3 and 4j + 16 .. 4j + 19 in lanes 4-7 (the high nibbles: those rows + 32).
   A row's four codes meet four activations in one vpdpbusd where the CPU has AVX-VNNI (the "avx2vnni" variant, built
   with it), else in one vpmaddubsw, whose pairs add up in int16 over CODE_RUN columns (8 x 2 x 15 x 127 < 2^15)
   before vpmaddwd widens them. */

#define ROW_TILE 2  /* activation rows a pass over a block takes with one code a value (one with two) */

#ifdef __AVXVNNI__
#define CODE_RUN (1 << 30)  /* columns whose sums add up before widening: vpdpbusd's are int32 already */

/* sums + codes . x, a lane's four unsigned codes by four signed activations: int32 sums. */
static inline __m256i add_products(__m256i sums, __m256i codes, __m256i x) {
#if defined(__GNUC__) && !defined(__clang__)
    __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(sums) : "x"(codes), "xm"(x));
    return sums;
#else
    return _mm256_dpbusd_avx_epi32(sums, codes, x);
#endif
}

static inline __m256i widened(__m256i sums) { return sums; }
#else
#define CODE_RUN 32  /* columns whose vpmaddubsw sums add up in int16 before widening */

/* sums + codes . x, a lane's four unsigned codes by four signed activations, in two int16 pair sums a lane. */
static inline __m256i add_products(__m256i sums, __m256i codes, __m256i x) {
    const __m256i products = _mm256_maddubs_epi16(codes, x);
#if defined(__GNUC__) && !defined(__clang__)
    __asm__("vpaddw %1, %0, %0" : "+x"(sums) : "x"(products));  /* in place: GCC 12 copied every sum back a column */
    return sums;
#else
    return _mm256_add_epi16(sums, products);
#endif
}

/* A lane's two int16 pair sums as one int32. */
static inline __m256i widened(__m256i sums) { return _mm256_madd_epi16(sums, _mm256_set1_epi16(1)); }
#endif

/* Four columns k .. k + 3 of a block (bytes: column k's) in pass `pass`, interleaved: pairs[q] holds a row's four
   bytes a lane, both nibbles (nibble_codes takes them apart). */
static inline __attribute__((always_inline)) void column_pairs(const uint8_t *bytes, int pass, __m256i pairs[2]) {
    __m256i c[4];
    for (int i = 0; i < 4; i++) c[i] = _mm256_loadu_si256((const __m256i *)(bytes + 32 * i));
    __m256i pairs01 = pass ? _mm256_unpackhi_epi8(c[0], c[1]) : _mm256_unpacklo_epi8(c[0], c[1]);
    __m256i pairs23 = pass ? _mm256_unpackhi_epi8(c[2], c[3]) : _mm256_unpacklo_epi8(c[2], c[3]);
    pairs[0] = _mm256_unpacklo_epi16(pairs01, pairs23);
    pairs[1] = _mm256_unpackhi_epi16(pairs01, pairs23);
}

/* Vector v = 2 high + q of column_pairs' pass: vector 2 pass + q of the nibble `high`, a row's four codes a lane. */
static inline __attribute__((always_inline)) __m256i nibble_codes(const __m256i pairs[2], int v) {
    const __m256i bytes = v < 2 ? pairs[v] : _mm256_srli_epi16(pairs[v - 2], 4);
    return _mm256_and_si256(bytes, _mm256_set1_epi8(0x0F));
}

/* column_pairs' four vectors taken apart: codes[v] = nibble_codes(pairs, v). */
static inline __attribute__((always_inline)) void four_columns(const uint8_t *bytes, int pass, __m256i codes[4]) {
    __m256i pairs[2];
    column_pairs(bytes, pass, pairs);
    for (int v = 0; v < 4; v++) codes[v] = nibble_codes(pairs, v);
}

/* Eight rows' scales and offsets from their bytes of kernels_common.h's int4 scales, lane i row i's: factors, its
   (d, e) bf16 in a 32-bit lane; code_pairs, its (c, z) int8 as 16 bits, eight pairs in 16 bytes.
   w = (q - 8) * scale + zero = q * scale + offset. */
static inline __attribute__((always_inline)) void eight_scales_and_offsets(__m256i factors, __m128i code_pairs,
                                                                           __m256 *scale, __m256 *offset) {
    const __m256i lanes = _mm256_cvtepu16_epi32(code_pairs);  /* a row's (c, z) in a lane's low 16 bits */
    const __m256 c = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(lanes, 24), 24));  /* the low byte */
    const __m256 z = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(lanes, 16), 24));  /* the second */
    const __m256 e = _mm256_castsi256_ps(_mm256_and_si256(factors, _mm256_set1_epi32((int)0xFFFF0000)));
    *scale = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(factors, 16)), c);
    *offset = _mm256_fnmadd_ps(_mm256_set1_ps(8.0f), *scale, _mm256_mul_ps(e, z));
}

/* Group g's scales and offsets of vector j's rows in half `high` (rows 32 high + 4j .. + 3 and 16 later; the
   block's scales from block_scales). */
static inline __attribute__((always_inline)) void group_scale_and_offset(const uint8_t *block_scales, int g, int high,
                                                                         int j, __m256 *scale, __m256 *offset) {
    const int row = HALF_ROWS * high + 4 * j;
    const uint16_t *factors = run_factors(block_scales, g) + 2 * row;
    const int8_t *codes = group_codes(block_scales, g) + 2 * row;
    const __m256i pairs = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)(factors + 32)),
                                           _mm_loadu_si128((const __m128i *)factors));
    const __m128i code_pairs = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)codes),
                                                  _mm_loadl_epi64((const __m128i *)(codes + 32)));
    eight_scales_and_offsets(pairs, code_pairs, scale, offset);
}

/* Stores vector j's eight sums of half `high` at their rows of y (row0: the block's first). */
static inline void store_rows(float *y, int row0, int high, int j, __m256 sums) {
    float *at = y + row0 + HALF_ROWS * high + 4 * j;
    _mm_storeu_ps(at, _mm256_castps256_ps128(sums));
    _mm_storeu_ps(at + 16, _mm256_extractf128_ps(sums, 1));
}

/* sums[m][c][v] (add_products' sums) of pass `pass` over columns k0 .. k1 (at most CODE_RUN) of a block: activation
   row m's codes `c` times four_columns' vector v. Inlined with `pass` and `read_ahead` (whether to ask for the bytes
   ahead: prefetch_ahead) as constants, so the loop over columns holds no branch. */
static inline __attribute__((always_inline)) void run_sums(
        int count, int codes_per_value, int pass, int read_ahead, const int8_t *const x_codes[2], int width,
        const uint8_t *block, int k0, int k1, __m256i sums[ROW_TILE][2][4]) {
    for (int m = 0; m < count; m++)
        for (int i = 0; i < 8; i++) (&sums[m][0][0])[i] = _mm256_setzero_si256();
    for (int k = k0; k < k1; k += 4) {
        __m256i x[ROW_TILE][2], pairs[2];
        for (int m = 0; m < count; m++)
            for (int c = 0; c < codes_per_value; c++)
                x[m][c] = _mm256_set1_epi32(*(const int32_t *)(x_codes[c] + (size_t)m * width + k));
        if (read_ahead) prefetch_ahead(block + (size_t)k * HALF_ROWS, 2);
        column_pairs(block + (size_t)k * HALF_ROWS, pass, pairs);
        for (int v = 0; v < 4; v++) {  /* a vector's codes taken apart as they are used: fewer live registers */
            const __m256i codes = nibble_codes(pairs, v);
            for (int m = 0; m < count; m++)
                for (int c = 0; c < codes_per_value; c++)
                    sums[m][c][v] = add_products(sums[m][c][v], codes, x[m][c]);
        }
    }
}

/* dot[m][c][v] (int32): run_sums over columns k_start .. k_end (a group), widened a run at a time. The first run
   is the whole of a group of at most CODE_RUN columns, the usual case; it sets dot rather than adding to zeros, so
   no sums wait in registers beside the runs'. */
static inline __attribute__((always_inline)) void group_dots(
        int count, int codes_per_value, int pass, int read_ahead, const int8_t *const x_codes[2], int width,
        const uint8_t *block, int k_start, int k_end, __m256i dot[ROW_TILE][2][4]) {
    __m256i sums[ROW_TILE][2][4];
    const int first_end = k_end - k_start > CODE_RUN ? k_start + CODE_RUN : k_end;
    run_sums(count, codes_per_value, pass, read_ahead, x_codes, width, block, k_start, first_end, sums);
    for (int m = 0; m < count; m++)
        for (int c = 0; c < codes_per_value; c++)
            for (int v = 0; v < 4; v++) dot[m][c][v] = widened(sums[m][c][v]);
    for (int k0 = first_end; k0 < k_end; k0 += CODE_RUN) {
        const int k1 = k_end - k0 > CODE_RUN ? k0 + CODE_RUN : k_end;
        run_sums(count, codes_per_value, pass, read_ahead, x_codes, width, block, k0, k1, sums);
        for (int m = 0; m < count; m++)
            for (int c = 0; c < codes_per_value; c++)
                for (int v = 0; v < 4; v++) dot[m][c][v] = _mm256_add_epi32(dot[m][c][v], widened(sums[m][c][v]));
    }
}

/* A block of 64 rows against `count` (1 or ROW_TILE) activation rows, one code a value or two (`low` read only
   then): y[m, row0 .. row0 + 63]. A group's bytes are read by the two passes in turn (the second from cache).
   read_ahead: the call's first pass over the block, which asks for its bytes ahead (prefetch_ahead). */
static inline __attribute__((always_inline)) void int4_block(
        int count, int two_codes, const int8_t *high, const int8_t *low, const float *scales, const float *code_totals,
        int width, const uint8_t *block, const uint8_t *block_scales, int rows, int group, float *y, int row0,
        int read_ahead) {
    const int groups = width / group, codes_per_value = 1 + two_codes;
    const int8_t *const x_codes[2] = {high, low};
    __m256 total[ROW_TILE][2][4];  /* [m][high][j] */
    for (int m = 0; m < count; m++)
        for (int i = 0; i < 8; i++) (&total[m][0][0])[i] = _mm256_setzero_ps();
    for (int g = 0; g < groups; g++)
        for (int pass = 0; pass < 2; pass++) {
            __m256i dot[ROW_TILE][2][4];  /* [m][code][vector]: int32 */
            #define GROUP_DOTS(p, ahead) group_dots(count, codes_per_value, p, ahead, x_codes, width, block, \
                                                    g * group, (g + 1) * group, dot)
            if (pass == 1) GROUP_DOTS(1, 0);
            else if (read_ahead) GROUP_DOTS(0, 1);
            else GROUP_DOTS(0, 0);
            #undef GROUP_DOTS
            for (int v = 0; v < 4; v++) {
                const int half = v / 2, j = 2 * pass + v % 2;
                __m256 scale, offset;
                group_scale_and_offset(block_scales, g, half, j, &scale, &offset);
                for (int m = 0; m < count; m++) {
                    size_t at = (size_t)m * groups + g;
                    __m256 d = _mm256_cvtepi32_ps(dot[m][0][v]);
                    if (two_codes)
                        d = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[m][1][v]), _mm256_set1_ps(1.0f / LOW_STEPS), d);
                    d = _mm256_fmadd_ps(offset, _mm256_set1_ps(code_totals[at]), _mm256_mul_ps(d, scale));
                    total[m][half][j] = _mm256_fmadd_ps(d, _mm256_set1_ps(scales[at]), total[m][half][j]);
                }
            }
        }
    for (int m = 0; m < count; m++)
        for (int half = 0; half < 2; half++)
            for (int j = 0; j < 4; j++) store_rows(y + (size_t)m * rows, row0, half, j, total[m][half][j]);
}

/* ------------------------------------------------------------------------------------------------------------------
   int4 for many activation rows (a prompt's). Above, a pass unpacks a block's nibbles for every ROW_TILE rows, and
   sixteen registers hold no more than two rows' sums. Here a block's codes are unpacked once, four_columns' vectors
   each laid out over all of its columns (unpack_block), its scales decoded once (unpack_block_scales), and the
   activations' codes transposed so a vector holds eight
   activation rows' four codes (xt [M / 8, K / 4, 8, 4]). A tile broadcasts one weight row's four codes at a time
   against X_VECTORS such vectors: W_ROWS x X_VECTORS products for a broadcast and X_VECTORS loads, nothing to unpack
   in the loop. The floats are int4_block's, in its order: a group's sums times the weights' scale, plus their offset
   times the activations' code totals, times the activations' scale, added group after group. Only groups of at most
   CODE_RUN columns (vpmaddubsw's int16 sums widen once a group). */

#define W_ROWS 4          /* weight rows a tile broadcasts: the four lanes of a vector's half */
#ifdef __AVXVNNI__
#define X_VECTORS 3       /* vectors of eight activation rows a tile loads: 4 x 3 sums + 3 + 1 = 16 registers */
#else
#define X_VECTORS 2       /* vpmaddubsw's products need a register of their own before they add: 4 x 2 sums */
#endif
#define MANY_ROWS_FROM 24 /* activation rows from which int4_matmul takes this path */
#define MANY_CHUNK 1024   /* columns a tile covers before the next tile: X_VECTORS x 8 KiB of activations, in L1 */

/* The block row that lane `lane` (0-7) of unpacked vector u (2 x pass + v of four_columns) holds. */
static inline int unpacked_row(int u, int lane) {
    const int pass = u / 4, v = u % 4, half = v / 2, j = 2 * pass + v % 2;
    return HALF_ROWS * half + 4 * j + (lane < 4 ? lane : 12 + lane);
}

/* A block's codes, unpacked [8, K / 4] vectors: vector u's K / 4 column runs one after another (K * 64 bytes). */
static void unpack_block(const uint8_t *block, int width, __m256i *unpacked) {
    const int runs = width / 4;
    for (int r = 0; r < runs; r++) {
        prefetch_ahead(block + (size_t)4 * r * HALF_ROWS, 2);
        for (int pass = 0; pass < 2; pass++) {
            __m256i codes[4];
            four_columns(block + (size_t)4 * r * HALF_ROWS, pass, codes);
            for (int v = 0; v < 4; v++) _mm256_store_si256(unpacked + (size_t)(4 * pass + v) * runs + r, codes[v]);
        }
    }
}

/* A block's scales (kernels_common.h's int4 scales) as floats, floats [groups, 2, 64]: each group's 64 rows' scales,
   then their offsets (zero - 8 scale), decoded once for all of a call's tiles, eight rows a vector. */
static void unpack_block_scales(const uint8_t *block_scales, int groups, float *floats) {
    for (int g = 0; g < groups; g++)
        for (int row0 = 0; row0 < BLOCK_ROWS; row0 += 8) {
            const __m256i factors = _mm256_loadu_si256((const __m256i *)(run_factors(block_scales, g) + 2 * row0));
            const __m128i codes = _mm_loadu_si128((const __m128i *)(group_codes(block_scales, g) + 2 * row0));
            __m256 scale, offset;
            eight_scales_and_offsets(factors, codes, &scale, &offset);
            _mm256_storeu_ps(floats + (size_t)g * 2 * BLOCK_ROWS + row0, scale);
            _mm256_storeu_ps(floats + (size_t)g * 2 * BLOCK_ROWS + BLOCK_ROWS + row0, offset);
        }
}

/* The activations' codes, scales and code totals [M, ...] transposed eight rows to a vector: codes xt [V, K / 4, 8, 4],
   scales and totals [V, K / group, 8] (V = M / 8 rounded up; rows past M are zero, so they add nothing). */
static void transpose_activations(const int8_t *high, const float *scales, const float *code_totals, int count,
                                  int width, int groups, int8_t *xt, float *xt_scales, float *xt_totals) {
    const int vectors = (count + 7) / 8, runs = width / 4;
    #pragma omp parallel for schedule(static)
    for (int v = 0; v < vectors; v++)
        for (int lane = 0; lane < 8; lane++) {
            const int m = 8 * v + lane;
            int32_t *lanes = (int32_t *)xt + (size_t)v * runs * 8 + lane;
            const int32_t *row = (const int32_t *)(high + (size_t)m * width);
            for (int r = 0; r < runs; r++) lanes[8 * r] = m < count ? row[r] : 0;
            for (int g = 0; g < groups; g++) {
                xt_scales[((size_t)v * groups + g) * 8 + lane] = m < count ? scales[(size_t)m * groups + g] : 0.0f;
                xt_totals[((size_t)v * groups + g) * 8 + lane] = m < count ? code_totals[(size_t)m * groups + g] : 0.0f;
            }
        }
}

/* One tile: weight rows `lane0` .. lane0 + 3 of unpacked vector `weights` (its K / 4 runs) against `vectors` (1 ..
   X_VECTORS) vectors of activation rows from xt's vector `first` on, over groups first_group .. last_group - 1:
   their sums added to totals [W_ROWS, X_VECTORS] (eight activation rows a vector). block_floats: the block's scales
   and offsets (unpack_block_scales), row0: the first of those rows in the block. */
static inline __attribute__((always_inline)) void int4_many_tile(
        int vectors, const __m256i *weights, int lane0, const int8_t *xt, const float *xt_scales, const float *xt_totals,
        const float *block_floats, int row0, int width, int group, int first_group, int last_group, __m256 *totals) {
    const int runs = width / 4, groups = width / group;
    for (int g = first_group; g < last_group; g++) {
        __m256i dot[W_ROWS][X_VECTORS];
        for (int r = 0; r < W_ROWS; r++)
            for (int v = 0; v < vectors; v++) dot[r][v] = _mm256_setzero_si256();
        for (int run = g * group / 4; run < (g + 1) * group / 4; run++) {
            __m256i x[X_VECTORS];
            for (int v = 0; v < vectors; v++)
                x[v] = _mm256_load_si256((const __m256i *)(xt + ((size_t)v * runs + run) * 32));
            const uint8_t *four = (const uint8_t *)(weights + run) + 4 * lane0;
            for (int r = 0; r < W_ROWS; r++) {
                const __m256i w = _mm256_set1_epi32(*(const int32_t *)(four + 4 * r));
                for (int v = 0; v < vectors; v++) dot[r][v] = add_products(dot[r][v], w, x[v]);
            }
        }
        const float *group_floats = block_floats + (size_t)g * 2 * BLOCK_ROWS + row0;
        for (int r = 0; r < W_ROWS; r++) {
            const __m256 scale = _mm256_broadcast_ss(group_floats + r);
            const __m256 offset = _mm256_broadcast_ss(group_floats + BLOCK_ROWS + r);
            for (int v = 0; v < vectors; v++) {
                const size_t at = ((size_t)v * groups + g) * 8;
                __m256 d = _mm256_cvtepi32_ps(widened(dot[r][v]));
                d = _mm256_fmadd_ps(offset, _mm256_load_ps(xt_totals + at), _mm256_mul_ps(d, scale));
                totals[r * X_VECTORS + v] = _mm256_fmadd_ps(d, _mm256_load_ps(xt_scales + at),
                                                            totals[r * X_VECTORS + v]);
            }
        }
    }
}

/* A tile's totals [W_ROWS, X_VECTORS] (vectors of them) into y's columns row0 .. row0 + 3, rows from 8 first_vector. */
static void store_tile(const __m256 *totals, int vectors, int first_vector, int count, int rows, int row0, float *y) {
    for (int r = 0; r < W_ROWS; r++)
        for (int v = 0; v < vectors; v++) {
            float lanes[8];
            _mm256_storeu_ps(lanes, totals[r * X_VECTORS + v]);
            for (int lane = 0; lane < 8 && 8 * (first_vector + v) + lane < count; lane++)
                y[(size_t)(8 * (first_vector + v) + lane) * rows + row0 + r] = lanes[lane];
        }
}

/* int4_matmul for M >= MANY_ROWS_FROM rows with one code a value, the codes already made: OpenMP over blocks. */
static void int4_matmul_many(const int8_t *high, const float *scales, const float *code_totals, int count, int width,
                             const uint8_t *packed, const uint8_t *group_scales, int rows, int group, float *y) {
    const int blocks = rows / BLOCK_ROWS, groups = width / group, vectors = (count + 7) / 8;
    int8_t *xt = aligned_alloc(32, (size_t)vectors * 8 * width);
    float *xt_scales = aligned_alloc(32, (size_t)vectors * groups * 8 * sizeof(float) * 2);
    float *xt_totals = xt_scales + (size_t)vectors * groups * 8;
    transpose_activations(high, scales, code_totals, count, width, groups, xt, xt_scales, xt_totals);
    const int tiles = 8 * 8 / W_ROWS, vector_runs = (vectors + X_VECTORS - 1) / X_VECTORS;
    const int chunk_groups = MANY_CHUNK > group ? MANY_CHUNK / group : 1;
    const size_t totals_bytes = (size_t)tiles * vector_runs * W_ROWS * X_VECTORS * sizeof(__m256);
    #pragma omp parallel
    {
        __m256i *unpacked = aligned_alloc(32, (size_t)width * BLOCK_ROWS);
        __m256 *totals = aligned_alloc(32, totals_bytes);  /* [tiles, vector_runs, W_ROWS, X_VECTORS] */
        float *block_floats = malloc((size_t)groups * 2 * BLOCK_ROWS * sizeof(float));
        #pragma omp for schedule(static)
        for (int b = 0; b < blocks; b++) {
            unpack_block(packed + (size_t)b * BLOCK_ROWS * (width / 2), width, unpacked);
            unpack_block_scales(group_scales + (size_t)b * int4_scale_bytes(groups), groups, block_floats);
            memset(totals, 0, totals_bytes);
            for (int g0 = 0; g0 < groups; g0 += chunk_groups) {  /* a chunk's activations stay in cache over the tiles */
                const int g1 = g0 + chunk_groups < groups ? g0 + chunk_groups : groups;
                for (int run = 0; run < vector_runs; run++) {
                    const int v0 = run * X_VECTORS, n = vectors - v0 < X_VECTORS ? vectors - v0 : X_VECTORS;
                    for (int tile = 0; tile < tiles; tile++) {
                        const int u = tile / (8 / W_ROWS), lane0 = W_ROWS * (tile % (8 / W_ROWS));
                        const int row0 = unpacked_row(u, lane0);  /* the tile's first weight row in the block */
                        __m256 *tile_totals = totals + ((size_t)tile * vector_runs + run) * W_ROWS * X_VECTORS;
                        #define MANY_TILE(k) int4_many_tile(k, unpacked + (size_t)u * (width / 4), lane0, \
                                                            xt + (size_t)v0 * 8 * width, xt_scales + (size_t)v0 * groups * 8, \
                                                            xt_totals + (size_t)v0 * groups * 8, block_floats, row0, \
                                                            width, group, g0, g1, tile_totals)
                        if (n == X_VECTORS) MANY_TILE(X_VECTORS);
                        else if (n == 2) MANY_TILE(2);
                        else MANY_TILE(1);
                        #undef MANY_TILE
                        if (g1 == groups) store_tile(tile_totals, n, v0, count, rows, b * BLOCK_ROWS + row0, y);
                    }
                }
            }
        }
        free(unpacked);
        free(totals);
        free(block_floats);
    }
    free(xt);
    free(xt_scales);
}

/* kernels.c's int4_matmul: y [M, N] = x [M, K] . W^T in the int4 layout (N a multiple of 64, K of group, group of
   4), group_scales as kernels.c's, 1 or 2 int8 codes an activation; scratch: M * (2K + 8K / group) bytes. Each
   block meets ROW_TILE activation rows at a time with one code, one row with two. */
void int4_matmul(const float *x, int count, int width, const uint8_t *packed, const uint8_t *group_scales,
                 int rows, int group, int codes, void *scratch, float *y) {
    const int blocks = rows / BLOCK_ROWS, groups = width / group, two_codes = codes == 2;
    const int tile = two_codes ? 1 : ROW_TILE;
    int8_t *high = (int8_t *)scratch, *low = high + (size_t)count * width;
    float *scales = (float *)(low + (size_t)count * width), *code_totals = scales + (size_t)count * groups;
    quantize_activations(x, count, width, group, high, two_codes ? low : NULL, scales, code_totals);
    if (!two_codes && count >= MANY_ROWS_FROM && group <= CODE_RUN) {
        int4_matmul_many(high, scales, code_totals, count, width, packed, group_scales, rows, group, y);
        return;
    }
    #pragma omp parallel for schedule(dynamic, blocks_a_take(blocks)) if (blocks > 1)
    for (int b = 0; b < blocks; b++) {
        const uint8_t *block = packed + (size_t)b * BLOCK_ROWS * (width / 2);
        const uint8_t *block_scales = group_scales + (size_t)b * int4_scale_bytes(groups);
        for (int m = 0; m < count; m += tile) {
            size_t x_at = (size_t)m * width, group_at = (size_t)m * groups;
            const int8_t *row_low = two_codes ? low + x_at : NULL;
            float *out = y + (size_t)m * rows;
            #define INT4_ROWS(n, two) int4_block(n, two, high + x_at, row_low, scales + group_at, \
                                                 code_totals + group_at, width, block, block_scales, rows, group, \
                                                 out, b * BLOCK_ROWS, m == 0)
            if (two_codes) INT4_ROWS(1, 1);
            else if (count - m >= ROW_TILE) INT4_ROWS(ROW_TILE, 0);
            else INT4_ROWS(1, 0);
            #undef INT4_ROWS
        }
    }
}

/* ------------------------------------------------------------------------------------------------------------------
   int8: packed [N / 64, K / 4, 4, 16, 4] uint8 holds q + 128; 32 bytes are eight rows' four columns. With AVX-VNNI,
   vpdpbusd multiplies the bytes as they are, unsigned, and each group's codes summed take the 128 out (as kernels.c
   does); else flipping the top bit gives q as a signed byte, and llama.cpp's sign trick (|q| by x carrying q's sign)
   keeps vpmaddubsw's pairs within int16: 2 x 127 x 127. */

#ifdef __AVXVNNI__
/* sums + a lane's four weight bytes times four activation codes. */
static inline __m256i add_int8_products(__m256i sums, __m256i bytes, __m256i x) {
    return _mm256_dpbusd_avx_epi32(sums, bytes, x);
}

static inline float byte_offset(float code_total) { return INT8_OFFSET * code_total; }  /* what the bytes' 128 added */
#else
/* sums + a lane's four weights (their bytes less 128) times four activation codes. */
static inline __m256i add_int8_products(__m256i sums, __m256i bytes, __m256i x) {
    __m256i q = _mm256_xor_si256(bytes, _mm256_set1_epi8((char)0x80));
    __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q));  /* |q| by x with q's sign */
    return _mm256_add_epi32(sums, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

static inline float byte_offset(float code_total) { (void)code_total; return 0.0f; }  /* the products are q's */
#endif

/* A block of 64 rows against `count` (1 or 2) activation rows, one code a value or two (`low` read only then):
   y[m, row0 .. row0 + 63]. A group's columns are 2 KiB of the block, read in order by its four quarters of 16 rows
   in turn (the later ones from cache), each quarter's sums in eight registers. read_ahead: as int4_block's. */
static inline __attribute__((always_inline)) void int8_block(
        int count, int two_codes, const int8_t *high, const int8_t *low, const float *scales, const float *code_totals,
        int width, const uint8_t *block, const uint16_t *weight_scales, int rows, float *y, int read_ahead) {
    const int groups = width / INT8_GROUP;
    __m256 total[2][8];
    for (int m = 0; m < count; m++)
        for (int i = 0; i < 8; i++) total[m][i] = _mm256_setzero_ps();
    for (int g = 0; g < groups; g++)
        for (int quarter = 0; quarter < 4; quarter++) {
            __m256i high_sums[2][2], low_sums[2][2];
            for (int m = 0; m < count; m++)
                for (int i = 0; i < 2; i++) high_sums[m][i] = low_sums[m][i] = _mm256_setzero_si256();
            for (int k = g * INT8_GROUP; k < (g + 1) * INT8_GROUP; k += 4) {
                const uint8_t *bytes = block + (size_t)k * BLOCK_ROWS + 64 * quarter;
                if (read_ahead && quarter == 0) prefetch_ahead(block + (size_t)k * BLOCK_ROWS, 4);
                __m256i weights[2];
                for (int i = 0; i < 2; i++) weights[i] = _mm256_loadu_si256((const __m256i *)(bytes + 32 * i));
                for (int m = 0; m < count; m++) {
                    __m256i x_high = _mm256_set1_epi32(*(const int32_t *)(high + (size_t)m * width + k));
                    for (int i = 0; i < 2; i++)
                        high_sums[m][i] = add_int8_products(high_sums[m][i], weights[i], x_high);
                    if (!two_codes) continue;
                    __m256i x_low = _mm256_set1_epi32(*(const int32_t *)(low + (size_t)m * width + k));
                    for (int i = 0; i < 2; i++)
                        low_sums[m][i] = add_int8_products(low_sums[m][i], weights[i], x_low);
                }
            }
            const uint16_t *group_scales = weight_scales + (size_t)g * BLOCK_ROWS + 16 * quarter;
            for (int i = 0; i < 2; i++) {
                __m256 scale = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(group_scales + 8 * i)));
                for (int m = 0; m < count; m++) {
                    const size_t at = (size_t)m * groups + g;
                    __m256 dot = _mm256_cvtepi32_ps(high_sums[m][i]);
                    if (two_codes)
                        dot = _mm256_fmadd_ps(_mm256_cvtepi32_ps(low_sums[m][i]), _mm256_set1_ps(1.0f / LOW_STEPS),
                                              dot);
                    dot = _mm256_sub_ps(dot, _mm256_set1_ps(byte_offset(code_totals[at])));
                    __m256 factor = _mm256_mul_ps(scale, _mm256_set1_ps(scales[at]));
                    total[m][2 * quarter + i] = _mm256_fmadd_ps(dot, factor, total[m][2 * quarter + i]);
                }
            }
        }
    for (int m = 0; m < count; m++)
        for (int i = 0; i < 8; i++) _mm256_storeu_ps(y + (size_t)m * rows + 8 * i, total[m][i]);
}

/* kernels.c's int8_matmul: y [M, N] = x [M, K] . W^T in the int8 layout (N a multiple of 64, K of 32), weight_scales
   [N / 64, K / 32, 64] fp16, w = q * scale; codes: 1 or 2 an activation; scratch: M * (2K + 8K / 32) bytes. */
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
        for (int m = 0; m < count; m += 2) {
            size_t x_at = (size_t)m * width, group_at = (size_t)m * groups;
            float *out = y + (size_t)m * rows + (size_t)b * BLOCK_ROWS;
            if (count - m >= 2)
                int8_block(2, two_codes, high + x_at, low + x_at, scales + group_at, code_totals + group_at, width,
                           block, block_scales, rows, out, m == 0);
            else
                int8_block(1, two_codes, high + x_at, low + x_at, scales + group_at, code_totals + group_at, width,
                           block, block_scales, rows, out, m == 0);
        }
    }
}

/* ------------------------------------------------------------------------------------------------------------------
   Attention over a block pool's layer [2, Hkv, P, hd] bf16 (keys, then values; hd a multiple of 16). */

/* score[0 .. count - 1] as e^(score - most), returning their sum. */
static float weights_of(float *score, int count, float most) {
    __m256 sum = _mm256_setzero_ps();
    int p = 0;
    for (; p + 8 <= count; p += 8) {
        __m256 weight = exp_of_negative(_mm256_sub_ps(_mm256_loadu_ps(score + p), _mm256_set1_ps(most)));
        _mm256_storeu_ps(score + p, weight);
        sum = _mm256_add_ps(sum, weight);
    }
    float total = sum_of(sum);
    for (; p < count; p++) {
        score[p] = expf(score[p] - most);
        total += score[p];
    }
    return total;
}

/* Decode row i's attention for kv head h (decode_attention's arguments), its K/V rows bf16 or, with int8, int8 rows
   (kv_row_bytes): inlined with int8 a constant, so each format's loop is its own. */
static inline __attribute__((always_inline)) void decode_task(
        const float *q, float *out, const uint8_t *layer, const int32_t *rows, const int32_t *first_run,
        const int32_t *runs, int heads, int kv_heads, int head_dim, int64_t positions, const float *sinks,
        int i, int h, int int8) {
    const int groups = heads / kv_heads, vectors = head_dim / 8;
    const size_t row = kv_row_bytes(head_dim, int8);
    const float *queries = q + ((size_t)rows[i] * heads + (size_t)h * groups) * head_dim;
    const uint8_t *keys = layer + (size_t)h * positions * row;
    const uint8_t *values = layer + ((size_t)kv_heads + h) * positions * row;
    __m256 query[MAX_GROUPS][MAX_HEAD_DIM / 8], acc[MAX_GROUPS][MAX_HEAD_DIM / 8];
    float best[MAX_GROUPS], weight_sum[MAX_GROUPS], score[MAX_GROUPS][POSITIONS];
    for (int g = 0; g < groups; g++) {
        best[g] = -INFINITY;
        weight_sum[g] = 0.0f;
        for (int v = 0; v < vectors; v++) {
            query[g][v] = _mm256_loadu_ps(queries + (size_t)g * head_dim + 8 * v);
            acc[g][v] = _mm256_setzero_ps();
        }
    }
    for (int j = first_run[i]; j < first_run[i + 1]; j++)
        for (int64_t start = runs[2 * j]; start < runs[2 * j + 1]; start += POSITIONS) {
            int count = (int)(runs[2 * j + 1] - start < POSITIONS ? runs[2 * j + 1] - start : POSITIONS);
            for (int p = 0; p < count; p++) {
                const uint8_t *key_row = keys + (size_t)(start + p) * row;
                __m256 key[MAX_HEAD_DIM / 8];
                for (int v = 0; v < vectors; v++) key[v] = kv_load(key_row, v, head_dim, int8);
                for (int g = 0; g < groups; g++) {
                    __m256 dot = _mm256_mul_ps(query[g][0], key[0]);
                    for (int v = 1; v < vectors; v++) dot = _mm256_fmadd_ps(query[g][v], key[v], dot);
                    score[g][p] = sum_of(dot);
                }
            }
            for (int g = 0; g < groups; g++) {
                float most = best[g];
                for (int p = 0; p < count; p++) most = score[g][p] > most ? score[g][p] : most;  /* not fmaxf's call */
                float kept = expf(best[g] - most);  /* 0 at the first tile */
                weight_sum[g] = weight_sum[g] * kept + weights_of(score[g], count, most);
                for (int v = 0; v < vectors; v++) acc[g][v] = _mm256_mul_ps(acc[g][v], _mm256_set1_ps(kept));
                best[g] = most;
            }
            for (int p = 0; p < count; p++) {
                const uint8_t *value = values + (size_t)(start + p) * row;
                for (int v = 0; v < vectors; v++) {
                    __m256 part = kv_load(value, v, head_dim, int8);
                    for (int g = 0; g < groups; g++)
                        acc[g][v] = _mm256_fmadd_ps(_mm256_set1_ps(score[g][p]), part, acc[g][v]);
                }
            }
        }
    for (int g = 0; g < groups; g++) {
        float *target = out + ((size_t)rows[i] * heads + (size_t)h * groups + g) * head_dim;
        __m256 inverse = _mm256_set1_ps(softmax_inverse(best[g], weight_sum[g], sinks, h * groups + g));
        for (int v = 0; v < vectors; v++) _mm256_storeu_ps(target + 8 * v, _mm256_mul_ps(acc[g][v], inverse));
    }
}

/* kernels.c's decode_attention: query row rows[i] of q [R, H, hd] (already scaled) attends to the positions
   runs[2j] .. runs[2j + 1] - 1 for first_run[i] <= j < first_run[i + 1]; query head h uses kv head h / (H / Hkv);
   out [R, H, hd]. A running maximum over tiles of positions: every position is read once. */
void decode_attention(const float *q, float *out, const uint16_t *layer, const int32_t *rows, int row_count,
                      const int32_t *first_run, const int32_t *runs, int heads, int kv_heads, int head_dim,
                      int64_t positions, const float *sinks) {
    #pragma omp parallel for collapse(2) schedule(static) if (row_count * kv_heads > 1)
    for (int i = 0; i < row_count; i++)
        for (int h = 0; h < kv_heads; h++)
            decode_task(q, out, (const uint8_t *)layer, rows, first_run, runs, heads, kv_heads, head_dim, positions,
                        sinks, i, h, 0);
}

/* kernels.c's decode_attention_q8: over an int8 pool's layer [2, Hkv, P, row] (kv_row_bytes), each row's codes times
   its scales in fp32 as they are read. */
void decode_attention_q8(const float *q, float *out, const uint8_t *layer, const int32_t *rows, int row_count,
                         const int32_t *first_run, const int32_t *runs, int heads, int kv_heads, int head_dim,
                         int64_t positions, const float *sinks) {
    #pragma omp parallel for collapse(2) schedule(static) if (row_count * kv_heads > 1)
    for (int i = 0; i < row_count; i++)
        for (int h = 0; h < kv_heads; h++)
            decode_task(q, out, layer, rows, first_run, runs, heads, kv_heads, head_dim, positions, sinks, i, h, 1);
}

#define CHUNK_QUERIES 16  /* a chunk task's queries (rows times query heads of one kv head): two vectors */
#define KEYS_AT_ONCE 6    /* positions scored together: 12 running sums beside the two query vectors */
#define DIMS_AT_ONCE 4    /* value dimensions summed together, likewise */

/* The scores of `m` (at most KEYS_AT_ONCE) consecutive keys against a chunk task's queries: sums[p][v]. The keys
   bf16, or fp32 (KEY a constant of the inlined copy: an int8 tile is widened once, chunk_tile). */
#define KEY_BF16 0
#define KEY_FP32 1
static inline __attribute__((always_inline)) __m256 key_broadcast(const void *keys, size_t at, int key) {
    return key == KEY_BF16 ? bf16_broadcast((const uint16_t *)keys + at) : _mm256_set1_ps(((const float *)keys)[at]);
}

static inline __attribute__((always_inline)) void score_keys(const void *keys, int key, int m, int head_dim,
                                                             const float (*qt)[CHUNK_QUERIES],
                                                             __m256 sums[KEYS_AT_ONCE][2]) {
    for (int p = 0; p < KEYS_AT_ONCE; p++) sums[p][0] = sums[p][1] = _mm256_setzero_ps();
    for (int d = 0; d < head_dim; d++) {
        __m256 q0 = _mm256_load_ps(qt[d]), q1 = _mm256_load_ps(qt[d] + 8);
        for (int p = 0; p < m; p++) {
            __m256 k = key_broadcast(keys, (size_t)p * head_dim + d, key);
            sums[p][0] = _mm256_fmadd_ps(q0, k, sums[p][0]);
            sums[p][1] = _mm256_fmadd_ps(q1, k, sums[p][1]);
        }
    }
}

/* n consecutive int8 K/V rows (kv_row_bytes each) as fp32 [n, head_dim]. */
static void kv_widen_int8(const uint8_t *rows, int n, int head_dim, float *out) {
    const size_t row = kv_row_bytes(head_dim, 1);
    for (int p = 0; p < n; p++)
        for (int v = 0; v < head_dim / 8; v++)
            _mm256_storeu_ps(out + (size_t)p * head_dim + 8 * v, kv_load(rows + p * row, v, head_dim, 1));
}

/* A chunk task's score and value sums over the positions slot .. slot + n - 1 (logical positions logical ..), their
   keys and values bf16 (broadcast from the pool) or, with int8, int8 rows (widened to fp32 once a tile).
   qt [hd][16]: the task's queries, transposed; acc [hd][16]: its weighted values; best, total: per query. */
static void chunk_tile(const uint8_t *key_rows, const uint8_t *value_rows, int int8, int64_t slot, int n,
                       int64_t logical, int head_dim, const float (*qt)[CHUNK_QUERIES], float (*acc)[CHUNK_QUERIES],
                       const __m256i limit[2], const __m256i low[2], __m256 best[2], __m256 total[2]) {
    float widened[2][POSITIONS * MAX_HEAD_DIM];  /* an int8 tile's keys and values as fp32 */
    const void *keys = key_rows + slot * 2 * head_dim, *values = value_rows + slot * 2 * head_dim;
    const int key = int8 ? KEY_FP32 : KEY_BF16;
    if (int8) {
        kv_widen_int8(key_rows + slot * kv_row_bytes(head_dim, 1), n, head_dim, widened[0]);
        kv_widen_int8(value_rows + slot * kv_row_bytes(head_dim, 1), n, head_dim, widened[1]);
        keys = widened[0];
        values = widened[1];
    }
    __m256 score[POSITIONS][2];
    for (int p0 = 0; p0 < n; p0 += KEYS_AT_ONCE) {
        int m = n - p0 < KEYS_AT_ONCE ? n - p0 : KEYS_AT_ONCE;
        __m256 sums[KEYS_AT_ONCE][2];
        size_t at = (size_t)p0 * head_dim;
        if (m == KEYS_AT_ONCE && key == KEY_BF16)
            score_keys((const uint16_t *)keys + at, KEY_BF16, KEYS_AT_ONCE, head_dim, qt, sums);
        else if (m == KEYS_AT_ONCE)
            score_keys((const float *)keys + at, KEY_FP32, KEYS_AT_ONCE, head_dim, qt, sums);
        else if (key == KEY_BF16)
            score_keys((const uint16_t *)keys + at, KEY_BF16, m, head_dim, qt, sums);
        else
            score_keys((const float *)keys + at, KEY_FP32, m, head_dim, qt, sums);
        for (int p = 0; p < m; p++)
            for (int v = 0; v < 2; v++) {  /* a query sees the positions from its low on, before its limit */
                __m256i position = _mm256_set1_epi32((int)(logical + p0 + p));
                __m256 seen = _mm256_castsi256_ps(_mm256_andnot_si256(_mm256_cmpgt_epi32(low[v], position),
                                                                      _mm256_cmpgt_epi32(limit[v], position)));
                score[p0 + p][v] = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), sums[p][v], seen);
            }
    }
    __m256 kept[2];
    for (int v = 0; v < 2; v++) {
        __m256 most = best[v];
        for (int p = 0; p < n; p++) most = _mm256_max_ps(most, score[p][v]);
        kept[v] = exp_of_negative(_mm256_sub_ps(best[v], most));  /* ~0 at the first tile */
        total[v] = _mm256_mul_ps(total[v], kept[v]);
        for (int p = 0; p < n; p++) {
            score[p][v] = exp_of_negative(_mm256_sub_ps(score[p][v], most));
            total[v] = _mm256_add_ps(total[v], score[p][v]);
        }
        best[v] = most;
    }
    for (int d0 = 0; d0 < head_dim; d0 += DIMS_AT_ONCE) {
        __m256 sums[DIMS_AT_ONCE][2];
        for (int i = 0; i < DIMS_AT_ONCE; i++)
            for (int v = 0; v < 2; v++) sums[i][v] = _mm256_mul_ps(_mm256_load_ps(acc[d0 + i] + 8 * v), kept[v]);
        for (int p = 0; p < n; p++) {
            size_t at = (size_t)p * head_dim + d0;
            for (int i = 0; i < DIMS_AT_ONCE; i++) {
                __m256 part = key_broadcast(values, at + i, key);
                sums[i][0] = _mm256_fmadd_ps(score[p][0], part, sums[i][0]);
                sums[i][1] = _mm256_fmadd_ps(score[p][1], part, sums[i][1]);
            }
        }
        for (int i = 0; i < DIMS_AT_ONCE; i++)
            for (int v = 0; v < 2; v++) _mm256_store_ps(acc[d0 + i] + 8 * v, sums[i][v]);
    }
}

/* kernels.c's chunk_attention: rows first_row .. first_row + count - 1 of q [R, H, hd] (already scaled), row r at
   position start + r counted from the first position the runs hold, each attending to the positions up to its own
   (with window > 0 only the last `window` of them), which lie in the runs runs[2j] .. runs[2j + 1] - 1 (j <
   run_count, in order). Each task takes one kv head and a few rows, its queries in the lanes of two vectors. */
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
            float qt[MAX_HEAD_DIM][CHUNK_QUERIES] __attribute__((aligned(32)));
            float acc[MAX_HEAD_DIM][CHUNK_QUERIES] __attribute__((aligned(32)));
            int32_t limits[CHUNK_QUERIES] __attribute__((aligned(32)));
            int32_t lows[CHUNK_QUERIES] __attribute__((aligned(32)));
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
            __m256i limit[2] = {_mm256_load_si256((const __m256i *)limits),
                                _mm256_load_si256((const __m256i *)(limits + 8))};
            __m256i low[2] = {_mm256_load_si256((const __m256i *)lows), _mm256_load_si256((const __m256i *)(lows + 8))};
            __m256 best[2] = {_mm256_set1_ps(-INFINITY), _mm256_set1_ps(-INFINITY)};
            __m256 total[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
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
            float totals[CHUNK_QUERIES] __attribute__((aligned(32)));
            _mm256_store_ps(totals, total[0]);
            _mm256_store_ps(totals + 8, total[1]);
            for (int j = 0; j < queries; j++) {
                float *target = out + ((size_t)(first_row + r0 + j / groups) * heads + (size_t)h * groups
                                       + j % groups) * head_dim;
                for (int d = 0; d < head_dim; d++) target[d] = acc[d][j] / totals[j];
            }
        }
}

/* kernels.c's chunk_attention: rows first_row .. first_row + count - 1 of q [R, H, hd] (already scaled), row r at
   position start + r counted from the first position the runs hold, each attending to the positions up to its own
   (with window > 0 only the last `window` of them), which lie in the runs runs[2j] .. runs[2j + 1] - 1 (j <
   run_count, in order). Each task takes one kv head and a few rows, its queries in the lanes of two vectors. */
void chunk_attention(const float *q, float *out, const uint16_t *layer, int first_row, int count, int start,
                     const int32_t *runs, int run_count, int heads, int kv_heads, int head_dim, int64_t positions,
                     int window) {
    chunk_attention_rows(q, out, (const uint8_t *)layer, 0, first_row, count, start, runs, run_count, heads, kv_heads,
                         head_dim, positions, window);
}

/* kernels.c's chunk_attention_q8: over an int8 pool's layer [2, Hkv, P, row] (kv_row_bytes), each tile's rows
   dequantized to fp32 once, the sums in fp32. */
void chunk_attention_q8(const float *q, float *out, const uint8_t *layer, int first_row, int count, int start,
                        const int32_t *runs, int run_count, int heads, int kv_heads, int head_dim, int64_t positions,
                        int window) {
    chunk_attention_rows(q, out, layer, 1, first_row, count, start, runs, run_count, heads, kv_heads, head_dim,
                         positions, window);
}

/* ------------------------------------------------------------------------------------------------------------------
   Norm, activation, rotation. */

/* out [M, K] = x [M, K] over each row's root mean square. */
void rms_norm(const float *x, int rows, int width, float eps, float *out) {
    #pragma omp parallel for schedule(static) if (rows >= 64)
    for (int m = 0; m < rows; m++) {
        const float *row = x + (size_t)m * width;
        __m256 squares = _mm256_setzero_ps();
        int k = 0;
        for (; k + 8 <= width; k += 8) {
            __m256 value = _mm256_loadu_ps(row + k);
            squares = _mm256_fmadd_ps(value, value, squares);
        }
        float total = sum_of(squares);
        for (; k < width; k++) total += row[k] * row[k];
        const float scale = 1.0f / sqrtf(total / (float)width + eps);
        float *target = out + (size_t)m * width;
        for (k = 0; k + 8 <= width; k += 8)
            _mm256_storeu_ps(target + k, _mm256_mul_ps(_mm256_loadu_ps(row + k), _mm256_set1_ps(scale)));
        for (; k < width; k++) target[k] = row[k] * scale;
    }
}

/* kernels.c's swiglu: out [M, F] = g * sigmoid(alpha g) * (u + shift) for gate_up [M, 2F] (F a multiple of 8), g
   the gate clamped from above at limit, u the up clamped to [-limit, limit]; sigmoid(a) = 1 / (1 + e^-a), or
   e^a / (1 + e^a) for a < 0, so e's argument is never positive. */
void swiglu(const float *gate_up, int rows, int width, float limit, float alpha, float shift, float *out) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    const __m256 high = _mm256_set1_ps(limit), low = _mm256_set1_ps(-limit);
    #pragma omp parallel for schedule(static) if (rows >= 16)
    for (int m = 0; m < rows; m++) {
        const float *gate = gate_up + (size_t)m * 2 * width, *up = gate + width;
        for (int k = 0; k < width; k += 8) {
            __m256 g = _mm256_min_ps(high, _mm256_loadu_ps(gate + k));  /* the second operand where one is NaN */
            __m256 a = _mm256_mul_ps(g, _mm256_set1_ps(alpha));
            __m256 e = exp_of_negative(_mm256_or_ps(a, sign));  /* e^-|a| */
            __m256 numerator = _mm256_blendv_ps(one, e, a);  /* e where a's sign bit is set */
            __m256 sigmoid = _mm256_div_ps(numerator, _mm256_add_ps(one, e));
            __m256 u = _mm256_max_ps(low, _mm256_min_ps(high, _mm256_loadu_ps(up + k)));
            _mm256_storeu_ps(out + (size_t)m * width + k,
                             _mm256_mul_ps(_mm256_mul_ps(g, sigmoid), _mm256_add_ps(u, _mm256_set1_ps(shift))));
        }
    }
}

/* 8 values of x (4 pairs) times the complex numbers turns (cos, sin), pair by pair:
   (x0 cos - x1 sin, x1 cos + x0 sin). */
static inline __m256 rotated_pairs(const float *x, const float *turns) {
    __m256 v = _mm256_loadu_ps(x), turn = _mm256_loadu_ps(turns);
    __m256 swapped_sin = _mm256_mul_ps(_mm256_permute_ps(v, 0xB1), _mm256_movehdup_ps(turn));  /* x1 s, x0 s */
    return _mm256_fmaddsub_ps(v, _mm256_moveldup_ps(turn), swapped_sin);
}

/* A step row's queries [heads, hd] rotated in place by its turns [hd] (rotated_pairs). */
static inline void rotate_queries(float *row, const float *turn, int heads, int head_dim) {
    for (int h = 0; h < heads; h++) {
        float *query = row + (size_t)h * head_dim;
        for (int k = 0; k < head_dim; k += 8) _mm256_storeu_ps(query + k, rotated_pairs(query + k, turn + k));
    }
}

/* kernels.c's rotate_and_store: qkv [S, H + 2Hkv, hd], turns [S, hd / 2, 2], slots [S]. The queries are rotated in
   place, the keys rotated into layer [2, Hkv, P, hd] bf16 at their slots and the values stored there, both rounded
   to nearest even. */
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
            for (int k = 0; k < head_dim; k += 8) {
                bf16_store(layer + at + k, rotated_pairs(key + k, turn + k));
                bf16_store(values + at + k, _mm256_loadu_ps(value + k));
            }
        }
    }
}

/* kernels.c's rotate_and_store_q8: the rotated keys and the values quantized to an int8 pool's rows (layer
   [2, Hkv, P, row], kv_row_bytes; quantize_kv_row), their scales rounded to fp16. */
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
            for (int k = 0; k < head_dim; k += 8) _mm256_storeu_ps(rotated + k, rotated_pairs(key + k, turn + k));
            kv_store_int8(layer + at, rotated, head_dim);
            kv_store_int8(layer + (size_t)kv_heads * positions * row_bytes + at, value, head_dim);
        }
    }
}

/* kernels.c's int4_layout_from_nibbles: a 4-bit GGUF type's nibble bytes of `rows` rows (a multiple of 64; byte i of
   run r of a row at row * row_stride + r * run_stride + i holds its code 2Lr + i low and 2Lr + L + i high) into the
   int4 layout out [rows, K / 2], a block at a time: rows j and j + 32's bytes become two output bytes. */
void int4_layout_from_nibbles(const uint8_t *nibbles, int rows, int runs, int length, int64_t row_stride,
                              int64_t run_stride, uint8_t *out) {
    const int blocks = rows / BLOCK_ROWS, width = runs * 2 * length;
    #pragma omp parallel for schedule(static)
    for (int b = 0; b < blocks; b++) {
        const uint8_t *low_rows = nibbles + (int64_t)b * BLOCK_ROWS * row_stride;
        const uint8_t *high_rows = low_rows + (int64_t)HALF_ROWS * row_stride;
        uint8_t *block = out + (size_t)b * BLOCK_ROWS * (width / 2);
        for (int r = 0; r < runs; r++)
            for (int i = 0; i < length; i++) {
                uint8_t *first = block + ((size_t)r * 2 * length + i) * HALF_ROWS;
                uint8_t *second = first + (size_t)length * HALF_ROWS;
                for (int j = 0; j < HALF_ROWS; j++) {
                    const uint8_t low = low_rows[j * row_stride + r * run_stride + i];
                    const uint8_t high = high_rows[j * row_stride + r * run_stride + i];
                    first[j] = (uint8_t)((low & 0x0F) | (high << 4));
                    second[j] = (uint8_t)((low >> 4) | (high & 0xF0));
                }
            }
    }
}

/* No AMX functions in this variant. */
int amx_enable(void) { return -1; }
