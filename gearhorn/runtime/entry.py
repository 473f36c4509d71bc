"""Running a gevent process (the bridge, the console) from its settings in
the environment, as ``gearhorn bridge`` and ``gearhorn web`` start them:
errors a person can act on are one line, as the command line prints them."""

from __future__ import annotations

import sys
from collections.abc import Callable

from gearhorn import config as configuration
from gearhorn import gearman
from gearhorn.config import Config
from gearhorn.errors import GearhornError
from gearhorn.runtime.logs import setup_logging


def run_patched(command: str, run: Callable[[Config], int]) -> int:
    try:
        config = configuration.load()
        setup_logging(config.log_level)
        return run(config) or 0
    except GearhornError as exc:
        print(f"gearhorn {command}: {exc}", file=sys.stderr)
        return exc.exit_code
    except gearman.GearmanError as exc:  # written for a person too, not a GearhornError
        print(f"gearhorn {command}: {exc}", file=sys.stderr)
        return 1
