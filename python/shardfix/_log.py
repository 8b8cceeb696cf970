"""The `shardfix` logger. As a library, shardfix adds only a NullHandler: what is shown, and where, is the
application's choice (`logging.basicConfig(level=logging.INFO)` shows each pass's time and what it changed; DEBUG
adds why a ring was left alone). Kept out of `shardfix/__init__` so that `import shardfix` stays cheap."""

from __future__ import annotations

import logging

logger = logging.getLogger("shardfix")
if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
    logger.addHandler(logging.NullHandler())
