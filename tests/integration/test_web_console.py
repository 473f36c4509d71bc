"""The live console in real headless Chromium, on a real pool, bridge and gearmand."""

from __future__ import annotations

import json
import re
import time

import pytest
import redis

from gearhorn.store.keys import Keys

from .browser import browser
from .helpers import GearClient, gearman_cli, unique_topic, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

WAIT_MS = 60_000


def test_the_console_follows_subscriptions_and_requeues_a_dead_letter(
        gearmand, start_pool, start_bridge, start_web, stomp_clients, gearman_cli_tool,
        redis_url):
    start_pool([gearmand], processes=1)
    bridge = start_bridge([gearmand])
    web = start_web([gearmand])
    topic, queue = unique_topic(), unique_topic("q")
    client = GearClient(gearmand)
    for client_id in ("a", "b", "c"):
        client.call("subscribe_fanout", {"topic": topic, "client_id": client_id})

    with browser() as chromium:
        page = chromium.new_page()
        errors = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(web.url + "/")
        subscribers = page.locator(f'tr[data-topic="{topic}"] td.subscribers')
        subscribers.filter(has_text="3").wait_for(timeout=WAIT_MS)
        loaded = page.evaluate("performance.timeOrigin")

        # A subscription made with the gearman command-line tool shows up by itself.
        out = gearman_cli(gearmand, "-f", "subscribe_fanout",
                          json.dumps({"topic": topic, "client_id": "d"}))
        assert json.loads(out.stdout)["subscribers"] == 4
        subscribers.filter(has_text="4").wait_for(timeout=WAIT_MS)

        # A topic's name shows who is subscribed, and where.
        page.locator(f'tr[data-topic="{topic}"] button.link').click()
        page.locator("#presence h3").filter(has_text=f"{topic}: 4 subscribers").wait_for(
            timeout=WAIT_MS)
        assert page.locator("#presence tr[data-client]").count() == 4
        assert page.locator('#presence tr[data-client="d"] td.via').text_content() == "gearman"

        # Their backlogs, which nobody reads, are marked, with the oldest
        # copy's age and the limits.
        client.call("fanout", {"topic": topic, "payloads": ["1", "2", "3"], "background": True})
        backlog = page.locator(f'tr.unread[data-backlog="{topic}_a"]')
        backlog.locator("td.queued").filter(has_text="3").wait_for(timeout=WAIT_MS)
        assert "(no consumer)" in backlog.locator("td").first.text_content()
        assert "max_length=10000" in backlog.locator("td.limits").text_content()
        # The age comes from the tally, which a worker writes once gearmand
        # has the copies: a round of the warden may see the depth first.
        backlog.locator("td.oldest").filter(has_text=re.compile(r"^\d+ s$")).wait_for(
            timeout=WAIT_MS)

        # A message NACKed five times is dead-lettered and appears in the page.
        consumer = stomp_clients(bridge.port)
        consumer.subscribe(f"/queue/{queue}", "1", ack="client-individual")
        stomp_clients(bridge.port).send(f"/queue/{queue}", b"poison")
        for n in range(1, 6):
            consumer.conn.nack(consumer.messages(n)[-1].headers["ack"])
        row = page.locator(f'tr[data-dlq="{queue}"]')
        row.locator("td.queued").filter(has_text="1").wait_for(timeout=WAIT_MS)

        # Requeued from the page, behind a confirmation, it reaches the consumer again.
        row.locator("button.requeue").click()
        page.locator("#confirm-ok").click()
        page.locator(".action-result").filter(has_text="requeue: 1").wait_for(timeout=WAIT_MS)
        again = consumer.messages(6)[-1]
        assert again.body == b"poison" and again.headers["delivery-count"] == "1"
        consumer.conn.ack(again.headers["ack"])
        row.locator("td.queued").filter(has_text="0").wait_for(timeout=WAIT_MS)

        # The last reconciliation's verdict, as gearhorn report leaves it.
        assert page.locator("#report").text_content().startswith("no report yet")
        redis.Redis.from_url(redis_url).set(Keys().last_report, json.dumps({
            "events": 1200, "malformed": 0, "reconciliation": {"never_delivered": 2},
            "report": "/srv/report/report.html", "finished": time.time()}))
        page.locator("#report .verdict-bad").filter(has_text="2 problems").wait_for(
            timeout=WAIT_MS)

        assert page.evaluate("performance.timeOrigin") == loaded  # never reloaded
        assert page.locator("#link").text_content() == "live"
        assert errors == []
    client.close()


def test_the_console_refuses_a_requeue_when_cancelled(gearmand, start_pool, start_bridge,
                                                      start_web, stomp_clients):
    start_pool([gearmand], processes=1)
    bridge = start_bridge([gearmand])
    web = start_web([gearmand])
    queue = unique_topic("q")
    consumer = stomp_clients(bridge.port)
    consumer.subscribe(f"/queue/{queue}", "1", ack="client-individual")
    stomp_clients(bridge.port).send(f"/queue/{queue}", b"kept")
    for n in range(1, 6):
        consumer.conn.nack(consumer.messages(n)[-1].headers["ack"])
    with browser() as chromium:
        page = chromium.new_page()
        page.goto(web.url + "/")
        row = page.locator(f'tr[data-dlq="{queue}"]')
        row.locator("td.queued").filter(has_text="1").wait_for(timeout=WAIT_MS)
        row.locator("button.purge").click()
        page.locator("#confirm").wait_for(state="visible", timeout=WAIT_MS)
        page.locator("#confirm-cancel").click()
        # Two more snapshots later, the dead letter is still there: nothing was sent.
        updated = page.locator("#updated")
        for _ in range(2):
            shown = updated.text_content()
            wait_for(lambda shown=shown: updated.text_content() != shown, timeout=60,
                     message="a snapshot")
        assert row.locator("td.queued").text_content() == "1"
        assert web.json(f"/api/dlq?queue={queue}")[1]["queued"] == 1
        assert page.locator(".action-result").count() == 0
