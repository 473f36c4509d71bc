"""Logging set-up shared by every gearhorn command."""

from __future__ import annotations

import logging
import os


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=level.upper(),
        format=f"%(asctime)s %(levelname)s [{os.getpid()}] %(name)s: %(message)s",
    )
    # gear logs every connect and packet at INFO/DEBUG; keep ours readable.
    logging.getLogger("gear").setLevel(max(logging.WARNING, logging.getLogger().level))
