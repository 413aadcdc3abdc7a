"""``python -m engine.bench``: the benchmarks' command line (see ``engine.bench.cli``)."""

from engine.bench.cli import main

raise SystemExit(main())
