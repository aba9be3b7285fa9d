"""``python -m app.cli``: the ``adattr`` command."""

from __future__ import annotations

import sys

from app.cli.entry import main

sys.exit(main())
