"""Benchmarks and the GPU check, each a command that prints JSON lines (main thread of its own process).

``python -m engine.bench`` (``cli``) measures decode, prefill, multi-turn reuse,
chat and load on a real or random model, with its baseline in the same run, and
(``remote_client``) Hearth's client of a remote server against a bare one;
``measure`` holds the timed pieces. ``python -m engine.bench.gpu_check OUT_DIR``
runs the GPU tests and every GPU benchmark, each in its own process.
"""
