"""MCP tools for the chat: the user's tool servers, their tools, and calls to them (GUI thread, qasync loop).

``hub.ToolHub`` is what the chat uses: it connects lazily to every enabled server of
Settings › Tools, lists their tools as ``ToolSpec``s, calls them with a timeout and
remembers "always allow". ``link`` holds one connection through the ``mcp`` SDK and
hands back ``results``; ``naming`` makes the function names the model sees;
``tools_page`` and ``server_dialog`` are Settings › Tools. Everything here runs on the
GUI thread as coroutines of the qasync loop and never blocks it.
"""
