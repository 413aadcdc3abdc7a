"""The OpenAI-compatible HTTP API, in two subpackages that share nothing but the protocol.

``server`` is Hearth's own server (its own thread and asyncio loop); ``remote`` is the
client of remote engines (run by its own engine thread). Nothing here imports torch or Qt.
"""
