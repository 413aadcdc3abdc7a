/* What every variant of Hearth's CPU kernels shares (variants.py): the layouts' constants and the rounding of a
   matmul's activations to int8 codes, in plain C (each variant compiles it with its own flags). */

#ifndef HEARTH_KERNELS_COMMON_H
#define HEARTH_KERNELS_COMMON_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define BLOCK_ROWS 64     /* rows per block of the int4 layout (cpu_int4_layout) */

/* How far ahead of what a decode call's loop reads it asks for a weight's bytes (prefetch_ahead). A one-row call
   streams its weights once, and without it the hardware's prefetch fell behind on a Sapphire Rapids VM (28 GB/s
   copy): the int4 kernel read at 20 GB/s beside another busy core and 26 with it (an 8B model's decode 4.6 ->
   5.6 tok/s), the MXFP4 kernel's 17-byte blocks, which straddle cache lines, at 9 GB/s on a quiet one and 20. */
#define WEIGHT_PREFETCH_BYTES 4096

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

/* One expert's share of a grouped MXFP4 call (mxfp4_experts): its weight's blocks [rows, width / 32 * 17], its bias
   [rows] or NULL, and the activation rows [first, first + count) routed to it. mxfp4_matmul is one such share. */
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

/* What a weight row of a segment costs in mxfp4_segment_rows, in activation rows: reading and decoding its blocks
   cost about as much as three rows' products (one 5760 x 2880 expert on two Zen 4 cores: 0.30 ms a call for one
   row, 0.37 for two, 0.53 for four). */
#define MXFP4_WEIGHT_ROW_COST 3

static inline int64_t mxfp4_item_cost(const mxfp4_segment *segment) {  /* one weight row of `segment` */
    return MXFP4_WEIGHT_ROW_COST + segment->count;
}

/* The share [*begin, *end) of the items (each segment's weight rows, in order: rows a segment) that the calling
   thread of its OpenMP team takes: equal parts of their cost, MXFP4_WEIGHT_ROW_COST + the segment's activation rows
   an item, where an equal count of items would leave a thread of few-row experts waiting for one of many-row
   ones. */
static void mxfp4_share(const mxfp4_segment *segments, int active, int rows, int64_t *begin, int64_t *end) {
#ifdef _OPENMP
    const int64_t thread = omp_get_thread_num(), threads = omp_get_num_threads();
#else
    const int64_t thread = 0, threads = 1;
#endif
    int64_t total = 0;
    for (int s = 0; s < active; s++) total += rows * mxfp4_item_cost(segments + s);
    const int64_t bounds[2] = {total * thread / threads, total * (thread + 1) / threads};
    int64_t *ends[2] = {begin, end};
    for (int i = 0; i < 2; i++) {  /* the first item whose cost starts at or past the bound */
        int64_t before = 0, item = 0;
        int s = 0;
        for (; s < active; s++, item += rows) {
            const int64_t cost = rows * mxfp4_item_cost(segments + s);
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

/* A variant's tiles of weight row n of `segment`: its activation rows MXFP4_ROW_TILE at a time, each tile's sums from
   ROWS(t, two) (MXFP4_CONSTANT_TILE; in scope there: `first`, the tile's first activation row, `m0`, its offset in
   the segment, and `sums`), into y[first + m, n] [., rows] plus the segment's bias. */
#define MXFP4_SEGMENT_TILES(segment, n, rows, two_codes, y, ROWS)                                            \
    for (int m0 = 0; m0 < (segment)->count;) {                                                              \
        const int tile = (segment)->count - m0 < MXFP4_ROW_TILE ? (segment)->count - m0 : MXFP4_ROW_TILE;   \
        const int first = (segment)->first + m0;                                                            \
        float sums[MXFP4_ROW_TILE];                                                                         \
        MXFP4_CONSTANT_TILE(tile, two_codes, ROWS);                                                         \
        const float shift = (segment)->bias ? (segment)->bias[n] : 0.0f;                                    \
        for (int m = 0; m < tile; m++) (y)[(size_t)(first + m) * (rows) + (n)] = sums[m] + shift;           \
        m0 += tile;                                                                                         \
    }

/* A variant's product of weight row n of `segment` by its activation rows, with what the call's rows share. */
typedef void (*mxfp4_weight_row)(const void *call, const mxfp4_segment *segment, int n);

/* Every segment's weight rows (`rows` a segment) through `weight_row`: OpenMP over them all, in order, in shares of
   equal cost (mxfp4_share). */
static void mxfp4_segment_rows(const void *call, mxfp4_weight_row weight_row, const mxfp4_segment *segments,
                               int active, int rows) {
    #pragma omp parallel if ((int64_t)active * rows >= 64)
    {
        int64_t begin, end;
        mxfp4_share(segments, active, rows, &begin, &end);
        for (int64_t item = begin; item < end; item++) weight_row(call, segments + item / rows, (int)(item % rows));
    }
}

#define MXFP4_LIFT 12  /* the x86 loops' weights are unsigned: twice the e2m1 value + 12, from 0 to 24 */

/* mxfp4_matmul's activations, carved from the start of its scratch (M * (2K + K / 4) bytes of it): the codes of
   quantize_activations per block of 32 (high, and low where two codes a value) and scales [M, K / 32]; and for the
   avx2 strips (`starts`), -MXFP4_LIFT times each block's high codes' sum and its low codes' (high_starts, low_starts
   [M, K / 32]), where a block's dot product of the lifted weights with the codes starts: that takes out what the
   lift added. (The avx512 row loop rearranges the codes past the scales: kernels.c's mxfp4_groups.) */
typedef struct {
    int8_t *high, *low;
    float *scales;
    int32_t *high_starts, *low_starts;
} mxfp4_activations;

/* -MXFP4_LIFT times each block of 32 codes' sum, [blocks]. */
static void mxfp4_starts(const int8_t *codes, size_t blocks, int32_t *starts) {
    for (size_t block = 0; block < blocks; block++) {
        int32_t total = 0;
        for (int i = 0; i < MXFP4_BLOCK; i++) total += codes[block * MXFP4_BLOCK + i];
        starts[block] = -MXFP4_LIFT * total;
    }
}

/* x [M, K] rounded into `scratch` (the type's comment), one code a value or two; `starts`: the avx2 strips' too. */
static mxfp4_activations mxfp4_quantize(const float *x, int count, int width, int two_codes, int starts,
                                        void *scratch) {
    const size_t values = (size_t)count * width, blocks = values / MXFP4_BLOCK;
    mxfp4_activations a;
    a.high = (int8_t *)scratch;
    a.low = a.high + values;
    a.scales = (float *)(a.low + values);
    float *code_totals = a.scales + blocks;
    quantize_activations(x, count, width, MXFP4_BLOCK, a.high, two_codes ? a.low : NULL, a.scales, code_totals);
    a.high_starts = (int32_t *)(code_totals + blocks);
    a.low_starts = a.high_starts + blocks;
    if (starts) mxfp4_starts(a.high, blocks, a.high_starts);
    if (starts && two_codes) mxfp4_starts(a.low, blocks, a.low_starts);
    return a;
}

#endif
