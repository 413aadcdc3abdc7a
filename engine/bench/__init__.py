"""Benchmarks and the GPU check, each a command that prints JSON lines (main thread of its own process).

``python -m engine.bench`` (``cli``) measures decode, prefill, multi-turn reuse,
chat and load on a real or random model, with its baseline in the same run;
``measure`` holds the timed pieces, ``bench_models`` what ``--model`` names.
``random_gguf`` (with ``random_blocks``) writes GGUF files of real shapes with random
weights; ``peer`` runs llama.cpp, the yardstick, in a process of its own
(``peer_llama.py`` is the script it runs), ``peer_compare`` takes turns with it, and
``load_probe`` measures one load in a fresh process, and ``remote_client`` times
Hearth's client of a remote server against a bare one. ``python -m engine.bench.gpu_check OUT_DIR``
runs the GPU tests and every GPU benchmark, each in its own process.
"""
