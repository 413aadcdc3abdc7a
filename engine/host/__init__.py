"""The machine the engine runs on: threads, the allocator, memory readings, Hearth's folders.

``config`` holds the user's two settings from the environment (``HEARTH_HOME``,
``HEARTH_THREADS``), ``cpu_features`` what the CPU's instructions offer,
``cpu_threads`` sets torch's thread count, ``allocator`` tunes glibc so activation
buffers are reused, ``memory`` reads process and device memory, ``garbage`` runs the engine's full
garbage collections where the host process wants them, ``paths`` names
Hearth's cache and data folders. Called from the engine thread (``paths`` from
any thread); nothing here imports the model stack except ``memory``'s torch look-up.
"""
