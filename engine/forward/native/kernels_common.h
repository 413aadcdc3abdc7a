/* What every variant of Hearth's CPU kernels shares (variants.py): the layouts' constants and the rounding of a
   matmul's activations to int8 codes, in plain C (each variant compiles it with its own flags). */

#ifndef HEARTH_KERNELS_COMMON_H
#define HEARTH_KERNELS_COMMON_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define BLOCK_ROWS 64     /* rows per block of the int4 layout (cpu_int4_layout) */

/* The int4 layout's group scales (int4_scales.py), a block's after one another: for each run of SCALE_RUN groups
   (the last may hold fewer), the run's factors [64, 2] bf16 (d, e), then each of its groups' codes [64, 2] int8
   (c, z). Row r's group has the scale d c and the zero point e z: w = (q - 8) * scale + zero for its codes q in
   0 .. 15, which the kernels take as q * scale + offset, offset = zero - 8 scale. */
#define SCALE_RUN 8
#define RUN_FACTOR_BYTES (BLOCK_ROWS * 2 * 2)
#define GROUP_CODE_BYTES (BLOCK_ROWS * 2)

/* The bytes of one block's scales: `groups` groups. */
static inline size_t int4_scale_bytes(int groups) {
    return (size_t)((groups + SCALE_RUN - 1) / SCALE_RUN) * RUN_FACTOR_BYTES + (size_t)groups * GROUP_CODE_BYTES;
}

/* The factors [64, 2] of the run that holds group g of a block whose scales start at `block_scales`. */
static inline const uint16_t *run_factors(const uint8_t *block_scales, int g) {
    const size_t run_bytes = RUN_FACTOR_BYTES + SCALE_RUN * GROUP_CODE_BYTES;
    return (const uint16_t *)(block_scales + (size_t)(g / SCALE_RUN) * run_bytes);
}

/* Group g's codes [64, 2]. */
static inline const int8_t *group_codes(const uint8_t *block_scales, int g) {
    const size_t runs_so_far = (size_t)(g / SCALE_RUN + 1);  /* the factors of its own run too */
    return (const int8_t *)(block_scales + runs_so_far * RUN_FACTOR_BYTES + (size_t)g * GROUP_CODE_BYTES);
}

/* How far ahead of what a decode call's loop reads it asks for a weight's bytes (prefetch_ahead). A one-row call
   streams its weights once, and without it the hardware's prefetch fell behind on a Sapphire Rapids VM (28 GB/s
   copy): the int4 kernel read at 20 GB/s beside another busy core and 26 with it (an 8B model's decode 4.6 ->
   5.6 tok/s). */
#define WEIGHT_PREFETCH_BYTES 4096

/* Blocks of rows a thread takes at a time from an int4 or int8 call's shared count (schedule(dynamic)): about
   eight takes a thread, so a thread that runs slower (an efficiency core beside performance ones, a VM's busy
   neighbour) ends up with fewer blocks instead of the others waiting for it at the call's end, while each take is
   still a long run of rows for the prefetchers. */
static inline int blocks_a_take(int blocks) {
    const int take = blocks / (8 * omp_get_max_threads());
    return take > 1 ? take : 1;
}

/* Asks for `lines` cache lines of 64 bytes WEIGHT_PREFETCH_BYTES past `at`. */
static inline __attribute__((always_inline)) void prefetch_ahead(const void *at, int lines) {
    for (int i = 0; i < lines; i++) __builtin_prefetch((const char *)at + WEIGHT_PREFETCH_BYTES + 64 * i);
}

/* What turns a query head's weighted sum of values into its attention output: 1 / the softmax's denominator
   (weight_sum, its terms relative to the running maximum best). `sinks` (gpt-oss's per-head logits; NULL: none)
   add e^(sink - best) to it, a position each head sees whose value is zero. */
static inline float softmax_inverse(float best, float weight_sum, const float *sinks, int head) {
    return 1.0f / (sinks ? weight_sum + expf(sinks[head] - best) : weight_sum);
}

#define LOW_STEPS 254.0f  /* an activation's second code counts in steps of 1/254 of its first's */
#define POSITIONS 64      /* attention: positions scored at a time */
#define MAX_GROUPS 16
#define MAX_HEAD_DIM 256
#define INT8_GROUP 32  /* columns a weight scale covers (the int8 layout, native/int8_matmul.py) */
#define INT8_OFFSET 128.0f  /* a weight's code is q + 128, an unsigned byte: the dot products multiply u8 by s8 */
#define KV_GROUP 32  /* values an int8 K/V row's fp16 scale covers (kv_layout.py) */

/* The bytes of one head's K/V row of head_dim values in the pool: bf16, or with int8 (kv_layout.py) head_dim int8
   codes followed by head_dim / KV_GROUP fp16 scales. */
static inline size_t kv_row_bytes(int head_dim, int int8) {
    return int8 ? (size_t)head_dim + (size_t)head_dim / KV_GROUP * 2 : (size_t)head_dim * 2;
}

/* x [head_dim] as an int8 K/V row's codes and fp32 scales, as llama.cpp's q8_0 and kv_int8.quantize_rows: per group
   of KV_GROUP the scale max|x| / 127 (1 for an all-zero group), each code x * (1 / scale) rounded to nearest even.
   The caller stores each scale rounded to fp16. */
static inline void quantize_kv_row(const float *x, int head_dim, int8_t *codes, float *scales) {
    for (int g = 0; g < head_dim / KV_GROUP; g++) {
        const float *group = x + (size_t)g * KV_GROUP;
        float largest = 0.0f;
        for (int i = 0; i < KV_GROUP; i++) largest = fmaxf(largest, fabsf(group[i]));
        float scale = largest > 0.0f ? largest / 127.0f : 1.0f, inverse = 1.0f / scale;
        for (int i = 0; i < KV_GROUP; i++) codes[g * KV_GROUP + i] = (int8_t)nearbyintf(group[i] * inverse);
        scales[g] = scale;
    }
}

/* x [M, K] as int8 codes per group of `group`: x ~ scale * high, |high| <= 127 (llama.cpp's Q8_0), and where `low`
   is given a second code a value, x ~ scale * (high + low / LOW_STEPS) (about 15 bits). code_totals [M, K / group]:
   each group's codes summed, high + low / LOW_STEPS. A kernel meets the weights' offsets with these sums rather than
   the exact ones, so that its product is exactly that of the rounded activations: its error is then the weights
   times the rounding, where the exact sums would leave the unsigned codes times it, about twice as large. */
static void quantize_activations(const float *x, int rows, int width, int group, int8_t *high, int8_t *low,
                                 float *scales, float *code_totals) {
    int groups = width / group;
    #pragma omp parallel for schedule(static) if (rows >= 8)
    for (int m = 0; m < rows; m++)
        for (int g = 0; g < groups; g++) {
            size_t at = (size_t)m * width + (size_t)g * group;
            float largest = 0.0f;
            for (int i = 0; i < group; i++) {  /* a compare, not fmaxf (a call a value) */
                const float magnitude = fabsf(x[at + i]);
                largest = magnitude > largest ? magnitude : largest;
            }
            float scale = largest > 0.0f ? largest / 127.0f : 1.0f, inverse = 1.0f / scale;
            int high_total = 0, low_total = 0;
            for (int i = 0; i < group; i++) {
                float scaled = x[at + i] * inverse, rounded = nearbyintf(scaled);
                high[at + i] = (int8_t)rounded;
                high_total += high[at + i];
                if (low) {
                    low[at + i] = (int8_t)nearbyintf((scaled - rounded) * LOW_STEPS);
                    low_total += low[at + i];
                }
            }
            scales[(size_t)m * groups + g] = scale;
            code_totals[(size_t)m * groups + g] = (float)high_total + (float)low_total / LOW_STEPS;
        }
}

/* The first position of the runs (runs[2j] .. runs[2j + 1] - 1, in order, from position 0) that a task reads: `from`
   (the window's start of its first row) where it lies in them, else 0. */
static inline int64_t window_skip(const int32_t *runs, int run_count, int64_t from) {
    int64_t held = 0;
    for (int j = 0; j < run_count; j++) held += runs[2 * j + 1] - runs[2 * j];
    return from > 0 && from < held ? from : 0;
}

/* Where run j's positions from `logical` on start: its first slot, or later where `logical` lies inside it. */
static inline int64_t run_slot(const int32_t *runs, int j, int64_t logical) {
    int64_t before = 0;
    for (int i = 0; i < j; i++) before += runs[2 * i + 1] - runs[2 * i];
    return logical > before ? runs[2 * j] + (logical - before) : runs[2 * j];
}

/* gpt-oss's experts: weights [rows, width] kept as a GGUF file's MXFP4 blocks (native/mxfp4_matmul.py). A block of
   32 weights of a row is 17 bytes: an e8m0 exponent e, then 16 bytes whose low nibble j is weight j's e2m1 code and
   high nibble weight j + 16's. A weight is MXFP4_HALVES[code] * 2^(e - 128) (twice the e2m1 value, half the
   scale: gguf-py's and llama.cpp's arithmetic), exact in fp32. */
#define MXFP4_BLOCK 32
#define MXFP4_BLOCK_BYTES 17

static const int8_t MXFP4_HALVES[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static inline float mxfp4_scale(uint8_t e) {  /* 2^(e - 128), as ggml_e8m0_to_fp32_half */
    union { uint32_t bits; float value; } scale = {e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23};
    return scale.value;
}

static inline void mxfp4_scales(float scale_of[256]) {  /* each e8m0 exponent's weight scale */
    for (int e = 0; e < 256; e++) scale_of[e] = mxfp4_scale((uint8_t)e);
}

/* One expert's share of a grouped MXFP4 call (mxfp4_experts): its weight (x86: its strips, mxfp4_strips_from_rows;
   neon: its rows of blocks [rows, width / 32 * 17]), its bias [rows] or NULL, and the activation rows
   [first, first + count) routed to it. mxfp4_matmul is one such share. */
typedef struct {
    const uint8_t *blocks;
    const float *bias;
    int first, count;
} mxfp4_segment;

/* mxfp4_experts' table [active, 3] (each expert's blocks' address, its bias's or 0, its rows, in the order of the
   activation rows) as segments; malloc'd, the caller frees them. */
static mxfp4_segment *mxfp4_segments(const int64_t *table, int active) {
    mxfp4_segment *segments = malloc((size_t)active * sizeof(mxfp4_segment));
    int first = 0;
    for (int e = 0; e < active; e++) {
        const int count = (int)table[3 * e + 2];
        segments[e] = (mxfp4_segment){(const uint8_t *)(intptr_t)table[3 * e],
                                      (const float *)(intptr_t)table[3 * e + 1], first, count};
        first += count;
    }
    return segments;
}

/* What an item of a segment (x86: a strip of 8 weight rows; neon: a weight row) costs in mxfp4_segment_items,
   in activation rows: reading and decoding its weights cost about as much as three rows' products (one 5760 x 2880
   expert in strips on two Zen 4 cores: 0.27 ms a call for one row, 0.29 for two, 0.44 for four). */
#define MXFP4_ITEM_WEIGHT_COST 3

static inline int64_t mxfp4_item_cost(const mxfp4_segment *segment) {  /* one item of `segment` */
    return MXFP4_ITEM_WEIGHT_COST + segment->count;
}

/* The share [*begin, *end) of the items (each segment's, in order: `items` a segment) that the calling thread of
   its OpenMP team takes: equal parts of their cost, MXFP4_ITEM_WEIGHT_COST + the segment's activation rows an item,
   where an equal count of items would leave a thread of few-row experts waiting for one of many-row ones. */
static void mxfp4_share(const mxfp4_segment *segments, int active, int items, int64_t *begin, int64_t *end) {
#ifdef _OPENMP
    const int64_t thread = omp_get_thread_num(), threads = omp_get_num_threads();
#else
    const int64_t thread = 0, threads = 1;
#endif
    int64_t total = 0;
    for (int s = 0; s < active; s++) total += items * mxfp4_item_cost(segments + s);
    const int64_t bounds[2] = {total * thread / threads, total * (thread + 1) / threads};
    int64_t *ends[2] = {begin, end};
    for (int i = 0; i < 2; i++) {  /* the first item whose cost starts at or past the bound */
        int64_t before = 0, item = 0;
        int s = 0;
        for (; s < active; s++, item += items) {
            const int64_t cost = items * mxfp4_item_cost(segments + s);
            if (before + cost > bounds[i]) break;
            before += cost;
        }
        if (s < active) {
            const int64_t each = mxfp4_item_cost(segments + s);
            item += (bounds[i] - before + each - 1) / each;
        }
        *ends[i] = item;
    }
}

/* A variant's MXFP4 rows call, ROWS(t, two), with its tile of t activation rows (1 .. 4) and its codes (two: 0 or
   1) constants, picked from the run-time `tile` and `two_codes`: each loop over the tile unrolls, and two or three
   rows decode the weights once for all of them, not once a row. */
#define MXFP4_CONSTANT_TILE(tile, two_codes, ROWS)                  \
    do {                                                            \
        _Static_assert(MXFP4_ROW_TILE <= 4, "tiles of up to 4 rows"); \
        switch (tile) {                                             \
            case 4: if (two_codes) ROWS(4, 1); else ROWS(4, 0); break; \
            case 3: if (two_codes) ROWS(3, 1); else ROWS(3, 0); break; \
            case 2: if (two_codes) ROWS(2, 1); else ROWS(2, 0); break; \
            default: if (two_codes) ROWS(1, 1); else ROWS(1, 0);     \
        }                                                           \
    } while (0)

/* A variant's product of item n of `segment` (a weight row or a strip) by its activation rows, with what the call's
   rows share. */
typedef void (*mxfp4_item)(const void *call, const mxfp4_segment *segment, int n);

/* Every segment's items (`items` a segment) through `each`: OpenMP over them all, in order, in shares of equal cost
   (mxfp4_share). */
static void mxfp4_segment_items(const void *call, mxfp4_item each, const mxfp4_segment *segments, int active,
                                int items) {
    #pragma omp parallel if ((int64_t)active * items >= 64)
    {
        int64_t begin, end;
        mxfp4_share(segments, active, items, &begin, &end);
        for (int64_t item = begin; item < end; item++) each(call, segments + item / items, (int)(item % items));
    }
}

/* mxfp4_matmul's activations, carved from the start of its scratch (M * (2K + K / 2) bytes of it): the codes of
   quantize_activations per block of 32 (high, and low where two codes a value) and scales [M, K / 32]; past them
   the room for the x86 strips' starts (mxfp4_starts: high_starts, low_starts [M, K / 32]). */
typedef struct {
    int8_t *high, *low;
    float *scales;
    int32_t *high_starts, *low_starts;
} mxfp4_activations;

/* x [M, K] rounded into `scratch` (the type's comment), one code a value or two. */
static mxfp4_activations mxfp4_quantize(const float *x, int count, int width, int two_codes, void *scratch) {
    const size_t values = (size_t)count * width, blocks = values / MXFP4_BLOCK;
    mxfp4_activations a;
    a.high = (int8_t *)scratch;
    a.low = a.high + values;
    a.scales = (float *)(a.low + values);
    float *code_totals = a.scales + blocks;
    quantize_activations(x, count, width, MXFP4_BLOCK, a.high, two_codes ? a.low : NULL, a.scales, code_totals);
    a.high_starts = (int32_t *)(code_totals + blocks);
    a.low_starts = a.high_starts + blocks;
    return a;
}

#ifdef __AVX2__
#include <immintrin.h>

/* ------------------------------------------------------------------------------------------------------------------
   The x86 variants' mxfp4_matmul and mxfp4_experts (gpt-oss's experts), over the weights in strips (MXFP4_STRIP_BYTES):
   each strip block's 256 weights are 8 vectors whose lane r holds weight row r's four weights, so one row of
   activations meets 8 weight rows a vector, and a block's fp32 scaling is one multiply-add for the 8. The GGUF
   layout's 17-byte blocks, one row at a time, left one product vector per block to scale, sum and reduce, which held
   one 5760 x 2880 expert to 12-13 GB/s a thread against 19 in strips. */
#define MXFP4_STRIP 8                                        /* weight rows a strip */
#define MXFP4_STRIP_BYTES (MXFP4_STRIP * MXFP4_BLOCK_BYTES)  /* a strip block: 8 exponents, then 128 code bytes */
#define MXFP4_ROW_TILE 4                                     /* activation rows a pass over a strip */
#define MXFP4_LIFT 12                                        /* the weights stored unsigned: 2 x e2m1 + 12 */

/* -MXFP4_LIFT times each block of 32 codes' sum, [blocks]: where a block's dot product of the x86 strips' lifted
   weights with the codes starts, which takes out what the lift added. */
static void mxfp4_starts(const int8_t *codes, size_t blocks, int32_t *starts) {
    for (size_t block = 0; block < blocks; block++) {
        int32_t total = 0;
        for (int i = 0; i < MXFP4_BLOCK; i++) total += codes[block * MXFP4_BLOCK + i];
        starts[block] = -MXFP4_LIFT * total;
    }
}

/* A strip block's weights (block: its 8 exponents, then its codes) through `table`: out[j] (j < 4) lane r = row r's
   weights 4j .. 4j + 3 (its code bytes' low nibbles), out[4 + j] its weights 16 + 4j .. 19 + 4j (high nibbles). */
static inline __attribute__((always_inline)) void mxfp4_strip_weights(const uint8_t *block, __m256i table,
                                                                      __m256i out[8]) {
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    for (int j = 0; j < 4; j++) {
        const __m256i codes = _mm256_loadu_si256((const __m256i *)(block + MXFP4_STRIP + 32 * j));
        out[j] = _mm256_shuffle_epi8(table, _mm256_and_si256(codes, nibble));
        out[4 + j] = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(codes, 4), nibble));
    }
}

/* A strip block's weight scales, lane r = 2^(e_r - 128) (mxfp4_scale): from its exponents' bits, e < 2 subnormal. */
static inline __m256 mxfp4_strip_scales(const uint8_t *block) {
    const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)block));
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(subnormal, normal, _mm256_cmpgt_epi32(e, _mm256_set1_epi32(1))));
}

/* Lane r: row r's unsigned weights (twice the e2m1 value + MXFP4_LIFT) times one activation row's 32 signed codes,
   plus `start` (-MXFP4_LIFT times the codes' sum, which takes out the lift): the block's exact int32 dot product. Four
   vpmaddubsw pairs (at most 2 x 24 x 127 each) sum in int16 within 4 x 6096. */
static inline __attribute__((always_inline)) __m256i mxfp4_strip_dot(const __m256i weights[8], const int8_t *codes,
                                                                     int32_t start) {
#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
    __m256i dot = _mm256_set1_epi32(start);
    for (int g = 0; g < 8; g++) {
        int32_t four;
        __builtin_memcpy(&four, codes + 4 * g, 4);
#ifdef __AVXVNNI__
        dot = _mm256_dpbusd_avx_epi32(dot, weights[g], _mm256_set1_epi32(four));
#else
        dot = _mm256_dpbusd_epi32(dot, weights[g], _mm256_set1_epi32(four));
#endif
    }
    return dot;
#else
    __m256i halves[2];
    for (int h = 0; h < 2; h++) {
        __m256i pairs = _mm256_setzero_si256();
        for (int k = 0; k < 4; k++) {  /* groups 2h, 2h + 1 and 4 + 2h, 5 + 2h */
            const int g = 2 * h + k % 2 + 4 * (k / 2);
            int32_t four;
            __builtin_memcpy(&four, codes + 4 * g, 4);
            pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(weights[g], _mm256_set1_epi32(four)));
        }
        halves[h] = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
    }
    return _mm256_add_epi32(_mm256_add_epi32(halves[0], halves[1]), _mm256_set1_epi32(start));
#endif
}

/* What every strip of a call reads. */
typedef struct {
    const mxfp4_activations *a;
    int width, rows, two_codes;
    __m256i table;  /* the lifted weights (mxfp4_strip_dot) */
    float *y;
} mxfp4_call;

/* `tile` activation rows from `first` times the strip at `strip`: sums[m] lane r = their dot product with weight row
   r, in steps of 1 / LOW_STEPS where two codes a value (each block's high codes' dot times LOW_STEPS plus its low
   codes', exact in fp32: at most 254 x 48768 + 48768). */
static inline __attribute__((always_inline)) void mxfp4_strip_tile(int tile, int two_codes, const mxfp4_call *call,
                                                                   const uint8_t *strip, int first, __m256 *sums) {
    const mxfp4_activations *a = call->a;
    const int per_row = call->width / MXFP4_BLOCK;
    for (int m = 0; m < tile; m++) sums[m] = _mm256_setzero_ps();
    for (int b = 0; b < per_row; b++) {
        const uint8_t *block = strip + (size_t)b * MXFP4_STRIP_BYTES;
        __m256i weights[8];
        mxfp4_strip_weights(block, call->table, weights);
        const __m256 weight_scales = mxfp4_strip_scales(block);
        for (int m = 0; m < tile; m++) {
            const size_t at = (size_t)(first + m) * per_row + b;  /* the activation block */
            __m256 value = _mm256_cvtepi32_ps(mxfp4_strip_dot(weights, a->high + at * MXFP4_BLOCK, a->high_starts[at]));
            if (two_codes)
                value = _mm256_fmadd_ps(value, _mm256_set1_ps(LOW_STEPS), _mm256_cvtepi32_ps(
                    mxfp4_strip_dot(weights, a->low + at * MXFP4_BLOCK, a->low_starts[at])));
            sums[m] = _mm256_fmadd_ps(value, _mm256_mul_ps(weight_scales, _mm256_set1_ps(a->scales[at])), sums[m]);
        }
    }
}

/* A strip's 8 outputs of one activation row into y_row from column `column` (fewer at a weight's last strip where
   its rows are not a multiple of 8), plus bias. */
static inline void mxfp4_strip_out(__m256 sums, const float *bias, int column, int rows, float *y_row) {
    float out[MXFP4_STRIP];
    _mm256_storeu_ps(out, sums);
    const int columns = rows - column < MXFP4_STRIP ? rows - column : MXFP4_STRIP;
    for (int r = 0; r < columns; r++) y_row[column + r] = out[r] + (bias ? bias[column + r] : 0.0f);
}

#ifdef __AVX512F__
/* The avx512 variant takes calls of one code where an expert has MXFP4_PAIR_ROWS activation rows or more (prompt
   chunks) two strips a pass: 16 weight rows a 512-bit vector, strip s's in lanes 0-7 and s + 1's in 8-15, so each
   product, conversion and scaling covers twice the rows (64 rows of a 5760 x 2880 expert on two Zen 4 cores:
   5.8 -> 4.3 ms). Fewer rows stay a strip a pass, which read a one-row call faster there (0.27 ms against 0.37). A
   weight of an odd number of strips passes its last strip twice, the second's outputs dropped. */
#define MXFP4_PAIR_ROWS 5

static inline __attribute__((always_inline)) void mxfp4_pair_weights(const uint8_t *first, const uint8_t *second,
                                                                     __m512i table, __m512i out[8]) {
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    for (int j = 0; j < 4; j++) {
        const __m512i codes = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(first + MXFP4_STRIP + 32 * j))),
            _mm256_loadu_si256((const __m256i *)(second + MXFP4_STRIP + 32 * j)), 1);
        out[j] = _mm512_shuffle_epi8(table, _mm512_and_si512(codes, nibble));
        out[4 + j] = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(codes, 4), nibble));
    }
}

static inline __m512 mxfp4_pair_scales(const uint8_t *first, const uint8_t *second) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(mxfp4_strip_scales(first))),
                                               _mm256_castps_pd(mxfp4_strip_scales(second)), 1));
}

static inline __attribute__((always_inline)) __m512i mxfp4_pair_dot(const __m512i weights[8], const int8_t *codes,
                                                                    int32_t start) {
    __m512i dot = _mm512_set1_epi32(start);
    for (int g = 0; g < 8; g++) {
        int32_t four;
        __builtin_memcpy(&four, codes + 4 * g, 4);
        dot = _mm512_dpbusd_epi32(dot, weights[g], _mm512_set1_epi32(four));
    }
    return dot;
}

/* mxfp4_strip_tile over the pair of strips at `first` and `second`, one code a value (calls of many rows). */
static inline __attribute__((always_inline)) void mxfp4_pair_tile(int tile, const mxfp4_call *call,
                                                                  const uint8_t *first, const uint8_t *second,
                                                                  int row, __m512 *sums) {
    const mxfp4_activations *a = call->a;
    const int per_row = call->width / MXFP4_BLOCK;
    const __m512i table = _mm512_broadcast_i64x4(call->table);
    for (int m = 0; m < tile; m++) sums[m] = _mm512_setzero_ps();
    for (int b = 0; b < per_row; b++) {
        const size_t offset = (size_t)b * MXFP4_STRIP_BYTES;
        __m512i weights[8];
        mxfp4_pair_weights(first + offset, second + offset, table, weights);
        const __m512 weight_scales = mxfp4_pair_scales(first + offset, second + offset);
        for (int m = 0; m < tile; m++) {
            const size_t at = (size_t)(row + m) * per_row + b;  /* the activation block */
            const __m512i dot = mxfp4_pair_dot(weights, a->high + at * MXFP4_BLOCK, a->high_starts[at]);
            const __m512 scales = _mm512_mul_ps(weight_scales, _mm512_set1_ps(a->scales[at]));
            sums[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scales, sums[m]);
        }
    }
}

/* Strips 2p and 2p + 1 of `segment` against its activation rows, MXFP4_ROW_TILE at a time. */
static void mxfp4_pair_item(const void *context, const mxfp4_segment *segment, int p) {
    const mxfp4_call *call = context;
    const int strips = (call->rows + MXFP4_STRIP - 1) / MXFP4_STRIP, s = 2 * p, both = s + 1 < strips;
    const size_t strip_bytes = (size_t)(call->width / MXFP4_BLOCK) * MXFP4_STRIP_BYTES;
    const uint8_t *first = segment->blocks + (size_t)s * strip_bytes, *second = both ? first + strip_bytes : first;
    for (int m0 = 0; m0 < segment->count; m0 += MXFP4_ROW_TILE) {
        const int tile = segment->count - m0 < MXFP4_ROW_TILE ? segment->count - m0 : MXFP4_ROW_TILE;
        __m512 sums[MXFP4_ROW_TILE];
        #define MXFP4_TILE(t, two) mxfp4_pair_tile(t, call, first, second, segment->first + m0, sums)
        MXFP4_CONSTANT_TILE(tile, 0, MXFP4_TILE);
        #undef MXFP4_TILE
        for (int m = 0; m < tile; m++) {
            const __m512 out = sums[m];
            float *y_row = call->y + (size_t)(segment->first + m0 + m) * call->rows;
            mxfp4_strip_out(_mm512_castps512_ps256(out), segment->bias, s * MXFP4_STRIP, call->rows, y_row);
            if (both)
                mxfp4_strip_out(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(out), 1)), segment->bias,
                                (s + 1) * MXFP4_STRIP, call->rows, y_row);
        }
    }
}
#endif

/* Strip s of `segment` against its activation rows, MXFP4_ROW_TILE at a time. */
static void mxfp4_strip_item(const void *context, const mxfp4_segment *segment, int s) {
    const mxfp4_call *call = context;
    const uint8_t *strip = segment->blocks + (size_t)s * (call->width / MXFP4_BLOCK) * MXFP4_STRIP_BYTES;
    const __m256 unit = _mm256_set1_ps(call->two_codes ? 1.0f / LOW_STEPS : 1.0f);
    for (int m0 = 0; m0 < segment->count; m0 += MXFP4_ROW_TILE) {
        const int tile = segment->count - m0 < MXFP4_ROW_TILE ? segment->count - m0 : MXFP4_ROW_TILE;
        __m256 sums[MXFP4_ROW_TILE];
        #define MXFP4_TILE(t, two) mxfp4_strip_tile(t, two, call, strip, segment->first + m0, sums)
        MXFP4_CONSTANT_TILE(tile, call->two_codes, MXFP4_TILE);
        #undef MXFP4_TILE
        for (int m = 0; m < tile; m++)
            mxfp4_strip_out(_mm256_mul_ps(sums[m], unit), segment->bias, s * MXFP4_STRIP, call->rows,
                            call->y + (size_t)(segment->first + m0 + m) * call->rows);
    }
}
/* The segments' strips (OpenMP, mxfp4_segment_items) against their rows' activations rounded to one code or two. */
static void mxfp4_strip_call(const float *x, int count, int width, const mxfp4_segment *segments, int active,
                             int rows, int two_codes, void *scratch, float *y) {
    const mxfp4_activations a = mxfp4_quantize(x, count, width, two_codes, scratch);
    const size_t blocks = (size_t)count * width / MXFP4_BLOCK;
    mxfp4_starts(a.high, blocks, a.high_starts);
    if (two_codes) mxfp4_starts(a.low, blocks, a.low_starts);
    const __m256i values = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)MXFP4_HALVES));
    const mxfp4_call call = {&a, width, rows, two_codes, _mm256_add_epi8(values, _mm256_set1_epi8(MXFP4_LIFT)), y};
    const int strips = (rows + MXFP4_STRIP - 1) / MXFP4_STRIP;
#ifdef __AVX512F__
    int most = 0;  /* an expert's rows, at most */
    for (int e = 0; e < active; e++) most = segments[e].count > most ? segments[e].count : most;
    if (!two_codes && most >= MXFP4_PAIR_ROWS) {
        mxfp4_segment_items(&call, mxfp4_pair_item, segments, active, (strips + 1) / 2);
        return;
    }
#endif
    mxfp4_segment_items(&call, mxfp4_strip_item, segments, active, strips);
}

/* The exact product, fp32 activations (the fp32 plan): each strip block's signed weights widened to fp32 a weight
   at a time (lane r: row r's), times its scales, met by each activation row's value broadcast. */
static void mxfp4_matmul_exact(const float *x, int count, int width, const uint8_t *blocks, int rows,
                               const float *bias, float *y) {
    const int per_row = width / MXFP4_BLOCK, strips = (rows + MXFP4_STRIP - 1) / MXFP4_STRIP;
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)MXFP4_HALVES));
    #pragma omp parallel for schedule(static) if (strips >= 8)
    for (int s = 0; s < strips; s++) {
        const uint8_t *strip = blocks + (size_t)s * per_row * MXFP4_STRIP_BYTES;
        for (int m0 = 0; m0 < count; m0 += MXFP4_ROW_TILE) {
            const int tile = count - m0 < MXFP4_ROW_TILE ? count - m0 : MXFP4_ROW_TILE;
            __m256 sums[MXFP4_ROW_TILE];
            for (int m = 0; m < tile; m++) sums[m] = _mm256_setzero_ps();
            for (int b = 0; b < per_row; b++) {
                const uint8_t *block = strip + (size_t)b * MXFP4_STRIP_BYTES;
                __m256i weights[8];
                mxfp4_strip_weights(block, table, weights);
                const __m256 scales = mxfp4_strip_scales(block);
                for (int g = 0; g < 8; g++)
                    for (int i = 0; i < 4; i++) {  /* weight 4g + i of the block: byte i of each lane */
                        const __m256 weight = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srai_epi32(
                            _mm256_slli_epi32(weights[g], 24 - 8 * i), 24)), scales);
                        for (int m = 0; m < tile; m++)
                            sums[m] = _mm256_fmadd_ps(weight, _mm256_set1_ps(
                                x[(size_t)(m0 + m) * width + (size_t)b * MXFP4_BLOCK + 4 * g + i]), sums[m]);
                    }
            }
            for (int m = 0; m < tile; m++)
                mxfp4_strip_out(sums[m], bias, s * MXFP4_STRIP, rows, y + (size_t)(m0 + m) * rows);
        }
    }
}

/* The strips these kernels read (mxfp4.py's in_strips) from blocks [rows, width / 32 * 17]: strips [ceil(rows / 8),
   width / 32 * MXFP4_STRIP_BYTES], zero blocks past the weight's rows. `strips` may be `blocks` itself where the rows
   are a multiple of 8 (a strip takes the bytes its rows held, each strip's rows copied aside first). */
void mxfp4_strips_from_rows(const uint8_t *blocks, int rows, int width, uint8_t *strips) {
    const int per_row = width / MXFP4_BLOCK, count = (rows + MXFP4_STRIP - 1) / MXFP4_STRIP;
    const size_t row_bytes = (size_t)per_row * MXFP4_BLOCK_BYTES;
    const int in_place = strips == blocks;
    #pragma omp parallel
    {
        uint8_t *aside = in_place ? malloc(MXFP4_STRIP * row_bytes) : NULL;
        #pragma omp for schedule(static)
        for (int s = 0; s < count; s++) {
            const uint8_t *first = blocks + (size_t)s * MXFP4_STRIP * row_bytes;
            if (in_place) first = memcpy(aside, first, MXFP4_STRIP * row_bytes);
            uint8_t *out = strips + (size_t)s * per_row * MXFP4_STRIP_BYTES;
            for (int b = 0; b < per_row; b++, out += MXFP4_STRIP_BYTES)
                for (int r = 0; r < MXFP4_STRIP; r++) {
                    static const uint8_t zero[MXFP4_BLOCK_BYTES];
                    const int held = s * MXFP4_STRIP + r < rows;
                    const uint8_t *block = held ? first + r * row_bytes + (size_t)b * MXFP4_BLOCK_BYTES : zero;
                    out[r] = block[0];
                    for (int j = 0; j < 4; j++) memcpy(out + MXFP4_STRIP + 32 * j + 4 * r, block + 1 + 4 * j, 4);
                }
        }
        free(aside);
    }
}

/* y [count, rows] = x [count, width] times the weight's strips (mxfp4_strips_from_rows), plus bias [rows] where given.
   codes: 1 or 2 int8 codes an activation per block of 32 (quantize_activations, as llama.cpp's Q8_0 with one), whose
   products with the weights (twice their e2m1 values, exact in int8) sum exactly in int32; 0: the activations as
   they are, in fp32 (exact). scratch: mxfp4_quantize's. */
void mxfp4_matmul(const float *x, int count, int width, const uint8_t *blocks, int rows, const float *bias,
                  int codes, void *scratch, float *y) {
    if (codes == 0) {
        mxfp4_matmul_exact(x, count, width, blocks, rows, bias, y);
        return;
    }
    const mxfp4_segment whole = {blocks, bias, 0, count};
    mxfp4_strip_call(x, count, width, &whole, 1, rows, codes == 2, scratch, y);
}

/* A step's experts in one call: x [count, width] the activation rows of each expert in table [active, 3] (each
   expert's strips, its bias or 0, its rows; mxfp4_segments), one expert's after another; y [count, rows] each row
   times its expert's weight, plus its bias. codes: mxfp4_matmul's. Their strips are shared among the threads. */
void mxfp4_experts(const float *x, int count, int width, const int64_t *table, int active, int rows, int codes,
                   void *scratch, float *y) {
    mxfp4_segment *segments = mxfp4_segments(table, active);
    mxfp4_strip_call(x, count, width, segments, active, rows, codes == 2, scratch, y);
    free(segments);
}
#endif  /* __AVX2__ */

#endif
