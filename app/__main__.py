"""``python -m app``: start Hearth (GUI thread)."""

from app.main import main

raise SystemExit(main())
