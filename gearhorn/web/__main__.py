"""``python -m gearhorn.web``: gevent patches the standard library first."""

from gevent import monkey

monkey.patch_all()

import sys  # noqa: E402

from gearhorn.cli import main  # noqa: E402

sys.exit(main(["web", *sys.argv[1:]]))
