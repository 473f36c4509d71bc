"""What a real-time topic costs Redis on the default settings
(realtime_history_size 10,000, realtime_history_ttl 300 s).

    python bench/realtime_memory.py              # 100,000 topics (a few minutes)
    python bench/realtime_memory.py --topics 10000 --messages 1000

One fresh Redis. Each topic gets one stream reader, registered as the
bridge registers a plain STOMP SUBSCRIBE (``+<random>`` client id, its
reader count and epoch: lua/history_readers.lua): Redis's used_memory
before and after, per *idle* topic (read, no message yet). Then every
topic gets ``--messages`` (100) messages of ``--payload`` bytes through
the workers' append (lua/history_append.lua): per *live* topic, and per
message kept, from which a topic's cost at any traffic follows (it keeps
at most realtime_history_size messages, none older than
realtime_history_ttl). The peer figure is the same count of
Gearman subscriptions (one queue subscriber per topic), which the
real-time topic replaces.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from gearhorn.config import Config  # noqa: E402
from gearhorn.rules.messages import Subscription  # noqa: E402
from gearhorn.rules.naming import stream_client_id  # noqa: E402
from gearhorn.store import redisconn  # noqa: E402
from gearhorn.store.history import History  # noqa: E402
from gearhorn.store.keys import Keys  # noqa: E402
from gearhorn.store.registry import Registry  # noqa: E402
from gearhorn.supervision import servers


def used(client) -> int:
    return int(client.info("memory")["used_memory"])


def subscribe_all(registry: Registry, topics: list[str], client_id, linger) -> None:
    for i, topic in enumerate(topics):
        registry.subscribe(Subscription(topic, client_id()), linger)
        if i % 50_000 == 49_999:
            print(f"    {i + 1:,} subscribed", flush=True)


def fill(history: History, topics: list[str], messages: int, payload: bytes) -> None:
    batch = 200  # topics per round trip
    for start in range(0, len(topics), batch):
        calls = history.calls([(topic, [(f"{topic}:{n}", payload, None)
                                        for n in range(messages)])
                               for topic in topics[start:start + batch]])
        history.direct.run_scripts(calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=100_000)
    parser.add_argument("--payload", type=int, default=100, help="bytes per message")
    parser.add_argument("--messages", type=int, default=100, help="kept per topic")
    args = parser.parse_args()
    config = Config()
    size, ttl = config.realtime_history_size, int(config.realtime_history_ttl)
    print(f"real-time topic memory: {args.topics:,} topics, realtime_history_size {size}, "
          f"realtime_history_ttl {ttl} s, {args.payload}-byte payloads", flush=True)
    server = servers.start_redis()
    try:
        client = redisconn.connect(server.details["url"])
        registry = Registry(client, Keys())
        history = History(client, Keys(), config.history_policy)
        topics = [f"rt.{i}" for i in range(args.topics)]
        gearman_topics = [f"gm.{i}" for i in range(args.topics)]

        base = used(client)
        started = time.monotonic()
        subscribe_all(registry, gearman_topics, lambda: "alice", None)
        per_gearman = (used(client) - base) / args.topics
        print(f"  peer: 1 Gearman subscriber per topic   {per_gearman:8.0f} bytes per topic",
              flush=True)

        base = used(client)
        subscribe_all(registry, topics, stream_client_id, ttl)
        idle = used(client) - base
        print(f"  1 stream reader per topic, idle        {idle / args.topics:8.0f} bytes per "
              f"topic   ({idle / 2**20:,.0f} MiB for {args.topics:,})", flush=True)

        base = used(client)
        fill(history, topics, min(size, args.messages), b"x" * args.payload)
        busy = used(client) - base
        kept = client.xlen(Keys().history(topics[0]))
        print(f"  {kept} messages kept per topic          {(idle + busy) / args.topics:8.0f} "
              f"bytes per topic   ({(idle + busy) / 2**20:,.0f} MiB for {args.topics:,}; "
              f"{busy / args.topics / kept:.0f} bytes per message kept)", flush=True)
        print(f"  redis used_memory {used(client) / 2**20:,.0f} MiB; "
              f"{time.monotonic() - started:.0f} s", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
