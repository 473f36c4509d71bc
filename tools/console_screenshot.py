"""Make docs/console.png: a small live deployment on free loopback ports, some
traffic, a dead letter, and the console in headless Chromium.

    .venv/bin/python tools/console_screenshot.py docs/console.png
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import redis  # noqa: E402
import stomp  # noqa: E402

from gearhorn import gearman  # noqa: E402
from gearhorn.runtime.children import die_with_parent
from gearhorn.store.keys import Keys  # noqa: E402
from gearhorn.store.registry import Registry  # noqa: E402
from gearhorn.supervision import servers


def spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gearhorn", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=die_with_parent)


def wait(predicate, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)


def main(out: str) -> None:
    red, gm = servers.start_redis(), servers.start_gearmand()
    url, stomp_port, web_port = red.details["url"], servers.free_port(), servers.free_port()
    common = ["--redis-url", url, "--gearman", gm.address]
    children = [spawn("worker", "--processes", "2", *common),
                spawn("bridge", "--port", str(stomp_port), "--ws-port", "0", *common),
                spawn("web", "--port", str(web_port), *common)]
    registry = Registry(redis.Redis.from_url(url), Keys())
    try:
        wait(lambda: len(registry.live_workers()) == 2, "workers")
        wait(lambda: servers.is_listening("127.0.0.1", stomp_port), "the bridge")
        wait(lambda: servers.is_listening("127.0.0.1", web_port), "gearhorn web")
        client = gearman.Client([(gm.host, gm.port)])
        for topic, width in (("prices.eur", 40), ("prices.usd", 25), ("news", 3), ("alerts", 8)):
            for i in range(width):
                client.call("subscribe_fanout", json.dumps(
                    {"topic": topic, "client_id": f"c{i}"}).encode())
        conn = stomp.Connection12([("127.0.0.1", stomp_port)])
        conn.set_listener("nack", Refuser(conn))
        conn.connect(wait=True)
        conn.subscribe("/queue/orders", id="1", ack="client-individual")
        conn.send("/queue/orders", "malformed order #1182")
        traffic(client, seconds=90)
        background = threading.Thread(target=traffic, args=(client, 30), daemon=True)
        background.start()  # still flowing when the picture is taken
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium",
                                        args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1280, "height": 1100})
            page.goto(f"http://127.0.0.1:{web_port}/")
            page.locator('tr[data-topic="prices.eur"]').wait_for()
            time.sleep(3)  # a few seconds of chart
            page.screenshot(path=out, full_page=True)
            browser.close()
        background.join()
        conn.disconnect()
    finally:
        for child in children:
            child.send_signal(signal.SIGTERM)
            child.wait(30)
        gm.stop()
        red.stop()


class Refuser(stomp.ConnectionListener):
    """NACKs everything: after 5 deliveries the bridge dead-letters it."""

    def __init__(self, conn: stomp.Connection) -> None:
        self.conn = conn

    def on_message(self, frame) -> None:
        self.conn.nack(frame.headers["ack"])


def traffic(client: gearman.Client, seconds: float) -> None:
    """Uneven traffic, so the charts have a shape; the NACKs make a dead letter."""
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
        for topic, every in (("prices.eur", 1), ("prices.usd", 2), ("news", 7), ("alerts", 13)):
            if n % every == 0:
                client.call("fanout", json.dumps({"topic": topic, "payload": f"tick {n}",
                                                  "background": True}).encode())
        time.sleep(0.02 if (n // 100) % 2 else 0.05)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "docs/console.png")
