"""Forward passes over a KV store: the one place that runs the model (engine thread).

``backend`` declares what the batch runner drives (``BatchBackend``: a block pool, a
step over many sequences) and runs any other transformers model one request at a time
(``HFBackend``). The fast path for Llama-family models: ``llama_weights`` builds the
weights in its formats, ``llama_forward`` is the forward pass over a block pool
(``paged_kv``, its layers' sliding windows and KV groups from ``windows``; an int8 cache's
row layout in ``kv_layout``, its quantizing in torch in ``kv_int8``), with
``attention`` its torch attention; ``family`` holds what sets a family (Gemma, Phi-3)
apart as data and ``rotary_tables`` its rotary tables; ``cpu_backend`` runs it on the
CPU, ``cuda_backend`` with ``cuda_batch``, ``cuda_graphs`` and ``paged_attention`` on a
GPU. ``weights`` holds the weight formats and kernels these passes use; ``native``
Hearth's own CPU kernels in C, where the machine can build them.
"""
