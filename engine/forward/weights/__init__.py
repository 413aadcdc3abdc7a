"""Weight formats and the kernels that multiply by them (engine thread).

``quant`` holds the ``Linear`` and ``Embedding`` modules of the fast paths, each
backed by one weight format; ``quant_int`` packs int8 and int4 groups and picks
the kernel for them on the CPU and the GPU; ``packed_sizes`` says what a packed
format occupies; ``triton_gemv`` is the int8 GPU matrix-vector kernel for decode steps.
"""
