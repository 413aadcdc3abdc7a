"""Hearth's own CPU kernels, in C (engine thread; each call spreads over OpenMP's threads).

``variants`` lists their instruction-set variants, one library each with the same
functions: ``kernels.c`` (AVX-512 with VNNI and VBMI, and AMX) and ``kernels_avx2.c``
(AVX2 and FMA), sharing ``kernels_common.h``. ``setup.py`` compiles them into the
package; ``support`` chooses the variant this CPU runs, without loading it; ``build``
loads its library with ctypes (compiling it once per machine into the cache folder
where the package holds none); where none runs ``build.library()`` is None and the
callers keep PyTorch's ops.
``int4_matmul`` multiplies a few rows by 4-bit weights in the CPU int4 layout
(its activations rounded as ``activation_codes`` says), and many rows on AMX's bf16 tiles
where the CPU has them; ``scratch`` holds the buffers they reuse; ``int8_matmul`` by 8-bit weights in
groups of 32 (the output layer beside them);
``decode_attention`` runs a batched step's attention of its decode rows and short prompt chunks;
``norm`` is RMSNorm; ``int4_layout_from_nibbles`` lays a GGUF file's 4-bit blocks out for the int4 kernel at load.
"""
