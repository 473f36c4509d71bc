"""``python -m gearhorn.stomp``: the bridge's entry point.

gevent must patch the standard library before anything else imports it.
"""

from gevent import monkey

monkey.patch_all()

import sys  # noqa: E402

from gearhorn.cli import main  # noqa: E402

sys.exit(main(["bridge", *sys.argv[1:]]))
