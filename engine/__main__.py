"""``python -m engine``: the headless entry point (see ``engine.cli``)."""

import sys

from engine.cli import main

sys.exit(main())
