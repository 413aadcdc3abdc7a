"""Model files: what the user picked, whether Hearth can open it, what it will cost, and loading it.

``model_files`` inspects a path (``model_source`` is the result), with the safety
checks of ``gguf_check`` and ``safetensors_check`` run before anything is
allocated; ``format_plan`` chooses, once, the formats a load runs in (weights,
decode copy, output layer, token table, prompt path, caches); ``memory_estimate`` and
``inspection`` say what each precision's plan needs against free memory; ``default_model`` fetches the built-in model; ``model_open``
goes from a picked path to a ``LoadedModel`` through ``loading`` (and, for a GGUF
file, ``gguf_direct``, which reads its tensors as they are). ``random_models`` builds real architectures with random
weights for benchmarks and tests. Runs on the engine thread, or on the loader
thread of ``engine.service.background_load``; inspection and the checks import no torch.
"""
