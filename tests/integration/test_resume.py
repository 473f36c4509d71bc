"""Stream subscriptions on real servers: a STOMP client resumes a topic
from its last offset after a disconnect and gets exactly what it missed,
in order, then the live messages with nothing twice at the seam; from
``first`` and from a timestamp; and it is told (``x-recovered:false``)
when history cannot cover the gap: trimmed, or a wiped Redis."""

import time

import pytest
import redis

from gearhorn.client import Consumer, Producer
from gearhorn.store.keys import Keys

from .browser import browser, static_site, stomp_page, stompjs_bundle
from .helpers import bodies, offsets, publish, unique_topic, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

HISTORY = {"GEARHORN_HISTORY_TOPICS": "resume.*=1000,small.*=5,nohistory.*=0"}


@pytest.fixture
def stack(gearmand, start_pool, start_bridge):
    start_pool([gearmand], processes=2, env=HISTORY)
    bridge = start_bridge([gearmand], env=HISTORY)
    return gearmand, bridge


@pytest.mark.cluster_too
def test_a_client_resumes_from_its_last_offset_without_gap_or_duplicate(stack, stomp_clients):
    gearmand, bridge = stack
    topic = unique_topic("resume.")
    first = stomp_clients(bridge.port)
    receipt = first.subscribe(f"/topic/{topic}", "s1", **{"x-stream-offset": "next"})
    assert receipt.headers["x-recovered"] == "true"
    publish(gearmand, topic, [f"a{i}" for i in range(20)])
    got = first.messages(20, timeout=30)
    assert bodies(got) == [f"a{i}" for i in range(20)]
    assert offsets(got) == list(range(1, 21))
    epoch = got[0].headers["x-stream-epoch"]
    assert epoch and {m.headers["x-stream-epoch"] for m in got} == {epoch}
    assert all("x-recovered" not in m.headers for m in got)
    first.close()

    publish(gearmand, topic, [f"b{i}" for i in range(100)])  # while it is away
    again = stomp_clients(bridge.port)
    again.subscribe(f"/topic/{topic}", "s1", ack="client-individual", **{
        "x-stream-offset": str(offsets(got)[-1] + 1), "x-stream-epoch": epoch,
        "prefetch-count": "7"})  # a small window: it crosses the seam many times
    live = [f"c{i}" for i in range(50)]
    acked = set()
    with Producer([(gearmand.host, gearmand.port)]) as producer:
        for i, name in enumerate(live):
            producer.publish(topic, name, background=False)
            if i % 5 == 0:  # ack as it goes, so it catches up while live ones come
                ack_all(again, acked)
    publish(gearmand, topic, ["end"])
    deadline = time.monotonic() + 60
    while not any(m.body == b"end" for m in again.listener.messages):
        assert time.monotonic() < deadline, "the marker did not come"
        seen = ack_all(again, acked)
        again.wait(lambda seen=seen: len(again.listener.messages) > seen, 30, "more messages")
    resumed = again.until(b"end")
    assert bodies(resumed) == [f"b{i}" for i in range(100)] + live
    assert offsets(resumed) == list(range(21, 171))
    assert all("x-recovered" not in m.headers for m in resumed)


def ack_all(client, acked):
    """ACK every message not acked yet; how many have come."""
    messages = list(client.listener.messages)
    for m in messages:
        if m.headers["message-id"] not in acked:
            client.conn.ack(m.headers["message-id"])
            acked.add(m.headers["message-id"])
    return len(messages)


def test_from_first_and_from_a_timestamp(stack, stomp_clients):
    gearmand, bridge = stack
    topic = unique_topic("resume.")
    publish(gearmand, topic, ["old1", "old2"])
    cut = time.time() + 0.01
    wait_for(lambda: time.time() > cut + 0.01, 5, interval=0.005, message="the clock to pass")
    publish(gearmand, topic, ["new1", "new2"])
    client = stomp_clients(bridge.port)
    client.subscribe(f"/topic/{topic}", "all", **{"x-stream-offset": "first"})
    client.subscribe(f"/topic/{topic}", "since", **{"x-stream-offset": f"timestamp={cut}"})
    client.subscribe(f"/topic/{topic}", "last", **{"x-stream-offset": "last"})
    publish(gearmand, topic, ["live"])
    client.wait(lambda: sum(m.body == b"live" for m in client.listener.messages) == 3, 30,
                "the live message on all three")
    by_sub = {}
    for m in client.listener.messages:
        by_sub.setdefault(m.headers["subscription"], []).append(m.body.decode())
    assert by_sub == {"all": ["old1", "old2", "new1", "new2", "live"],
                      "since": ["new1", "new2", "live"], "last": ["new2", "live"]}


def test_trimmed_history_and_a_wiped_redis_are_not_recovered(stack, stomp_clients, redis_url):
    gearmand, bridge = stack
    topic = unique_topic("small.")  # history_topics keeps about 5 of it
    publish(gearmand, topic, [f"m{i}" for i in range(300)])
    client = stomp_clients(bridge.port)
    receipt = client.subscribe(f"/topic/{topic}", "s", **{"x-stream-offset": "2"})
    assert receipt.headers["x-recovered"] == "false"
    first = client.messages(1, timeout=30)[0]
    assert first.headers["x-recovered"] == "false" and int(first.headers["x-stream-offset"]) > 2
    epoch = first.headers["x-stream-epoch"]
    client.close()

    keys = Keys()
    redis.Redis.from_url(redis_url).delete(keys.history(topic), keys.history_meta(topic))
    publish(gearmand, topic, ["after"])
    client = stomp_clients(bridge.port)
    receipt = client.subscribe(f"/topic/{topic}", "s", **{"x-stream-offset": "301",
                                                          "x-stream-epoch": epoch})
    assert receipt.headers["x-recovered"] == "false"
    (after,) = client.messages(1, timeout=30)
    assert after.body == b"after" and after.headers["x-recovered"] == "false"
    assert after.headers["x-stream-epoch"] not in ("", epoch)
    assert after.headers["x-stream-offset"] == "1"


def test_a_live_stream_subscriber_is_told_when_the_history_is_lost(stack, stomp_clients,
                                                                   redis_url):
    gearmand, bridge = stack
    topic = unique_topic("resume.")
    client = stomp_clients(bridge.port)
    client.subscribe(f"/topic/{topic}", "s", **{"x-stream-offset": "next"})
    publish(gearmand, topic, ["one", "two"])
    got = client.messages(2, timeout=30)
    keys = Keys()
    redis.Redis.from_url(redis_url).delete(keys.history(topic), keys.history_meta(topic))
    publish(gearmand, topic, ["three"])
    (_, _, three) = client.messages(3, timeout=30)
    assert three.body == b"three" and three.headers["x-recovered"] == "false"
    assert three.headers["x-stream-offset"] == "1"
    assert three.headers["x-stream-epoch"] != got[0].headers["x-stream-epoch"]


def test_bad_resume_requests_get_a_clear_error(stack, stomp_clients):
    gearmand, bridge = stack
    for headers, says in [({"x-stream-offset": "soon"}, "invalid x-stream-offset"),
                          ({"x-stream-offset": "0"}, "invalid x-stream-offset"),
                          ({"x-stream-offset": "timestamp=x"}, "invalid x-stream-offset")]:
        client = stomp_clients(bridge.port)
        client.conn.subscribe(destination=f"/topic/{unique_topic('resume.')}", id="s",
                              headers=headers)
        client.wait(lambda c=client: c.listener.errors, 20, "an ERROR")
        assert says in error_text(client.listener.errors[0])
    client = stomp_clients(bridge.port)
    client.conn.subscribe(destination=f"/topic/{unique_topic('nohistory.')}", id="s",
                          headers={"x-stream-offset": "first"})
    client.wait(lambda: client.listener.errors, 20, "an ERROR")
    assert "keeps no history" in error_text(client.listener.errors[0])


def error_text(frame):
    return f"{frame.headers['message']} {frame.body.decode()}"


# -- a browser: the resume of docs/stomp.rst's example --------------------------------------

RESUMING_PAGE = stomp_page("gearhorn resume", """\
// The position to resume from: the last offset seen, and its epoch.
let last = null, epoch = null, connects = 0;
const client = new StompJs.Client({brokerURL: params.get("url"), reconnectDelay: 0});
client.onConnect = () => {
  const receipt = "sub" + (++connects);
  const headers = {receipt};
  // "plain": the first SUBSCRIBE has no header of gearhorn's (the defaults
  // make it a real-time reader with offsets); a resume says where from.
  if (last !== null || params.get("plain") !== "1")
    headers["x-stream-offset"] = last === null ? "next" : String(last + 1);
  if (epoch) headers["x-stream-epoch"] = epoch;
  client.watchForReceipt(receipt, () => log("ready" + connects));
  client.subscribe("/topic/" + params.get("topic"), (m) => {
    if (m.headers["x-recovered"] === "false") log("not-recovered");
    if (!("x-stream-offset" in m.headers)) log("no-offset");
    last = Number(m.headers["x-stream-offset"]);
    epoch = m.headers["x-stream-epoch"];
    log("got:" + m.body);
  }, headers);
};
client.onStompError = (f) => log("error:" + f.headers.message);
// The test's hands: cut the WebSocket (no DISCONNECT), and connect again.
window.cut = () => client.deactivate({force: true}).then(() => log("cut"));
window.resume = () => client.activate();
client.activate();
""")


@pytest.mark.parametrize("setting", ["configured", "default"])
def test_a_browser_resumes_after_its_websocket_is_cut(gearmand, start_pool, start_bridge,
                                                      tmp_path, setting):
    """``default``: no history setting, and a plain first SUBSCRIBE."""
    env = HISTORY if setting == "configured" else {}
    start_pool([gearmand], processes=2, env=env)
    bridge = start_bridge([gearmand], env=env, websocket=True)
    topic = unique_topic("resume.")
    plain = "&plain=1" if setting == "default" else ""
    before, during, after = ([f"{kind}{i}" for i in range(n)]
                             for kind, n in (("before", 10), ("during", 100), ("after", 10)))
    with static_site(tmp_path / "site", {"index.html": RESUMING_PAGE,
                                         "stomp.umd.min.js": stompjs_bundle()}) as site, \
            browser() as chromium:
        page = chromium.new_page()
        page.goto(f"{site}/index.html?url=ws://127.0.0.1:{bridge.ws_port}/ws&topic={topic}"
                  f"{plain}")
        page.wait_for_selector("#log li:text('ready1')", timeout=60_000)
        publish(gearmand, topic, before)
        page.wait_for_selector("#log li:text('got:before9')", timeout=60_000)
        page.evaluate("cut()")
        page.wait_for_selector("#log li:text('cut')", timeout=60_000)
        publish(gearmand, topic, during)  # while its WebSocket is down
        page.evaluate("resume()")
        page.wait_for_selector("#log li:text('ready2')", timeout=60_000)
        publish(gearmand, topic, after)
        page.wait_for_selector("#log li:text('got:after9')", timeout=60_000)
        lines = page.locator("#log li").all_text_contents()
    got = [line[4:] for line in lines if line.startswith("got:")]
    assert got == before + during + after, lines
    assert not [line for line in lines
                if line.startswith(("error", "not-recovered", "no-offset"))]


def test_stomp_sends_reach_stream_readers_on_every_bridge_once_and_in_order(
        gearmand, start_pool, start_bridge, stomp_clients):
    """A SEND to a topic with history is appended by the bridge itself (its
    readers there get it at once), and still fanned out to queue subscribers;
    history holds each message once."""
    start_pool([gearmand], processes=2, env=HISTORY)
    here, there = (start_bridge([gearmand], env=HISTORY) for _ in range(2))
    topic = unique_topic("resume.")
    with Producer([(gearmand.host, gearmand.port)]) as admin:
        admin.subscribe(topic, "gearman")
    readers = [stomp_clients(bridge.port) for bridge in (here, there, here, there)]
    for reader in readers[:2]:
        receipt = reader.subscribe(f"/topic/{topic}", "s", **{"x-stream-offset": "next"})
        assert receipt.headers["x-stream-offset"] == "1"
    # A plain subscription on a topic with history is a live reader from
    # next: on the producer's bridge it has each SEND before its append.
    for reader in readers[2:]:
        assert "x-stream-offset" not in reader.subscribe(f"/topic/{topic}", "s").headers
    queued = stomp_clients(there.port)
    queued.subscribe(f"/topic/{topic}", "q", durable="true")  # a queue of its own
    producer = stomp_clients(here.port)
    sent = [f"m{i}" for i in range(300)]
    for i, body in enumerate(sent):
        if i % 50 == 49:  # now and then with a receipt and a header of the sender's
            producer.send(f"/topic/{topic}", body, **{"x-n": str(i)})
        else:
            producer.conn.send(destination=f"/topic/{topic}", body=body)
    producer.send(f"/topic/{topic}", "end")
    for n, reader in enumerate(readers):
        got = reader.until(b"end")
        assert bodies(got) == sent
        if n < 2:
            assert offsets(got) == list(range(1, 301))
        else:  # live: no offset to resume from
            assert not [m for m in got if "x-stream-offset" in m.headers]
        assert [m.headers["x-n"] for m in got if "x-n" in m.headers] == [
            str(i) for i in range(49, 300, 50)]
    assert bodies(queued.until(b"end")) == sent
    with Producer([(gearmand.host, gearmand.port)]) as admin:
        with Consumer([(gearmand.host, gearmand.port)], topic, "gearman") as inbox:
            assert [inbox.get(timeout=30).decode() for _ in range(301)] == sent + ["end"]
        kept = admin.history(topic, limit=1000)
    assert [m["payload"] for m in kept["messages"]] == sent + ["end"]
    assert [m["offset"] for m in kept["messages"]] == list(range(1, 302))
