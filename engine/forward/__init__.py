"""Forward passes over a KV cache: the one place that runs the model (engine thread).

``backend`` defines the three operations the decode loop uses (feed tokens, crop a
cache, measure a cache) and runs any transformers model through them;
``fast_llama`` is Hearth's own compact Llama-family forward on the CPU, and
``cuda_backend`` with ``cuda_step``, ``cuda_graphs`` and ``static_cache`` is the GPU
fast path. ``paged_kv`` is the block-wise KV store of a batched step. ``weights`` holds the weight formats and kernels these passes use;
``native`` Hearth's own CPU kernels in C, where the machine can build them.
"""
