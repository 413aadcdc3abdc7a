/* Hearth's CPU kernels for ARM's 64-bit NEON (variants.py's "neon": Apple's M chips, Graviton, Ampere, Snapdragon X,
   Raspberry Pi), with kernels.c's exported functions and arguments (engine thread; OpenMP threads inside each call).
   Where kernels.c multiplies int8 codes with AVX-512's vpdpbusd, these take the dot-product extension's sdot (four
   signed byte products summed into each 32-bit lane; ARMv8.2 and later: Apple M1, Cortex-A55/A76 on) where the CPU
   has it, asked once (HWCAP on Linux, sysctl on macOS), else the same sums from widening multiplies (smull, then
   pairwise adds). The functions that take sdot are compiled for it alone, so one library built for plain ARMv8-A
   runs on either. The K/V cache is bf16 (uint16 storage): a value's fp32 is its 16 bits above 16 zero bits. No AMX
   here: amx_enable says so. */

#if !defined(__aarch64__)
#error "the neon variant of Hearth's kernels is for 64-bit ARM (aarch64, arm64)"
#endif

#include <arm_neon.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)  /* Linux's bit for the dot-product extension, where the C library's headers lack it */
#endif
#elif defined(__APPLE__)
#include <sys/sysctl.h>
#endif

#include "kernels_common.h"

#define HALF_ROWS 32  /* a block's rows one nibble of its bytes holds (cpu_int4_layout) */

/* Whether this CPU has the dot-product extension (FEAT_DotProd): asked once, on the first call's own thread. */
static int has_dot_products(void) {
    static int known = -1;
    if (known < 0) {
#if defined(__ARM_FEATURE_DOTPROD)
        known = 1;
#elif defined(__linux__)
        known = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#elif defined(__APPLE__)
        int offered = 0;
        size_t size = sizeof offered;
        known = sysctlbyname("hw.optional.arm.FEAT_DotProd", &offered, &size, NULL, 0) == 0 && offered;
#else
        known = 0;
#endif
    }
    return known;
}

/* The functions that may take sdot are compiled with the dot-product extension where the file's target lacks it (GCC
   as ARMv8.2-A with it: GNU as takes sdot on that base only); they run only where has_dot_products(). */
#if defined(__ARM_FEATURE_DOTPROD)
#define DOT_PRODUCTS
#elif defined(__clang__)
#define DOT_PRODUCTS __attribute__((target("dotprod")))
#else
#define DOT_PRODUCTS __attribute__((target("arch=armv8.2-a+dotprod")))
#endif

/* acc[i] += a[4i] b[4i] + .. + a[4i + 3] b[4i + 3] with sdot, written out (older clangs declare vdotq_s32 only where
   the whole file targets the extension). Inlined only into DOT_PRODUCTS functions: elsewhere the call stays, and
   dot_add never makes it. */
static inline DOT_PRODUCTS int32x4_t sdot_add(int32x4_t acc, int8x16_t a, int8x16_t b) {
    __asm__("sdot %0.4s, %1.16b, %2.16b" : "+w"(acc) : "w"(a), "w"(b));
    return acc;
}

/* acc[i] += a[4i] b[4i] + .. + a[4i + 3] b[4i + 3], signed bytes: sdot where `sdot` (a constant once inlined), else
   smull's int16 products summed in pairs (each pair within int16 while neither byte is -128 in both operands). */
static inline __attribute__((always_inline)) int32x4_t dot_add(int32x4_t acc, int8x16_t a, int8x16_t b, int sdot) {
    if (sdot) return sdot_add(acc, a, b);
    int16x8_t pairs = vpaddq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b)), vmull_high_s8(a, b));
    return vpadalq_s16(acc, pairs);
}

/* Four activation codes x[0 .. 3] in every 32-bit lane. */
static inline int8x16_t four_codes(const int8_t *x) {
    int32_t word;
    memcpy(&word, x, sizeof word);
    return vreinterpretq_s8_s32(vdupq_n_s32(word));
}

/* 4 consecutive bf16 values as fp32. */
static inline float32x4_t bf16_load(const uint16_t *values) {
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(values), 16));
}

/* 4 fp32 values as bf16, rounded to nearest even as PyTorch rounds (a NaN stays a NaN). */
static inline void bf16_store(uint16_t *target, float32x4_t x) {
    uint32x4_t bits = vreinterpretq_u32_f32(x);
    uint32x4_t odd = vandq_u32(vshrq_n_u32(bits, 16), vdupq_n_u32(1));
    uint32x4_t rounded = vaddq_u32(bits, vaddq_u32(odd, vdupq_n_u32(0x7FFF)));
    uint32x4_t number = vceqq_f32(x, x);
    rounded = vbslq_u32(number, rounded, vorrq_u32(bits, vdupq_n_u32(0x00400000)));
    vst1_u16(target, vshrn_n_u32(rounded, 16));
}

/* e^x for x <= 0: 2^(x log2 e) as 2^n (built in the exponent's bits) times a degree-6 polynomial of 2^f, |f| <= 1/2;
   x is first raised to -87, where 2^n is still a normal float (e^-87 ~ 1.6e-38 stands for anything smaller). */
static inline float32x4_t exp_of_negative(float32x4_t x) {
    float32x4_t t = vmulq_f32(vmaxq_f32(x, vdupq_n_f32(-87.0f)), vdupq_n_f32(1.44269504089f));
    int32x4_t n = vcvtnq_s32_f32(t);
    float32x4_t f = vsubq_f32(t, vcvtq_f32_s32(n));
    static const float terms[] = {1.540353e-4f, 1.3333558e-3f, 9.6181291e-3f, 5.5504109e-2f, 0.24022651f,
                                  0.69314718f, 1.0f};
    float32x4_t power = vdupq_n_f32(terms[0]);
    for (int i = 1; i < 7; i++) power = vfmaq_f32(vdupq_n_f32(terms[i]), power, f);
    int32x4_t two_to_n = vshlq_n_s32(vaddq_s32(n, vdupq_n_s32(127)), 23);
    return vmulq_f32(power, vreinterpretq_f32_s32(two_to_n));
}

/* ------------------------------------------------------------------------------------------------------------------
   int4: a block of 64 rows is [K, 32] bytes, byte (k, j) row j's code k in its low nibble and row j + 32's in its
   high one. A pass takes the bytes j0 .. j0 + 15 of four columns (j0: 0 or 16) and interleaves them (zip of bytes,
   then of pairs) into four vectors of four rows' four codes: their low nibbles rows j0 .. j0 + 15, their high ones
   rows j0 + 32 .. j0 + 47. */

/* Columns k .. k + 3 of the bytes j0 .. j0 + 15 (`bytes`: column k's) as eight vectors of a row's four codes in each
   lane: codes[t] rows j0 + 4t .. j0 + 4t + 3, codes[4 + t] the same rows + 32. */
static inline __attribute__((always_inline)) void four_columns(const uint8_t *bytes, int8x16_t codes[8]) {
    uint8x16_t c0 = vld1q_u8(bytes), c1 = vld1q_u8(bytes + HALF_ROWS), c2 = vld1q_u8(bytes + 2 * HALF_ROWS),
               c3 = vld1q_u8(bytes + 3 * HALF_ROWS);
    uint16x8_t low01 = vreinterpretq_u16_u8(vzip1q_u8(c0, c1)), high01 = vreinterpretq_u16_u8(vzip2q_u8(c0, c1));
    uint16x8_t low23 = vreinterpretq_u16_u8(vzip1q_u8(c2, c3)), high23 = vreinterpretq_u16_u8(vzip2q_u8(c2, c3));
    uint8x16_t rows[4] = {vreinterpretq_u8_u16(vzip1q_u16(low01, low23)),
                          vreinterpretq_u8_u16(vzip2q_u16(low01, low23)),
                          vreinterpretq_u8_u16(vzip1q_u16(high01, high23)),
                          vreinterpretq_u8_u16(vzip2q_u16(high01, high23))};
    for (int t = 0; t < 4; t++) {
        codes[t] = vreinterpretq_s8_u8(vandq_u8(rows[t], vdupq_n_u8(0x0F)));
        codes[4 + t] = vreinterpretq_s8_u8(vshrq_n_u8(rows[t], 4));
    }
}

/* Group g's scales and offsets of a block's rows row .. row + 3 (kernels_common.h's int4 scales, the block's from
   block_scales). */
static inline void group_scale_and_offset(const uint8_t *block_scales, int g, int row, float32x4_t *scale,
                                          float32x4_t *offset) {
    uint16x4x2_t factors = vld2_u16(run_factors(block_scales, g) + 2 * row);  /* four rows' d, then their e */
    int16x8_t codes = vmovl_s8(vld1_s8(group_codes(block_scales, g) + 2 * row));  /* (c, z) a row */
    int16x4x2_t split = vuzp_s16(vget_low_s16(codes), vget_high_s16(codes));  /* four c, then four z */
    *scale = vmulq_f32(vreinterpretq_f32_u32(vshll_n_u16(factors.val[0], 16)), vcvtq_f32_s32(vmovl_s16(split.val[0])));
    float32x4_t zero = vmulq_f32(vreinterpretq_f32_u32(vshll_n_u16(factors.val[1], 16)),
                                 vcvtq_f32_s32(vmovl_s16(split.val[1])));
    *offset = vfmsq_f32(zero, vdupq_n_f32(8.0f), *scale);  /* w = (q - 8) * scale + zero = q * scale + offset */
}

/* The block row of codes[i] (four codes a lane; four_columns) for the pass from byte j0. */
static inline int code_row(int j0, int i) { return j0 + 4 * (i % 4) + HALF_ROWS * (i / 4); }

/* A block of 64 rows against `count` (1 or 2) activation rows, one code a value or two (`low` read only then), with
   sdot where `sdot`: y[m, row0 .. row0 + 63]. Each group's bytes are read by the block's two passes in turn (the
   second from cache), each pass's integer sums in registers. */
static inline __attribute__((always_inline)) void int4_block(
        int sdot, int count, int two_codes, const int8_t *high, const int8_t *low, const float *scales,
        const float *code_totals, int width, const uint8_t *block, const uint8_t *block_scales, int rows, int group,
        float *y, int row0) {
    const int groups = width / group;
    float total[2][BLOCK_ROWS];
    memset(total, 0, sizeof total);
    for (int g = 0; g < groups; g++)
        for (int j0 = 0; j0 < HALF_ROWS; j0 += 16) {
            int32x4_t high_sums[2][8], low_sums[2][8];
            for (int m = 0; m < count; m++)
                for (int i = 0; i < 8; i++) high_sums[m][i] = low_sums[m][i] = vdupq_n_s32(0);
            for (int k = g * group; k < (g + 1) * group; k += 4) {
                int8x16_t codes[8];
                four_columns(block + (size_t)k * HALF_ROWS + j0, codes);
                for (int m = 0; m < count; m++) {
                    int8x16_t x = four_codes(high + (size_t)m * width + k);
                    for (int i = 0; i < 8; i++) high_sums[m][i] = dot_add(high_sums[m][i], codes[i], x, sdot);
                    if (two_codes) {
                        int8x16_t x_low = four_codes(low + (size_t)m * width + k);
                        for (int i = 0; i < 8; i++) low_sums[m][i] = dot_add(low_sums[m][i], codes[i], x_low, sdot);
                    }
                }
            }
            for (int i = 0; i < 8; i++) {
                const int row = code_row(j0, i);
                float32x4_t scale, offset;  /* w = q * scale + offset */
                group_scale_and_offset(block_scales, g, row, &scale, &offset);
                for (int m = 0; m < count; m++) {
                    size_t at = (size_t)m * groups + g;
                    float32x4_t dot = vcvtq_f32_s32(high_sums[m][i]);
                    if (two_codes)
                        dot = vfmaq_f32(dot, vcvtq_f32_s32(low_sums[m][i]), vdupq_n_f32(1.0f / LOW_STEPS));
                    float32x4_t d = vfmaq_f32(vmulq_f32(dot, scale), offset, vdupq_n_f32(code_totals[at]));
                    vst1q_f32(total[m] + row, vfmaq_f32(vld1q_f32(total[m] + row), d, vdupq_n_f32(scales[at])));
                }
            }
        }
    for (int m = 0; m < count; m++) memcpy(y + (size_t)m * rows + row0, total[m], sizeof total[m]);
}

/* A matmul call's activation codes (quantize_activations') and weights, which every block of rows reads. */
typedef struct {
    int count, width, rows, group, two_codes;
    const int8_t *high, *low;
    const float *scales, *code_totals;
    const uint8_t *packed;
    const void *weight_scales;  /* int4: the group scales (kernels_common.h); int8: the fp16 scales */
    float *y;
} matmul_call;

/* Block b of int4_matmul against every activation row, with sdot where `sdot`: two rows at a time with one code a
   value, one with two. */
static inline __attribute__((always_inline)) void int4_rows(int sdot, const matmul_call *call, int b) {
    const int width = call->width, group = call->group, groups = width / group, two_codes = call->two_codes;
    const uint8_t *block = call->packed + (size_t)b * BLOCK_ROWS * (width / 2);
    const uint8_t *block_scales = (const uint8_t *)call->weight_scales + (size_t)b * int4_scale_bytes(groups);
    for (int m = 0; m < call->count; m += two_codes ? 1 : 2) {
        size_t x_at = (size_t)m * width, group_at = (size_t)m * groups;
        const int8_t *high = call->high + x_at, *low = two_codes ? call->low + x_at : NULL;
        float *out = call->y + (size_t)m * call->rows;
        #define INT4_ROWS(n, two) int4_block(sdot, n, two, high, low, call->scales + group_at, \
                                             call->code_totals + group_at, width, block, block_scales, call->rows, \
                                             group, out, b * BLOCK_ROWS)
        if (two_codes) INT4_ROWS(1, 1);
        else if (call->count - m >= 2) INT4_ROWS(2, 0);
        else INT4_ROWS(1, 0);
        #undef INT4_ROWS
    }
}

static DOT_PRODUCTS void int4_rows_sdot(const matmul_call *call, int b) { int4_rows(1, call, b); }
static void int4_rows_smull(const matmul_call *call, int b) { int4_rows(0, call, b); }

/* kernels.c's int4_matmul: y [M, N] = x [M, K] . W^T in the int4 layout (N a multiple of 64, K of group, group of
   4), group_scales as kernels.c's, 1 or 2 int8 codes an activation; scratch: M * (2K + 8K / group) bytes. */
void int4_matmul(const float *x, int count, int width, const uint8_t *packed, const uint8_t *group_scales,
                 int rows, int group, int codes, void *scratch, float *y) {
    const int groups = width / group, two_codes = codes == 2;
    int8_t *high = (int8_t *)scratch, *low = high + (size_t)count * width;
    float *scales = (float *)(low + (size_t)count * width), *code_totals = scales + (size_t)count * groups;
    quantize_activations(x, count, width, group, high, two_codes ? low : NULL, scales, code_totals);
    const matmul_call call = {count, width, rows, group, two_codes, high, low, scales, code_totals, packed,
                              group_scales, y};
    void (*block_rows)(const matmul_call *, int) = has_dot_products() ? int4_rows_sdot : int4_rows_smull;
    #pragma omp parallel for schedule(dynamic, blocks_a_take(rows / BLOCK_ROWS)) if (rows > BLOCK_ROWS)
    for (int b = 0; b < rows / BLOCK_ROWS; b++) block_rows(&call, b);
}

/* ------------------------------------------------------------------------------------------------------------------
   int8: packed [N / 64, K / 4, 4, 16, 4] uint8 holds q + 128; 16 bytes are four rows' four columns, a lane a row.
   Flipping the top bit gives q as a signed byte, which sdot multiplies as it is. */

/* A block of 64 rows against `count` (1 or 2) activation rows, one code a value or two (`low` read only then), with
   sdot where `sdot`: y[m, 0 .. 63]. A group's columns are read by the block's four quarters of 16 rows in turn (the
   later ones from cache), each quarter's sums in registers. */
static inline __attribute__((always_inline)) void int8_block(
        int sdot, int count, int two_codes, const int8_t *high, const int8_t *low, const float *scales, int width,
        const uint8_t *block, const uint16_t *weight_scales, int rows, float *y) {
    const int groups = width / INT8_GROUP;
    float total[2][BLOCK_ROWS];
    memset(total, 0, sizeof total);
    for (int g = 0; g < groups; g++)
        for (int quarter = 0; quarter < 4; quarter++) {
            int32x4_t high_sums[2][4], low_sums[2][4];
            for (int m = 0; m < count; m++)
                for (int i = 0; i < 4; i++) high_sums[m][i] = low_sums[m][i] = vdupq_n_s32(0);
            for (int k = g * INT8_GROUP; k < (g + 1) * INT8_GROUP; k += 4) {
                const uint8_t *bytes = block + (size_t)k * BLOCK_ROWS + 64 * quarter;
                int8x16_t q[4];
                for (int i = 0; i < 4; i++) q[i] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(bytes + 16 * i),
                                                                                 vdupq_n_u8(0x80)));
                for (int m = 0; m < count; m++) {
                    int8x16_t x_high = four_codes(high + (size_t)m * width + k);
                    for (int i = 0; i < 4; i++) high_sums[m][i] = dot_add(high_sums[m][i], q[i], x_high, sdot);
                    if (!two_codes) continue;
                    int8x16_t x_low = four_codes(low + (size_t)m * width + k);
                    for (int i = 0; i < 4; i++) low_sums[m][i] = dot_add(low_sums[m][i], q[i], x_low, sdot);
                }
            }
            for (int i = 0; i < 4; i++) {
                const int row = 16 * quarter + 4 * i;
                float32x4_t scale = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(weight_scales
                                                                               + (size_t)g * BLOCK_ROWS + row)));
                for (int m = 0; m < count; m++) {
                    float32x4_t dot = vcvtq_f32_s32(high_sums[m][i]);
                    if (two_codes)
                        dot = vfmaq_f32(dot, vcvtq_f32_s32(low_sums[m][i]), vdupq_n_f32(1.0f / LOW_STEPS));
                    float32x4_t factor = vmulq_f32(scale, vdupq_n_f32(scales[(size_t)m * groups + g]));
                    vst1q_f32(total[m] + row, vfmaq_f32(vld1q_f32(total[m] + row), dot, factor));
                }
            }
        }
    for (int m = 0; m < count; m++) memcpy(y + (size_t)m * rows, total[m], sizeof total[m]);
}

/* Block b of int8_matmul against every activation row, two at a time, with sdot where `sdot`. */
static inline __attribute__((always_inline)) void int8_rows(int sdot, const matmul_call *call, int b) {
    const int width = call->width, groups = width / INT8_GROUP;
    const uint8_t *block = call->packed + (size_t)b * BLOCK_ROWS * width;
    const uint16_t *block_scales = (const uint16_t *)call->weight_scales + (size_t)b * groups * BLOCK_ROWS;
    for (int m = 0; m < call->count; m += 2) {
        size_t x_at = (size_t)m * width, group_at = (size_t)m * groups;
        const int8_t *high = call->high + x_at, *low = call->low + x_at;
        float *out = call->y + (size_t)m * call->rows + (size_t)b * BLOCK_ROWS;
        if (call->count - m >= 2)
            int8_block(sdot, 2, call->two_codes, high, low, call->scales + group_at, width, block, block_scales,
                       call->rows, out);
        else
            int8_block(sdot, 1, call->two_codes, high, low, call->scales + group_at, width, block, block_scales,
                       call->rows, out);
    }
}

static DOT_PRODUCTS void int8_rows_sdot(const matmul_call *call, int b) { int8_rows(1, call, b); }
static void int8_rows_smull(const matmul_call *call, int b) { int8_rows(0, call, b); }

/* kernels.c's int8_matmul: y [M, N] = x [M, K] . W^T in the int8 layout (N a multiple of 64, K of 32), weight_scales
   [N / 64, K / 32, 64] fp16, w = q * scale; codes: 1 or 2 an activation; scratch: M * (2K + 8K / 32) bytes. */
void int8_matmul(const float *x, int count, int width, const uint8_t *packed, const uint16_t *weight_scales,
                 int rows, int codes, void *scratch, float *y) {
    const int groups = width / INT8_GROUP, two_codes = codes == 2;
    int8_t *high = (int8_t *)scratch, *low = high + (size_t)count * width;
    float *scales = (float *)(low + (size_t)count * width), *code_totals = scales + (size_t)count * groups;
    quantize_activations(x, count, width, INT8_GROUP, high, two_codes ? low : NULL, scales, code_totals);
    const matmul_call call = {count, width, rows, INT8_GROUP, two_codes, high, low, scales, code_totals, packed,
                              weight_scales, y};
    void (*block_rows)(const matmul_call *, int) = has_dot_products() ? int8_rows_sdot : int8_rows_smull;
    #pragma omp parallel for schedule(dynamic, blocks_a_take(rows / BLOCK_ROWS)) if (rows > BLOCK_ROWS)
    for (int b = 0; b < rows / BLOCK_ROWS; b++) block_rows(&call, b);
}

/* ------------------------------------------------------------------------------------------------------------------
   Attention over a block pool's layer [2, Hkv, P, hd] bf16 (keys, then values; hd a multiple of 16). */

/* score[0 .. count - 1] as e^(score - most), returning their sum. */
static float weights_of(float *score, int count, float most) {
    float32x4_t sum = vdupq_n_f32(0.0f);
    int p = 0;
    for (; p + 4 <= count; p += 4) {
        float32x4_t weight = exp_of_negative(vsubq_f32(vld1q_f32(score + p), vdupq_n_f32(most)));
        vst1q_f32(score + p, weight);
        sum = vaddq_f32(sum, weight);
    }
    float total = vaddvq_f32(sum);
    for (; p < count; p++) {
        score[p] = expf(score[p] - most);
        total += score[p];
    }
    return total;
}

/* kernels.c's decode_attention: query row rows[i] of q [R, H, hd] (already scaled) attends to the positions
   runs[2j] .. runs[2j + 1] - 1 for first_run[i] <= j < first_run[i + 1]; query head h uses kv head h / (H / Hkv);
   out [R, H, hd]. A running maximum over tiles of positions: every position is read once. */
void decode_attention(const float *q, float *out, const uint16_t *layer, const int32_t *rows, int row_count,
                      const int32_t *first_run, const int32_t *runs, int heads, int kv_heads, int head_dim,
                      int64_t positions, const float *sinks) {
    const int groups = heads / kv_heads, vectors = head_dim / 4;
    #pragma omp parallel for collapse(2) schedule(static) if (row_count * kv_heads > 1)
    for (int i = 0; i < row_count; i++)
        for (int h = 0; h < kv_heads; h++) {
            const float *queries = q + ((size_t)rows[i] * heads + (size_t)h * groups) * head_dim;
            const uint16_t *keys = layer + (size_t)h * positions * head_dim;
            const uint16_t *values = layer + ((size_t)kv_heads + h) * positions * head_dim;
            float32x4_t acc[MAX_GROUPS][MAX_HEAD_DIM / 4];
            float best[MAX_GROUPS], weight_sum[MAX_GROUPS], score[MAX_GROUPS][POSITIONS];
            for (int g = 0; g < groups; g++) {
                best[g] = -INFINITY;
                weight_sum[g] = 0.0f;
                for (int v = 0; v < vectors; v++) acc[g][v] = vdupq_n_f32(0.0f);
            }
            for (int j = first_run[i]; j < first_run[i + 1]; j++)
                for (int64_t start = runs[2 * j]; start < runs[2 * j + 1]; start += POSITIONS) {
                    int count = (int)(runs[2 * j + 1] - start < POSITIONS ? runs[2 * j + 1] - start : POSITIONS);
                    for (int p = 0; p < count; p++) {
                        const uint16_t *key_bits = keys + (size_t)(start + p) * head_dim;
                        float32x4_t key[MAX_HEAD_DIM / 4];
                        for (int v = 0; v < vectors; v++) key[v] = bf16_load(key_bits + 4 * v);
                        for (int g = 0; g < groups; g++) {
                            const float *query = queries + (size_t)g * head_dim;
                            float32x4_t dot = vmulq_f32(vld1q_f32(query), key[0]);
                            for (int v = 1; v < vectors; v++) dot = vfmaq_f32(dot, vld1q_f32(query + 4 * v), key[v]);
                            score[g][p] = vaddvq_f32(dot);
                        }
                    }
                    for (int g = 0; g < groups; g++) {
                        float most = best[g];
                        for (int p = 0; p < count; p++) most = fmaxf(most, score[g][p]);
                        float kept = expf(best[g] - most);  /* 0 at the first tile */
                        weight_sum[g] = weight_sum[g] * kept + weights_of(score[g], count, most);
                        for (int v = 0; v < vectors; v++) acc[g][v] = vmulq_n_f32(acc[g][v], kept);
                        best[g] = most;
                    }
                    for (int p = 0; p < count; p++) {
                        const uint16_t *value = values + (size_t)(start + p) * head_dim;
                        for (int v = 0; v < vectors; v++) {
                            float32x4_t part = bf16_load(value + 4 * v);
                            for (int g = 0; g < groups; g++) acc[g][v] = vfmaq_n_f32(acc[g][v], part, score[g][p]);
                        }
                    }
                }
            for (int g = 0; g < groups; g++) {
                float *target = out + ((size_t)rows[i] * heads + (size_t)h * groups + g) * head_dim;
                const float inverse = softmax_inverse(best[g], weight_sum[g], sinks, h * groups + g);
                for (int v = 0; v < vectors; v++) vst1q_f32(target + 4 * v, vmulq_n_f32(acc[g][v], inverse));
            }
        }
}

#define CHUNK_QUERIES 16  /* a chunk task's queries (rows times query heads of one kv head): four vectors */
#define QUERY_VECTORS (CHUNK_QUERIES / 4)
#define KEYS_AT_ONCE 6    /* positions scored together: 24 running sums beside the four query vectors */
#define DIMS_AT_ONCE 4    /* value dimensions summed together: 16 running sums */

/* The scores of `m` (at most KEYS_AT_ONCE) consecutive keys against a chunk task's queries: sums[p][v]. */
static inline __attribute__((always_inline)) void score_keys(const uint16_t *keys, int m, int head_dim,
                                                             const float (*qt)[CHUNK_QUERIES],
                                                             float32x4_t sums[KEYS_AT_ONCE][QUERY_VECTORS]) {
    for (int p = 0; p < KEYS_AT_ONCE; p++)
        for (int v = 0; v < QUERY_VECTORS; v++) sums[p][v] = vdupq_n_f32(0.0f);
    for (int d = 0; d < head_dim; d++) {
        float32x4_t query[QUERY_VECTORS];
        for (int v = 0; v < QUERY_VECTORS; v++) query[v] = vld1q_f32(qt[d] + 4 * v);
        for (int p = 0; p < m; p++) {
            uint32_t bits = (uint32_t)keys[p * head_dim + d] << 16;
            float key;
            memcpy(&key, &bits, sizeof key);
            for (int v = 0; v < QUERY_VECTORS; v++) sums[p][v] = vfmaq_n_f32(sums[p][v], query[v], key);
        }
    }
}

/* A chunk task's score and value sums over the positions slot .. slot + n - 1 (logical positions logical ..).
   qt [hd][16]: the task's queries, transposed; acc [hd][16]: its weighted values; best, total: per query. */
static void chunk_tile(const uint16_t *keys, const uint16_t *values, int64_t slot, int n, int64_t logical,
                       int head_dim, const float (*qt)[CHUNK_QUERIES], float (*acc)[CHUNK_QUERIES],
                       const int32x4_t limit[QUERY_VECTORS], const int32x4_t low[QUERY_VECTORS],
                       float32x4_t best[QUERY_VECTORS], float32x4_t total[QUERY_VECTORS]) {
    float32x4_t score[POSITIONS][QUERY_VECTORS];
    for (int p0 = 0; p0 < n; p0 += KEYS_AT_ONCE) {
        int m = n - p0 < KEYS_AT_ONCE ? n - p0 : KEYS_AT_ONCE;
        float32x4_t sums[KEYS_AT_ONCE][QUERY_VECTORS];
        if (m == KEYS_AT_ONCE)
            score_keys(keys + (slot + p0) * head_dim, KEYS_AT_ONCE, head_dim, qt, sums);
        else
            score_keys(keys + (slot + p0) * head_dim, m, head_dim, qt, sums);
        for (int p = 0; p < m; p++) {
            int32x4_t position = vdupq_n_s32((int32_t)(logical + p0 + p));
            for (int v = 0; v < QUERY_VECTORS; v++) {  /* a query sees the positions from its low, before its limit */
                uint32x4_t seen = vandq_u32(vcleq_s32(low[v], position), vcgtq_s32(limit[v], position));
                score[p0 + p][v] = vbslq_f32(seen, sums[p][v], vdupq_n_f32(-INFINITY));
            }
        }
    }
    float32x4_t kept[QUERY_VECTORS];
    for (int v = 0; v < QUERY_VECTORS; v++) {
        float32x4_t most = best[v];
        for (int p = 0; p < n; p++) most = vmaxq_f32(most, score[p][v]);
        kept[v] = exp_of_negative(vsubq_f32(best[v], most));  /* ~0 at the first tile */
        total[v] = vmulq_f32(total[v], kept[v]);
        for (int p = 0; p < n; p++) {
            score[p][v] = exp_of_negative(vsubq_f32(score[p][v], most));
            total[v] = vaddq_f32(total[v], score[p][v]);
        }
        best[v] = most;
    }
    for (int d0 = 0; d0 < head_dim; d0 += DIMS_AT_ONCE) {
        float32x4_t sums[DIMS_AT_ONCE][QUERY_VECTORS];
        for (int i = 0; i < DIMS_AT_ONCE; i++)
            for (int v = 0; v < QUERY_VECTORS; v++) sums[i][v] = vmulq_f32(vld1q_f32(acc[d0 + i] + 4 * v), kept[v]);
        for (int p = 0; p < n; p++) {
            float32x4_t part = bf16_load(values + (slot + p) * head_dim + d0);  /* DIMS_AT_ONCE values */
            for (int v = 0; v < QUERY_VECTORS; v++) {
                sums[0][v] = vfmaq_laneq_f32(sums[0][v], score[p][v], part, 0);
                sums[1][v] = vfmaq_laneq_f32(sums[1][v], score[p][v], part, 1);
                sums[2][v] = vfmaq_laneq_f32(sums[2][v], score[p][v], part, 2);
                sums[3][v] = vfmaq_laneq_f32(sums[3][v], score[p][v], part, 3);
            }
        }
        for (int i = 0; i < DIMS_AT_ONCE; i++)
            for (int v = 0; v < QUERY_VECTORS; v++) vst1q_f32(acc[d0 + i] + 4 * v, sums[i][v]);
    }
}

/* kernels.c's chunk_attention: rows first_row .. first_row + count - 1 of q [R, H, hd] (already scaled), row r at
   position start + r counted from the first position the runs hold, each attending to the positions up to its own
   (with window > 0 only the last `window` of them), which lie in the runs runs[2j] .. runs[2j + 1] - 1 (j <
   run_count, in order). Each task takes one kv head and a few rows, its queries in the lanes of four vectors. */
void chunk_attention(const float *q, float *out, const uint16_t *layer, int first_row, int count, int start,
                     const int32_t *runs, int run_count, int heads, int kv_heads, int head_dim, int64_t positions,
                     int window) {
    const int groups = heads / kv_heads;
    const int rows_per_task = CHUNK_QUERIES / groups;
    const int blocks = (count + rows_per_task - 1) / rows_per_task;
    #pragma omp parallel for collapse(2) schedule(static)
    for (int h = 0; h < kv_heads; h++)
        for (int b = 0; b < blocks; b++) {
            const int r0 = b * rows_per_task, r1 = r0 + rows_per_task < count ? r0 + rows_per_task : count;
            const int queries = (r1 - r0) * groups;
            const uint16_t *keys = layer + (size_t)h * positions * head_dim;
            const uint16_t *values = layer + ((size_t)kv_heads + h) * positions * head_dim;
            float qt[MAX_HEAD_DIM][CHUNK_QUERIES] __attribute__((aligned(16)));
            float acc[MAX_HEAD_DIM][CHUNK_QUERIES] __attribute__((aligned(16)));
            int32_t limits[CHUNK_QUERIES], lows[CHUNK_QUERIES];
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
            int32x4_t limit[QUERY_VECTORS], low[QUERY_VECTORS];
            float32x4_t best[QUERY_VECTORS], total[QUERY_VECTORS];
            for (int v = 0; v < QUERY_VECTORS; v++) {
                limit[v] = vld1q_s32(limits + 4 * v);
                low[v] = vld1q_s32(lows + 4 * v);
                best[v] = vdupq_n_f32(-INFINITY);
                total[v] = vdupq_n_f32(0.0f);
            }
            const int64_t seen = start + r1;  /* positions the block's last row sees */
            int64_t logical = window_skip(runs, run_count, window > 0 ? start + r0 + 1 - window : 0);
            for (int j = 0; j < run_count && logical < seen; j++)
                for (int64_t slot = run_slot(runs, j, logical); slot < runs[2 * j + 1] && logical < seen;
                     slot += POSITIONS) {
                    int64_t n = runs[2 * j + 1] - slot;
                    n = n < POSITIONS ? n : POSITIONS;
                    n = n < seen - logical ? n : seen - logical;
                    chunk_tile(keys, values, slot, (int)n, logical, head_dim, (const float (*)[CHUNK_QUERIES])qt,
                               acc, limit, low, best, total);
                    logical += n;
                }
            float totals[CHUNK_QUERIES];
            for (int v = 0; v < QUERY_VECTORS; v++) vst1q_f32(totals + 4 * v, total[v]);
            for (int j = 0; j < queries; j++) {
                float *target = out + ((size_t)(first_row + r0 + j / groups) * heads + (size_t)h * groups
                                       + j % groups) * head_dim;
                for (int d = 0; d < head_dim; d++) target[d] = acc[d][j] / totals[j];
            }
        }
}

/* ------------------------------------------------------------------------------------------------------------------
   Norm, activation, rotation. */

/* out [M, K] = x [M, K] over each row's root mean square. */
void rms_norm(const float *x, int rows, int width, float eps, float *out) {
    #pragma omp parallel for schedule(static) if (rows >= 64)
    for (int m = 0; m < rows; m++) {
        const float *row = x + (size_t)m * width;
        float32x4_t squares = vdupq_n_f32(0.0f);
        int k = 0;
        for (; k + 4 <= width; k += 4) {
            float32x4_t value = vld1q_f32(row + k);
            squares = vfmaq_f32(squares, value, value);
        }
        float total = vaddvq_f32(squares);
        for (; k < width; k++) total += row[k] * row[k];
        const float scale = 1.0f / sqrtf(total / (float)width + eps);
        float *target = out + (size_t)m * width;
        for (k = 0; k + 4 <= width; k += 4) vst1q_f32(target + k, vmulq_n_f32(vld1q_f32(row + k), scale));
        for (; k < width; k++) target[k] = row[k] * scale;
    }
}

/* kernels.c's swiglu: out [M, F] = g * sigmoid(alpha g) * (u + shift) for gate_up [M, 2F] (F a multiple of 4), g
   the gate clamped from above at limit, u the up clamped to [-limit, limit]; sigmoid(a) = 1 / (1 + e^-a), or
   e^a / (1 + e^a) for a < 0, so e's argument is never positive. vminnmq/vmaxnmq would drop a NaN: vbslq keeps it. */
void swiglu(const float *gate_up, int rows, int width, float limit, float alpha, float shift, float *out) {
    const float32x4_t one = vdupq_n_f32(1.0f), high = vdupq_n_f32(limit), low = vdupq_n_f32(-limit);
    #pragma omp parallel for schedule(static) if (rows >= 16)
    for (int m = 0; m < rows; m++) {
        const float *gate = gate_up + (size_t)m * 2 * width, *up = gate + width;
        for (int k = 0; k < width; k += 4) {
            float32x4_t g = vld1q_f32(gate + k), u = vld1q_f32(up + k);
            g = vbslq_f32(vcgtq_f32(g, high), high, g);
            u = vbslq_f32(vcltq_f32(u, low), low, vbslq_f32(vcgtq_f32(u, high), high, u));
            float32x4_t a = vmulq_n_f32(g, alpha);
            float32x4_t e = exp_of_negative(vnegq_f32(vabsq_f32(a)));  /* e^-|a| */
            float32x4_t numerator = vbslq_f32(vcltzq_f32(a), e, one);
            float32x4_t gated = vmulq_f32(g, vdivq_f32(numerator, vaddq_f32(one, e)));
            vst1q_f32(out + (size_t)m * width + k, vmulq_f32(gated, vaddq_f32(u, vdupq_n_f32(shift))));
        }
    }
}

/* 8 values of x (4 pairs) times the complex numbers turns (cos, sin), pair by pair, as two vectors of the pairs'
   first and second values: (x0 cos - x1 sin, x1 cos + x0 sin). */
static inline float32x4x2_t rotated_pairs(const float *x, const float *turns) {
    float32x4x2_t v = vld2q_f32(x), turn = vld2q_f32(turns), rotated;
    rotated.val[0] = vfmsq_f32(vmulq_f32(v.val[0], turn.val[0]), v.val[1], turn.val[1]);
    rotated.val[1] = vfmaq_f32(vmulq_f32(v.val[1], turn.val[0]), v.val[0], turn.val[1]);
    return rotated;
}

/* Stores rotated pairs (rotated_pairs) as bf16, interleaved again. */
static inline void bf16_store_pairs(uint16_t *target, float32x4x2_t pairs) {
    bf16_store(target, vzip1q_f32(pairs.val[0], pairs.val[1]));
    bf16_store(target + 4, vzip2q_f32(pairs.val[0], pairs.val[1]));
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
        for (int h = 0; h < heads; h++) {
            float *query = row + (size_t)h * head_dim;
            for (int k = 0; k < head_dim; k += 8) vst2q_f32(query + k, rotated_pairs(query + k, turn + k));
        }
        for (int h = 0; h < kv_heads; h++) {
            size_t at = ((size_t)h * positions + (size_t)slots[s]) * head_dim;
            const float *key = row + (size_t)(heads + h) * head_dim, *value = key + (size_t)kv_heads * head_dim;
            uint16_t *values = layer + (size_t)kv_heads * positions * head_dim;
            for (int k = 0; k < head_dim; k += 8) {
                bf16_store_pairs(layer + at + k, rotated_pairs(key + k, turn + k));
                bf16_store(values + at + k, vld1q_f32(value + k));
                bf16_store(values + at + k + 4, vld1q_f32(value + k + 4));
            }
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

/* ------------------------------------------------------------------------------------------------------------------
   kernels.c's mxfp4_matmul (gpt-oss's experts kept as MXFP4 blocks): each block's 16 code bytes through a table
   lookup (low nibbles are weights 0-15, high nibbles 16-31) to int8 weights, twice their e2m1 values. */
#define MXFP4_ROW_TILE 4

static inline void mxfp4_sixteen(int8x16_t values, float32x4_t scale, float32x4_t *w) {  /* w[0..3] = values * scale */
    const int16x8_t low = vmovl_s8(vget_low_s8(values)), high = vmovl_s8(vget_high_s8(values));
    w[0] = vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(low))), scale);
    w[1] = vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(low))), scale);
    w[2] = vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(high))), scale);
    w[3] = vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(high))), scale);
}

/* The exact product, fp32 activations (the fp32 plan): the weights widened to fp32 times the block's scale, then
   multiply-added with up to MXFP4_ROW_TILE activation rows at once. */
static void mxfp4_matmul_exact(const float *x, int count, int width, const uint8_t *blocks, int rows,
                               const float *bias, const float *scale_of, float *y) {
    const int per_row = width / MXFP4_BLOCK;
    const int8x16_t table = vld1q_s8(MXFP4_HALVES);
    #pragma omp parallel for schedule(static) if (rows >= 64)
    for (int n = 0; n < rows; n++) {
        const uint8_t *row = blocks + (size_t)n * per_row * MXFP4_BLOCK_BYTES;
        for (int m0 = 0; m0 < count; m0 += MXFP4_ROW_TILE) {
            const int tile = count - m0 < MXFP4_ROW_TILE ? count - m0 : MXFP4_ROW_TILE;
            float32x4_t sums[MXFP4_ROW_TILE];
            for (int m = 0; m < MXFP4_ROW_TILE; m++) sums[m] = vdupq_n_f32(0.0f);
            for (int b = 0; b < per_row; b++) {
                const uint8_t *block = row + (size_t)b * MXFP4_BLOCK_BYTES;
                const uint8x16_t codes = vld1q_u8(block + 1);
                const float32x4_t scale = vdupq_n_f32(scale_of[block[0]]);
                float32x4_t w[8];
                mxfp4_sixteen(vqtbl1q_s8(table, vandq_u8(codes, vdupq_n_u8(0x0F))), scale, w);
                mxfp4_sixteen(vqtbl1q_s8(table, vshrq_n_u8(codes, 4)), scale, w + 4);
                for (int m = 0; m < tile; m++) {
                    const float *xs = x + (size_t)(m0 + m) * width + (size_t)b * MXFP4_BLOCK;
                    for (int q = 0; q < 8; q++) sums[m] = vfmaq_f32(sums[m], w[q], vld1q_f32(xs + 4 * q));
                }
            }
            for (int m = 0; m < tile; m++)
                y[(size_t)(m0 + m) * rows + n] = vaddvq_f32(sums[m]) + (bias ? bias[n] : 0.0f);
        }
    }
}

/* A call's activation codes, which every weight row reads, and where its products go. */
typedef struct {
    int width, rows, two_codes;
    mxfp4_activations a;
    const float *scale_of;
    float *y;
} mxfp4_call;

/* Weight row n of `segment` against its activation rows, MXFP4_ROW_TILE at a time, with sdot where `sdot` (signed
   weights by signed codes: each block's sum exact in int32, then times its weight and activation scales in fp32):
   y[m, n], plus the segment's bias. */
static inline __attribute__((always_inline)) void mxfp4_rows(int sdot, const mxfp4_call *call,
                                                             const mxfp4_segment *segment, int n) {
    const int width = call->width, per_row = width / MXFP4_BLOCK, two_codes = call->two_codes;
    const int8x16_t table = vld1q_s8(MXFP4_HALVES);
    const uint8_t *row = segment->blocks + (size_t)n * per_row * MXFP4_BLOCK_BYTES;
    for (int m0 = segment->first; m0 < segment->first + segment->count; m0 += MXFP4_ROW_TILE) {
        const int left = segment->first + segment->count - m0;
        const int tile = left < MXFP4_ROW_TILE ? left : MXFP4_ROW_TILE;
        float32x4_t sums[MXFP4_ROW_TILE];
        for (int m = 0; m < tile; m++) sums[m] = vdupq_n_f32(0.0f);
        for (int b = 0; b < per_row; b++) {
            const uint8_t *block = row + (size_t)b * MXFP4_BLOCK_BYTES;
            if (m0 == segment->first) prefetch_ahead(block, 1);  /* the row's first tile */
            const uint8x16_t codes = vld1q_u8(block + 1);
            const int8x16_t first = vqtbl1q_s8(table, vandq_u8(codes, vdupq_n_u8(0x0F)));  /* weights 0-15 */
            const int8x16_t second = vqtbl1q_s8(table, vshrq_n_u8(codes, 4));              /* weights 16-31 */
            const float weight_scale = call->scale_of[block[0]];
            for (int m = 0; m < tile; m++) {
                const size_t at = (size_t)(m0 + m) * width + (size_t)b * MXFP4_BLOCK;
                const int8_t *high = call->a.high + at;
                int32x4_t dot = dot_add(dot_add(vdupq_n_s32(0), first, vld1q_s8(high), sdot), second,
                                        vld1q_s8(high + 16), sdot);
                float32x4_t value = vcvtq_f32_s32(dot);
                if (two_codes) {
                    const int8_t *low = call->a.low + at;
                    dot = dot_add(dot_add(vdupq_n_s32(0), first, vld1q_s8(low), sdot), second, vld1q_s8(low + 16),
                                  sdot);
                    value = vfmaq_n_f32(value, vcvtq_f32_s32(dot), 1.0f / LOW_STEPS);
                }
                sums[m] = vfmaq_n_f32(sums[m], value, weight_scale * call->a.scales[at / MXFP4_BLOCK]);
            }
        }
        const float shift = segment->bias ? segment->bias[n] : 0.0f;
        for (int m = 0; m < tile; m++) call->y[(size_t)(m0 + m) * call->rows + n] = vaddvq_f32(sums[m]) + shift;
    }
}

static DOT_PRODUCTS void mxfp4_rows_sdot(const void *call, const mxfp4_segment *segment, int n) {
    mxfp4_rows(1, call, segment, n);
}

static void mxfp4_rows_smull(const void *call, const mxfp4_segment *segment, int n) {
    mxfp4_rows(0, call, segment, n);
}

/* kernels.c's mxfp4_row_loop. */
static void mxfp4_row_loop(const mxfp4_call *call, const mxfp4_segment *segments, int active) {
    mxfp4_segment_items(call, has_dot_products() ? mxfp4_rows_sdot : mxfp4_rows_smull, segments, active, call->rows);
}

/* kernels.c's mxfp4_matmul: y [count, rows] = x [count, width] times the MXFP4 weight's rows, plus bias; codes 1 or
   2 int8 codes an activation, 0 fp32 (exact); scratch: M * (3K + K / 4) bytes (the codes and scales used here). */
void mxfp4_matmul(const float *x, int count, int width, const uint8_t *blocks, int rows, const float *bias,
                  int codes, void *scratch, float *y) {
    float scale_of[256];
    mxfp4_scales(scale_of);
    if (codes == 0) {
        mxfp4_matmul_exact(x, count, width, blocks, rows, bias, scale_of, y);
        return;
    }
    const mxfp4_call call = {width, rows, codes == 2, mxfp4_quantize(x, count, width, codes == 2, scratch),
                             scale_of, y};
    const mxfp4_segment whole = {blocks, bias, 0, count};
    mxfp4_row_loop(&call, &whole, 1);
}

/* kernels.c's mxfp4_experts: a step's experts in one call. */
void mxfp4_experts(const float *x, int count, int width, const int64_t *table, int active, int rows, int codes,
                   void *scratch, float *y) {
    float scale_of[256];
    mxfp4_scales(scale_of);
    const mxfp4_call call = {width, rows, codes == 2, mxfp4_quantize(x, count, width, codes == 2, scratch),
                             scale_of, y};
    mxfp4_segment *segments = mxfp4_segments(table, active);
    mxfp4_row_loop(&call, segments, active);
    free(segments);
}
