/* A GGUF file's quantized blocks into Hearth's weight formats at load (engine thread; OpenMP threads inside each
   call). Built by native/build.py as a library of its own, in portable C (no instruction set beyond the compiler's
   default), so it loads on every x86-64 CPU, with or without Hearth's AVX-512 kernels.

   Built with -ffp-contract=off and without -ffast-math: every float is rounded where gguf-py's and PyTorch's
   arithmetic rounds it (s = d * sc once, then s * x and - m per weight; a group's bf16 scale and zero point as
   quant_int.int4_group_params makes them), so the results equal the NumPy/PyTorch decoders' bit for bit.

   The structs are llama.cpp's (ggml-common.h), one row of the weight a run of whole blocks:
   Q4_0 (32 weights, 18 bytes): d fp16, 16 bytes of nibbles (low: weights 0-15, high: 16-31); w = d * (q - 8).
   Q4_1 (32, 20): d, m fp16, nibbles as Q4_0; w = d * q + m.
   Q8_0 (32, 34): d fp16, 32 int8 codes; w = x * d.
   Q4_K (256, 144): d, dmin fp16, 12 bytes of 6-bit sub-scales and sub-mins, four runs of 32 nibble bytes (low:
     sub-block 2c, high: 2c + 1); w = d * sc * q - dmin * mn.
   Q5_K (256, 176): as Q4_K, with 32 bytes of fifth bits (bit j of byte l: weight l of sub-block j) before the
     nibbles.
   Q6_K (256, 210): ql[128], qh[64], 16 int8 sub-scales, d fp16; weight 128h + r: low nibble of ql[64h + r % 64]
     (high nibble from r = 64 on), two bits of qh[32h + r % 32] at bit 2 (r / 32); w = d * sc[k / 16] * (q - 32).

   The CPU int4 layout (cpu_int4_layout.py): each block of 64 rows of a weight [N, K] is [K, 32] bytes, byte (k, j)
   holding row j's code k in its low nibble and row j + 32's in its high one. The int8 layout (int8_matmul.py):
   [N / 64, K / 4, 4, 16, 4] bytes q + 128 and fp16 scales [N / 64, K / 32, 64]. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX2__
#include <immintrin.h>
#elif defined(__SSE2__)
#include <emmintrin.h>
#endif

enum { Q4_0 = 2, Q4_1 = 3, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };  /* GGMLQuantizationType's values */
#define GROUP 32        /* weights of an int4 group, and of an int8 group */
#define BLOCK_ROWS 64   /* rows a block of the int4 and int8 layouts holds */
#define HALF_ROWS 32
#define SUPER 256       /* weights of a K-quant block */

static float half_float(const uint8_t *at) {
    _Float16 value;
    memcpy(&value, at, 2);
    return (float)value;
}

static uint16_t half_bits(float value) {
    _Float16 rounded = (_Float16)value;  /* round to nearest even, as PyTorch's .to(torch.float16) */
    uint16_t bits;
    memcpy(&bits, &rounded, 2);
    return bits;
}

static float bf16_rounded(float value) {  /* round to nearest even, as PyTorch's .to(torch.bfloat16) */
    uint32_t bits;
    memcpy(&bits, &value, 4);
    bits = isnan(value) ? 0x7FC00000u : ((bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u);
    memcpy(&value, &bits, 4);
    return value;
}

/* round to nearest even (nearbyintf in the default rounding mode) for |x| < 2^22, in plain adds that vectorize; larger
   values come back at least as large, which every caller clamps to its codes' range anyway. */
static inline float rounded(float x) {
    const float magic = 12582912.0f;  /* 1.5 * 2^23 */
    return (x + magic) - magic;
}

static inline float clamped(float x, float low, float high) { return x < low ? low : (x > high ? high : x); }

static int is_four_bit(int type) { return type == Q4_0 || type == Q4_1 || type == Q4_K; }
static int block_weights(int type) { return type == Q4_K || type == Q5_K || type == Q6_K ? SUPER : 32; }

static int block_bytes(int type) {
    switch (type) {
        case Q4_0: return 18;
        case Q4_1: return 20;
        case Q8_0: return 34;
        case Q4_K: return 144;
        case Q5_K: return 176;
        default: return 210;  /* Q6_K */
    }
}

/* Q4_K's and Q5_K's 12 bytes as 8 sub-scales and 8 sub-mins (gguf-py's Q4_K.get_scale_min). */
static void k_scales_and_mins(const uint8_t *packed, uint8_t *scales, uint8_t *mins) {
    for (int j = 0; j < 4; j++) {
        scales[j] = packed[j] & 0x3F;
        mins[j] = packed[j + 4] & 0x3F;
        scales[j + 4] = (packed[j + 8] & 0x0F) | ((packed[j] >> 2) & 0x30);
        mins[j + 4] = (packed[j + 8] >> 4) | ((packed[j + 4] >> 2) & 0x30);
    }
}

/* 32 weights of a Q6_K block: code l's low four bits from low_bytes[l] >> low_shift, its high two from
   high_bytes[l] >> high_shift; weights 0-15 times `first`, 16-31 times `second`, each w = scale * (q - 32). */
static void q6_k_run(const uint8_t *low_bytes, const uint8_t *high_bytes, int low_shift, int high_shift, float first,
                     float second, float *out) {
#ifdef __AVX2__
    const __m256i low = _mm256_and_si256(_mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)low_bytes),
                                                          _mm_cvtsi32_si128(low_shift)), _mm256_set1_epi8(0x0F));
    const __m256i high = _mm256_and_si256(_mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)high_bytes),
                                                           _mm_cvtsi32_si128(high_shift)), _mm256_set1_epi8(0x03));
    const __m256i q = _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 4)), _mm256_set1_epi8(32));
    const __m128i halves[2] = {_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)};
    for (int i = 0; i < 4; i++) {  /* eight codes a time: [-32, 31] as int32, then floats */
        const __m128i eight = i % 2 ? _mm_srli_si128(halves[i / 2], 8) : halves[i / 2];
        const __m256 x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight));
        _mm256_storeu_ps(out + 8 * i, _mm256_mul_ps(_mm256_set1_ps(i < 2 ? first : second), x));
    }
#else
    for (int l = 0; l < 32; l++) {
        const int q = ((low_bytes[l] >> low_shift) & 0x0F) | (((high_bytes[l] >> high_shift) & 0x03) << 4);
        out[l] = (l < 16 ? first : second) * (float)(q - 32);
    }
#endif
}

/* One block's weights as gguf-py's dequantize gives them. */
static void decode_block(const uint8_t *block, int type, float *w) {
    switch (type) {
        case Q4_0: {
            float d = half_float(block);
            for (int i = 0; i < 16; i++) {
                w[i] = d * (float)((block[2 + i] & 0x0F) - 8);
                w[i + 16] = d * (float)((block[2 + i] >> 4) - 8);
            }
            return;
        }
        case Q4_1: {
            float d = half_float(block), m = half_float(block + 2);
            for (int i = 0; i < 16; i++) {
                w[i] = d * (float)(block[4 + i] & 0x0F) + m;
                w[i + 16] = d * (float)(block[4 + i] >> 4) + m;
            }
            return;
        }
        case Q8_0: {
            float d = half_float(block);
            for (int i = 0; i < 32; i++) w[i] = (float)(int8_t)block[2 + i] * d;
            return;
        }
        case Q4_K:
        case Q5_K: {
            float d = half_float(block), dmin = half_float(block + 2);
            uint8_t scales[8], mins[8];
            k_scales_and_mins(block + 4, scales, mins);
            const uint8_t *high_bits = block + 16, *nibbles = block + (type == Q4_K ? 16 : 48);
            for (int j = 0; j < 8; j++) {
                const float scale = d * (float)scales[j], least = dmin * (float)mins[j];
                const uint8_t *run = nibbles + 32 * (j / 2);
                const int shift = 4 * (j & 1);
                float *out = w + 32 * j;
                if (type == Q4_K)
                    for (int l = 0; l < 32; l++) out[l] = scale * (float)((run[l] >> shift) & 0x0F) - least;
                else
                    for (int l = 0; l < 32; l++)
                        out[l] = scale * (float)(((run[l] >> shift) & 0x0F) | (((high_bits[l] >> j) & 1) << 4)) - least;
            }
            return;
        }
        default: {  /* Q6_K: weight 128h + 32j + l */
            const float d = half_float(block + 208);
            const int8_t *sub_scales = (const int8_t *)(block + 192);
            for (int h = 0; h < 2; h++)
                for (int j = 0; j < 4; j++) {
                    const uint8_t *low_bytes = block + 64 * h + 32 * (j % 2), *high_bytes = block + 128 + 32 * h;
                    q6_k_run(low_bytes, high_bytes, 4 * (j / 2), 2 * j, d * (float)sub_scales[8 * h + 2 * j],
                             d * (float)sub_scales[8 * h + 2 * j + 1], w + 128 * h + 32 * j);
                }
        }
    }
}

/* rows [rows, row_bytes] of `type`'s blocks as their fp32 weights out [rows, width]. */
void gguf_dense_rows(const uint8_t *blocks, int64_t rows, int64_t row_bytes, int type, int width, float *out) {
    const int per_block = block_weights(type), size = block_bytes(type);
    #pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < rows; n++)
        for (int b = 0; b < width / per_block; b++)
            decode_block(blocks + n * row_bytes + (int64_t)b * size, type, out + n * width + (int64_t)b * per_block);
}

/* A 4-bit type's block: each group of 32's (q - 8) * scale + zero, as scales and zeros. */
static void four_bit_scales(const uint8_t *block, int type, float *scales, float *zeros) {
    if (type == Q4_K) {
        float d = half_float(block), dmin = half_float(block + 2);
        uint8_t sub_scales[8], sub_mins[8];
        k_scales_and_mins(block + 4, sub_scales, sub_mins);
        for (int j = 0; j < 8; j++) {
            scales[j] = (float)sub_scales[j] * d;
            zeros[j] = scales[j] * 8.0f - (float)sub_mins[j] * dmin;  /* (q - 8) s + z = s q - min */
        }
        return;
    }
    scales[0] = half_float(block);
    zeros[0] = type == Q4_1 ? half_float(block + 2) + 8.0f * scales[0] : 0.0f;  /* (q - 8) d + z = q d + m */
}

/* A 4-bit type's nibbles: runs of `run` bytes from `offset` on, byte l of run c holding weight 2 run c + l in its
   low nibble and weight 2 run c + run + l in its high one. */
static int nibble_run(int type) { return type == Q4_K ? 32 : 16; }
static int nibble_offset(int type) { return type == Q4_K ? 16 : (type == Q4_1 ? 4 : 2); }

/* A 4-bit type's block: its nibbles as codes, one a byte in weight order. */
static void four_bit_codes(const uint8_t *block, int type, uint8_t *codes) {
    const int run = nibble_run(type);
    const uint8_t *nibbles = block + nibble_offset(type);
    for (int c = 0; c < block_weights(type) / (2 * run); c++, nibbles += run, codes += 2 * run)
        for (int l = 0; l < run; l++) {
            codes[l] = nibbles[l] & 0x0F;
            codes[run + l] = nibbles[l] >> 4;
        }
}

/* Two rows' blocks of a 4-bit type as paired codes in weight order: `low`'s in each byte's low nibble, `high`'s in
   its high one, straight from their nibbles. */
static void paired_codes(const uint8_t *low, const uint8_t *high, int type, uint8_t *codes) {
    const int run = nibble_run(type), offset = nibble_offset(type);
    const uint8_t *a = low + offset, *b = high + offset;
    for (int c = 0; c < block_weights(type) / (2 * run); c++, a += run, b += run, codes += 2 * run)
        for (int l = 0; l < run; l++) {
            codes[l] = (uint8_t)((a[l] & 0x0F) | (b[l] << 4));
            codes[run + l] = (uint8_t)((a[l] >> 4) | (b[l] & 0xF0));
        }
}

/* A group's scale and zero point from its lowest and highest weight (quant_int.int4_group_params): the scale spans
   the range in 15 steps, bf16; q = 0 stands for zero - 8 scale. Returns that lowest representable weight. */
static float group_params(float low, float high, float *scale_out, float *zero_out) {
    const float range = high - low;
    const float scale = bf16_rounded((range > 1e-6f ? range : 1e-6f) / 15.0f);
    const float zero = bf16_rounded(low + scale * 8.0f);
    *scale_out = scale;
    *zero_out = zero;
    return zero - scale * 8.0f;
}

#ifdef __AVX2__
static float lowest_of(__m256 v) {
    __m128 x = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_min_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_min_ss(x, _mm_shuffle_ps(x, x, 1)));
}

static float highest_of(__m256 v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_max_ss(x, _mm_shuffle_ps(x, x, 1)));
}

/* fp32 weights of one group as int4 codes (int4_codes: the nearest step, even on ties, clamped to 0..15) with a
   bf16 scale and zero point: the same floats as the portable loop below, eight lanes at a time. */
static void requantized_group(const float *w, uint8_t *codes, float *scale_out, float *zero_out) {
    __m256 v[4];
    for (int i = 0; i < 4; i++) v[i] = _mm256_loadu_ps(w + 8 * i);
    const float lowest = group_params(lowest_of(_mm256_min_ps(_mm256_min_ps(v[0], v[1]), _mm256_min_ps(v[2], v[3]))),
                                      highest_of(_mm256_max_ps(_mm256_max_ps(v[0], v[1]), _mm256_max_ps(v[2], v[3]))),
                                      scale_out, zero_out);
    const __m256 base = _mm256_set1_ps(lowest), step = _mm256_set1_ps(*scale_out), magic = _mm256_set1_ps(12582912.0f);
    const __m256 top = _mm256_set1_ps(15.0f), bottom = _mm256_setzero_ps();
    __m256i q[4];
    for (int i = 0; i < 4; i++) {
        __m256 x = _mm256_div_ps(_mm256_sub_ps(v[i], base), step);
        x = _mm256_sub_ps(_mm256_add_ps(x, magic), magic);
        q[i] = _mm256_cvttps_epi32(_mm256_max_ps(_mm256_min_ps(x, top), bottom));
    }
    /* [32] int32 -> bytes: packs interleave the two 128-bit halves, the permute puts them back in order */
    const __m256i words = _mm256_packs_epi32(q[0], q[1]), more = _mm256_packs_epi32(q[2], q[3]);
    const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(words, more),
                                                      _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)codes, bytes);
}
#else
/* fp32 weights of one group as int4 codes (quant_int.int4_codes) with a bf16 scale and zero point. */
static void requantized_group(const float *w, uint8_t *codes, float *scale_out, float *zero_out) {
    float lows[8], highs[8];  /* eight lanes, then across them: exact in any order, and it vectorizes */
    for (int k = 0; k < 8; k++) lows[k] = highs[k] = w[k];
    for (int i = 8; i < GROUP; i += 8)
        for (int k = 0; k < 8; k++) {
            lows[k] = w[i + k] < lows[k] ? w[i + k] : lows[k];
            highs[k] = w[i + k] > highs[k] ? w[i + k] : highs[k];
        }
    float low = lows[0], high = highs[0];
    for (int k = 1; k < 8; k++) {
        low = lows[k] < low ? lows[k] : low;
        high = highs[k] > high ? highs[k] : high;
    }
    const float lowest = group_params(low, high, scale_out, zero_out), scale = *scale_out;
    for (int i = 0; i < GROUP; i++) codes[i] = (uint8_t)clamped(rounded((w[i] - lowest) / scale), 0.0f, 15.0f);
}
#endif

/* A block's groups' scales and zeros, pair g at out[g * pitch]. */
static void put_groups(const float *scales, const float *zeros, int groups, float *out, int64_t pitch) {
    for (int g = 0; g < groups; g++) {
        out[g * pitch] = scales[g];
        out[g * pitch + 1] = zeros[g];
    }
}

/* One row of blocks as int4 codes [width] and its groups' scales and zeros, written at scales_and_zeros[g * pitch]
   (two floats each): a 4-bit type exactly, any other decoded to fp32 and requantized. */
static void row_groups(const uint8_t *row, int type, int width, uint8_t *codes, float *scales_and_zeros,
                       int64_t pitch, float *weights) {
    const int per_block = block_weights(type), size = block_bytes(type), groups = per_block / GROUP;
    const int four_bit = is_four_bit(type);
    for (int b = 0; b < width / per_block; b++) {
        float scales[8], zeros[8];
        uint8_t *block_codes = codes + (int64_t)b * per_block;
        if (four_bit) {
            four_bit_scales(row + (int64_t)b * size, type, scales, zeros);
            four_bit_codes(row + (int64_t)b * size, type, block_codes);
        } else {
            decode_block(row + (int64_t)b * size, type, weights);
            for (int g = 0; g < groups; g++)
                requantized_group(weights + g * GROUP, block_codes + g * GROUP, scales + g, zeros + g);
        }
        put_groups(scales, zeros, groups, scales_and_zeros + (int64_t)b * groups * pitch, pitch);
    }
}

/* Two rows of a 4-bit type (rows j and j + 32 of a block of the int4 layout) as paired codes [width] and each row's
   groups' scales and zeros, as row_groups writes them. */
static void paired_four_bit_rows(const uint8_t *low, const uint8_t *high, int type, int width, uint8_t *codes,
                                 float *low_scales_and_zeros, float *high_scales_and_zeros, int64_t pitch) {
    const int per_block = block_weights(type), size = block_bytes(type), groups = per_block / GROUP;
    for (int b = 0; b < width / per_block; b++) {
        const int64_t at = (int64_t)b * size, first_group = (int64_t)b * groups * pitch;
        float scales[8], zeros[8];
        four_bit_scales(low + at, type, scales, zeros);
        put_groups(scales, zeros, groups, low_scales_and_zeros + first_group, pitch);
        four_bit_scales(high + at, type, scales, zeros);
        put_groups(scales, zeros, groups, high_scales_and_zeros + first_group, pitch);
        paired_codes(low + at, high + at, type, codes + (int64_t)b * per_block);
    }
}

/* out [width, 32] = rows [32, width] transposed (a block's bytes in the int4 layout, from its 32 rows of paired
   codes). Where SSE2 is (every x86-64), 16 x 16 byte tiles turn in registers: four rounds of interleaving each row
   with the one eight below; a byte at a time elsewhere, and for the columns past the last whole tile. */
static void interleave_rows(const uint8_t *rows, int width, uint8_t *out) {
    int k0 = 0;
#ifdef __SSE2__
    for (; k0 + 16 <= width; k0 += 16)
        for (int j0 = 0; j0 < HALF_ROWS; j0 += 16) {
            __m128i r[16], next[16];
            for (int i = 0; i < 16; i++)
                r[i] = _mm_loadu_si128((const __m128i *)(rows + (size_t)(j0 + i) * width + k0));
            for (int round = 0; round < 4; round++) {
                for (int i = 0; i < 8; i++) {
                    next[2 * i] = _mm_unpacklo_epi8(r[i], r[i + 8]);
                    next[2 * i + 1] = _mm_unpackhi_epi8(r[i], r[i + 8]);
                }
                memcpy(r, next, sizeof r);
            }
            for (int i = 0; i < 16; i++) _mm_storeu_si128((__m128i *)(out + (size_t)(k0 + i) * HALF_ROWS + j0), r[i]);
        }
#endif
    for (int k = k0; k < width; k++)
        for (int j = 0; j < HALF_ROWS; j++) out[(size_t)k * HALF_ROWS + j] = rows[(size_t)j * width + k];
}

/* rows [rows, row_bytes] of `type`'s blocks as int4 groups of 32: codes, and scales_and_zeros [width / 32, rows, 2]
   fp32 whose groups lie `pitch` floats apart (2 * rows, or more where they are rows of a larger weight).
   in_layout: codes [rows, width / 2] in the CPU int4 layout (rows a multiple of 64), else one a byte [rows, width]. */
void gguf_int4_groups(const uint8_t *blocks, int64_t rows, int64_t row_bytes, int type, int width, int in_layout,
                      uint8_t *codes, float *scales_and_zeros, int64_t pitch) {
    if (!in_layout) {
        #pragma omp parallel
        {
            float weights[SUPER];
            #pragma omp for schedule(static)
            for (int64_t n = 0; n < rows; n++)
                row_groups(blocks + n * row_bytes, type, width, codes + n * width, scales_and_zeros + 2 * n, pitch,
                           weights);
        }
        return;
    }
    const int four_bit = is_four_bit(type);
    #pragma omp parallel
    {
        /* [32, width]: row j's codes low, row j + 32's high; then a row for each row j + 32's codes */
        uint8_t *paired = malloc((size_t)(HALF_ROWS + 1) * width), *high = paired + (size_t)HALF_ROWS * width;
        float weights[SUPER];
        #pragma omp for schedule(static)
        for (int64_t b = 0; b < rows / BLOCK_ROWS; b++) {
            for (int j = 0; j < HALF_ROWS; j++) {
                const int64_t n = b * BLOCK_ROWS + j, m = n + HALF_ROWS;
                uint8_t *pair = paired + (size_t)j * width;
                if (four_bit) {
                    paired_four_bit_rows(blocks + n * row_bytes, blocks + m * row_bytes, type, width, pair,
                                         scales_and_zeros + 2 * n, scales_and_zeros + 2 * m, pitch);
                    continue;
                }
                row_groups(blocks + n * row_bytes, type, width, pair, scales_and_zeros + 2 * n, pitch, weights);
                row_groups(blocks + m * row_bytes, type, width, high, scales_and_zeros + 2 * m, pitch, weights);
                for (int k = 0; k < width; k++) pair[k] |= (uint8_t)(high[k] << 4);
            }
            interleave_rows(paired, width, codes + b * BLOCK_ROWS * (width / 2));
        }
        free(paired);
    }
}

/* rows [rows, row_bytes] of `type`'s blocks as two planes of int4 groups of 32, codes one a byte [rows, width] and
   scales and zeros [width / 32, rows, 2] fp32 each (quant_int.Int4Pair.from_rows): the weights requantized, then
   what that rounding left, w - ((q - 8) * scale + zero), requantized again. */
void gguf_int4_pair(const uint8_t *blocks, int64_t rows, int64_t row_bytes, int type, int width, uint8_t *coarse,
                    float *coarse_scales_and_zeros, uint8_t *fine, float *fine_scales_and_zeros) {
    const int per_block = block_weights(type), size = block_bytes(type);
    #pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < rows; n++) {
        float weights[SUPER], rest[GROUP];
        for (int b = 0; b < width / per_block; b++) {
            decode_block(blocks + n * row_bytes + (int64_t)b * size, type, weights);
            for (int g = 0; g < per_block / GROUP; g++) {
                const int64_t column = (int64_t)b * per_block + g * GROUP, group = column / GROUP;
                float *coarse_pair = coarse_scales_and_zeros + (group * rows + n) * 2;
                float *fine_pair = fine_scales_and_zeros + (group * rows + n) * 2;
                uint8_t *codes = coarse + n * width + column;
                requantized_group(weights + g * GROUP, codes, coarse_pair, coarse_pair + 1);
                for (int i = 0; i < GROUP; i++)
                    rest[i] = weights[g * GROUP + i] - (((float)codes[i] - 8.0f) * coarse_pair[0] + coarse_pair[1]);
                requantized_group(rest, fine + n * width + column, fine_pair, fine_pair + 1);
            }
        }
    }
}

/* fp32 rows w [rows, width] (rows a multiple of 64) in the int8 layout: each group of 32's largest magnitude maps
   to 127 under an fp16 scale (int8_matmul.quantize), q + 128 a byte. */
void int8_layout_from_rows(const float *w, int64_t rows, int width, uint8_t *packed, uint16_t *scales) {
    const int groups = width / GROUP;
    #pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < rows / BLOCK_ROWS; b++)
        for (int r = 0; r < BLOCK_ROWS; r++) {
            const float *row = w + (b * BLOCK_ROWS + r) * width;
            uint8_t *out = packed + b * BLOCK_ROWS * width + (r / 16) * 64 + (r % 16) * 4;
            for (int g = 0; g < groups; g++) {
                const float *group = row + g * GROUP;
                float largests[8] = {0.0f}, largest = 0.0f, codes[GROUP];
                for (int i = 0; i < GROUP; i += 8)
                    for (int k = 0; k < 8; k++) {
                        float magnitude = fabsf(group[i + k]);
                        largests[k] = magnitude > largests[k] ? magnitude : largests[k];
                    }
                for (int k = 0; k < 8; k++) largest = largests[k] > largest ? largests[k] : largest;
                uint16_t bits = half_bits(largest / 127.0f);
                scales[(b * groups + g) * BLOCK_ROWS + r] = bits;
                const float divisor = half_float((const uint8_t *)&bits);
                for (int i = 0; i < GROUP; i++)
                    codes[i] = divisor > 0.0f ? clamped(rounded(group[i] / divisor), -127.0f, 127.0f) : 0.0f;
                for (int i = 0; i < GROUP; i++)  /* four columns of a row a 32-bit lane, 16 rows a vector */
                    out[(int64_t)(g * GROUP + i) / 4 * 256 + i % 4] = (uint8_t)((int)codes[i] + 128);
            }
        }
}

/* int8 codes [rows, width] (rows a multiple of 64) and their groups' fp32 scales [rows, width / 32] (Int8Groups: a
   file's Q8_0 blocks) in the int8 layout as they are: each scale rounded to fp16, each code + 128 a byte. */
void int8_layout_from_codes(const int8_t *codes, const float *group_scales, int64_t rows, int width,
                            uint8_t *packed, uint16_t *scales) {
    const int groups = width / GROUP;
    #pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < rows / BLOCK_ROWS; b++)
        for (int r = 0; r < BLOCK_ROWS; r++) {
            const int64_t row = b * BLOCK_ROWS + r;
            const int8_t *row_codes = codes + row * width;
            uint8_t *out = packed + b * BLOCK_ROWS * width + (r / 16) * 64 + (r % 16) * 4;
            for (int g = 0; g < groups; g++)
                scales[(b * groups + g) * BLOCK_ROWS + r] = half_bits(group_scales[row * groups + g]);
            for (int k = 0; k < width; k += 4) {  /* four columns of a row a 32-bit lane, 16 rows a vector */
                uint32_t four;
                memcpy(&four, row_codes + k, 4);
                four ^= 0x80808080u;  /* q + 128 in each byte */
                memcpy(out + (int64_t)k / 4 * 256, &four, 4);
            }
        }
}
