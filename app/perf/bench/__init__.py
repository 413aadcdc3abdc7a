"""GUI benchmarks, each a command that prints JSON lines (GUI thread of its own process).

``python -m app.perf.bench.gui`` measures the longest GUI-thread stall while streaming,
opening, scrolling and switching long conversations; ``python -m app.perf.bench.panel``
measures decode speed with the performance panel open and closed;
``python -m app.perf.bench.refresh`` measures what the panel's refresh costs.
"""
