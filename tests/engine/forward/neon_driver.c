/* Runs one of kernels_neon.c's exported functions on arguments given on the command line, for
   test_neon_kernels.py under qemu-aarch64 (no ARM machine needed). Built with the kernels' source included, so it
   also reports which products the kernels chose:

     neon_driver dot                   prints 1 where the kernels take sdot here, else 0
     neon_driver KERNEL ARGUMENT...    calls KERNEL with its arguments in order, each one of
         f:PATH   a buffer read whole from PATH (its pointer), written back to PATH.out after the call
         s:BYTES  a zeroed buffer of BYTES bytes (the matmuls' scratch)
         i:N      an int      l:N  an int64      e:X  a float */

#include <stdio.h>
#include <stdlib.h>

#include "kernels_neon.c"

#define MOST_ARGUMENTS 16

typedef union {
    void *pointer;
    int32_t integer;
    int64_t wide;
    float real;
} argument;

static void *file_contents(const char *path, long *size) {
    FILE *file = fopen(path, "rb");
    if (!file) { perror(path); exit(2); }
    fseek(file, 0, SEEK_END);
    *size = ftell(file);
    fseek(file, 0, SEEK_SET);
    void *buffer = aligned_alloc(64, (size_t)(*size + 63) / 64 * 64);
    if (fread(buffer, 1, (size_t)*size, file) != (size_t)*size) { perror(path); exit(2); }
    fclose(file);
    return buffer;
}

static void write_back(const char *path, const void *buffer, long size) {
    char target[4096];
    snprintf(target, sizeof target, "%s.out", path);
    FILE *file = fopen(target, "wb");
    if (!file || fwrite(buffer, 1, (size_t)size, file) != (size_t)size) { perror(target); exit(2); }
    fclose(file);
}

int main(int count, char **words) {
    if (count == 2 && strcmp(words[1], "dot") == 0) {
        printf("%d\n", has_dot_products());
        return 0;
    }
    if (count < 2 || count - 2 > MOST_ARGUMENTS) {
        fprintf(stderr, "usage: neon_driver KERNEL ARGUMENT...\n");
        return 2;
    }
    argument a[MOST_ARGUMENTS];
    long sizes[MOST_ARGUMENTS] = {0};
    for (int i = 0; i < count - 2; i++) {
        const char *word = words[i + 2], *value = word + 2;
        switch (word[0]) {
            case 'f': a[i].pointer = file_contents(value, &sizes[i]); break;
            case 's': a[i].pointer = calloc(1, (size_t)atol(value) + 64); break;
            case 'n': a[i].pointer = NULL; break;
            case 'i': a[i].integer = atoi(value); break;
            case 'l': a[i].wide = atoll(value); break;
            case 'e': a[i].real = strtof(value, NULL); break;
            default: fprintf(stderr, "unknown argument %s\n", word); return 2;
        }
    }
    const char *kernel = words[1];
    #define P(i) a[i].pointer
    #define I(i) a[i].integer
    #define L(i) a[i].wide
    if (strcmp(kernel, "int4_matmul") == 0)
        int4_matmul(P(0), I(1), I(2), P(3), P(4), I(5), I(6), I(7), P(8), P(9));
    else if (strcmp(kernel, "int8_matmul") == 0)
        int8_matmul(P(0), I(1), I(2), P(3), P(4), I(5), I(6), P(7), P(8));
    else if (strcmp(kernel, "decode_attention") == 0)
        decode_attention(P(0), P(1), P(2), P(3), I(4), P(5), P(6), I(7), I(8), I(9), L(10), P(11));
    else if (strcmp(kernel, "chunk_attention") == 0)
        chunk_attention(P(0), P(1), P(2), I(3), I(4), I(5), P(6), I(7), I(8), I(9), I(10), L(11), I(12));
    else if (strcmp(kernel, "rms_norm") == 0)
        rms_norm(P(0), I(1), I(2), a[3].real, P(4));
    else if (strcmp(kernel, "swiglu") == 0)
        swiglu(P(0), I(1), I(2), a[3].real, a[4].real, a[5].real, P(6));
    else if (strcmp(kernel, "rotate_and_store") == 0)
        rotate_and_store(P(0), P(1), I(2), I(3), I(4), I(5), P(6), L(7), P(8));
    else if (strcmp(kernel, "int4_layout_from_nibbles") == 0)
        int4_layout_from_nibbles(P(0), I(1), I(2), I(3), L(4), L(5), P(6));
    else if (strcmp(kernel, "mxfp4_matmul") == 0)
        mxfp4_matmul(P(0), I(1), I(2), P(3), I(4), P(5), I(6), P(7), P(8));
    else if (strcmp(kernel, "amx_enable") == 0)
        printf("%d\n", amx_enable());
    else {
        fprintf(stderr, "unknown kernel %s\n", kernel);
        return 2;
    }
    for (int i = 0; i < count - 2; i++)
        if (words[i + 2][0] == 'f') write_back(words[i + 2] + 2, a[i].pointer, sizes[i]);
    return 0;
}
