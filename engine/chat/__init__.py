"""Turning a conversation into tokens and tokens back into text (engine thread).

``chat_template`` renders messages in a Jinja sandbox, ``prompt`` fits them into
the context window, ``generation`` holds one reply's sampler, detokenizer and stop
conditions (and feeds a conversation's cache), ``sampling`` picks each token, ``detokenize`` emits text only up to a
safe boundary and holds back stop strings, and ``cache_store`` keeps the KV caches
of recent conversations under a memory budget; ``speculative`` sizes and counts the drafts
the batch runner verifies, from the conversation itself or from a draft model (a
``DraftSource``). No module here knows how a
forward pass is computed: they see the ``Backend`` protocol of ``engine.forward``.
"""
