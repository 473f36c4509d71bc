"""``python -m gearhorn.web``: the console and metrics, settings from the
environment (``gearhorn web`` starts it so); gevent patches first."""

from gevent import monkey

monkey.patch_all()

import sys  # noqa: E402

from gearhorn.runtime.entry import run_patched  # noqa: E402
from gearhorn.web.app import run_web  # noqa: E402

sys.exit(run_patched("web", run_web))
