"""Headless Chromium (Debian's) driven by Playwright for Python."""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil

from tests.needs import missing, require_binary, require_module

JS_DIR = os.path.join(os.path.dirname(__file__), "..", "js")

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]


def chromium():
    """The system browser's path; a skip on a laptop without it, a failure in CI."""
    path = shutil.which("chromium")
    if path is None:
        missing("chromium is not installed: run tools/ensure-env --test")
    require_module("playwright")
    return path


def stomp_page(title, script):
    """A page with stompjs's bundle, a ``log(text)`` that adds a line to
    ``#log`` and the URL's query in ``params``, then ``script``."""
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{title}</title>
<script src="stomp.umd.min.js"></script></head>
<body><ul id="log"></ul>
<script>
const params = new URLSearchParams(location.search);
const log = (text) => {{
  const li = document.createElement("li"); li.textContent = text;
  document.getElementById("log").appendChild(li);
}};
{script}</script></body></html>
"""


@contextlib.contextmanager
def browser():
    from playwright.sync_api import sync_playwright

    executable = chromium()
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


@contextlib.contextmanager
def static_site(folder, files):
    """Serve ``files`` ({name: text, or a path to copy}) from ``folder`` on a
    loopback port; yields the site's base URL."""
    import http.server
    import pathlib
    import threading

    folder = pathlib.Path(folder)
    folder.mkdir(exist_ok=True)
    for name, content in files.items():
        if isinstance(content, pathlib.Path):
            shutil.copy(content, folder / name)
        else:
            (folder / name).write_text(content)

    def handler(*args):
        return http.server.SimpleHTTPRequestHandler(*args, directory=str(folder))

    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{web.server_address[1]}"
    finally:
        web.shutdown()
        web.server_close()


def node_modules():
    """tests/js/node_modules (tools/ensure-env --test runs npm ci there)."""
    require_binary("node", "nodejs")
    folder = os.path.join(JS_DIR, "node_modules", "@stomp", "stompjs")
    if not os.path.isdir(folder):
        missing("tests/js/node_modules is missing: run tools/ensure-env --test")
    return os.path.join(JS_DIR, "node_modules")


def stompjs_bundle():
    return pathlib.Path(node_modules(), "@stomp", "stompjs", "bundles", "stomp.umd.min.js")
