"""``python -m gearhorn.stomp``: the bridge, its settings from the
environment (``gearhorn bridge`` starts it so, config.to_env).

gevent must patch the standard library before anything else imports it.
"""

from gevent import monkey

monkey.patch_all()

import sys  # noqa: E402

from gearhorn.runtime.entry import run_patched  # noqa: E402
from gearhorn.stomp.app import run_bridge  # noqa: E402

sys.exit(run_patched("bridge", run_bridge))
