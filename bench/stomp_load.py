"""The STOMP bridge at its limit, against RabbitMQ, with a load generator
that is not the bottleneck.

    python bench/stomp_load.py                 # full run (a few minutes)
    python bench/stomp_load.py --quick         # smaller
    python bench/stomp_load.py --bridge-processes 2
    python bench/stomp_load.py --latency-at 100 500 1000   # same rates for both
    python bench/stomp_load.py --latency-at 100 1000 --turns 5 --stream --websocket
    python bench/stomp_load.py --latency-at 100 1000 --turns 5 --live
    python bench/stomp_load.py --quick --live --turns 3     # throughput, median ratios
    python bench/stomp_load.py --latency-at 1000 --broker-cpus 0 --client-cpus 1

bench/stomp_bridge.py drives both brokers with stomp.py, which parses every
frame in Python: there the client is the limit. Here the generator speaks
raw STOMP. Producers write prepared SEND frames in large batches (TCP
back-pressure paces them); subscribers only count frame terminators in
what they read (``bytes.count``, in C); a queue consumer acknowledges
cumulatively (``ack:client``) once per read, naming the last message in
it. Each runs in processes of its own. Measured, for each broker, in one
run with the same generator:

- topic deliveries/s with 10 and 100 subscribers (1 producer);
- queue send+ack msg/s (2 producers, 2 consumers);
- p50/p99 latency of topic deliveries (10 subscribers) at half of the peak
  rate just measured: producers pace themselves, every body carries its
  send time, and subscribers parse each frame.

Servers are started on free loopback ports and stopped at the end (see
bench/stomp_bridge.py for RabbitMQ's private node). The bridge's CPU use
is sampled too, so a run says whether the bridge or the machine was full.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import statistics
import sys
import time
from queue import Empty

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.fanout_shape import describe, fanout_shape  # noqa: E402
from bench.stomp_bridge import Gearhorn, RabbitMQ, percentile  # noqa: E402

BATCH = 200  # SEND frames per write


# -- raw STOMP ------------------------------------------------------------------------


def websocket() -> bool:
    """STOMP over WebSocket (``--websocket``; an environment variable, so
    that the spawned processes know too)."""
    return os.environ.get("STOMP_LOAD_WEBSOCKET") == "1"


def port_of(broker) -> int:
    return broker.ws_port if websocket() else broker.port


def connect(port: int, login: dict):
    sock = socket.create_connection(("127.0.0.1", port), timeout=120)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if websocket():
        sock = WsSocket(sock)
    headers = {"accept-version": "1.2", "host": login.get("vhost", "/"),
               "heart-beat": "0,0"}
    if "username" in login:
        headers.update(login=login["username"], passcode=login["passcode"])
    sock.sendall(frame("CONNECT", headers))
    reply = read_until(sock, b"\0")
    if not reply.startswith(b"CONNECTED"):
        raise SystemExit(f"CONNECT refused: {reply[:200]!r}")
    return sock


class WsSocket:
    """A WebSocket with the calls these processes make of a socket. Each
    STOMP frame sent is a text message of its own (masked with the key 0:
    the XOR costs nothing); ``recv`` returns the payloads of the messages read."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        sock.sendall(b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                     b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                     b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: v12.stomp\r\n\r\n")
        reply = b""
        while b"\r\n\r\n" not in reply:
            chunk = sock.recv(4096)
            if not chunk:
                raise SystemExit("WebSocket upgrade refused: connection closed")
            reply += chunk
        head, _, self.buf = reply.partition(b"\r\n\r\n")
        self.closing = False  # a close frame came: after what came before it, EOF
        if not head.startswith(b"HTTP/1.1 101"):
            raise SystemExit(f"WebSocket upgrade refused: {head[:200]!r}")

    def fileno(self) -> int:
        return self.sock.fileno()

    def settimeout(self, seconds: float) -> None:
        self.sock.settimeout(seconds)

    def sendall(self, data: bytes) -> None:
        out = []
        for frame_bytes in data.split(b"\0")[:-1]:
            payload = frame_bytes + b"\0"
            n = len(payload)
            size = (bytes([0x80 | n]) if n < 126 else
                    bytes([0x80 | 126]) + n.to_bytes(2, "big") if n < 65536 else
                    bytes([0x80 | 127]) + n.to_bytes(8, "big"))
            out += [b"\x81", size, b"\0\0\0\0", payload]
        self.sock.sendall(b"".join(out))

    def recv(self, size: int) -> bytes:
        while True:
            payloads = self._messages()
            if payloads or self.closing:
                return payloads
            chunk = self.sock.recv(size)
            if not chunk:
                return b""
            self.buf += chunk

    def _messages(self) -> bytes:
        """The payloads of the whole messages buffered (the server's are unmasked)."""
        buf, at, out = self.buf, 0, []
        while len(buf) - at >= 2 and not self.closing:
            opcode, n, head = buf[at] & 0x0F, buf[at + 1] & 0x7F, 2
            if n >= 126:
                head += 2 if n == 126 else 8
                if len(buf) - at < head:
                    break
                n = int.from_bytes(buf[at + 2:at + head], "big")
            if len(buf) - at < head + n:
                break
            self.closing = opcode == 0x8
            if opcode in (0x0, 0x1, 0x2):
                out.append(buf[at + head:at + head + n])
            at += head + n
        self.buf = buf[at:]
        return b"".join(out)


def frame(command: str, headers: dict, body: bytes = b"") -> bytes:
    lines = [command] + [f"{k}:{v}" for k, v in headers.items()]
    return ("\n".join(lines) + "\n\n").encode() + body + b"\0"


def read_until(sock: socket.socket, marker: bytes) -> bytes:
    data = b""
    while marker not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise SystemExit(f"connection closed: {data[:200]!r}")
        data += chunk
    return data


def with_receipt(sock: socket.socket, command: str, headers: dict) -> None:
    sock.sendall(frame(command, {**headers, "receipt": "r"}))
    read_until(sock, b"receipt-id:r")


# -- processes -------------------------------------------------------------------------


RECOVERED_FALSE = b"x-recovered:false"
SPLIT = len(RECOVERED_FALSE) - 1  # the most of it one read can end with


def subscriber(port, login, destination, connections, expected, timed, ready, results,
               extra=None):
    """``connections`` subscriptions (with the SUBSCRIBE headers ``extra``);
    counts MESSAGE frames until each has ``expected``; with ``timed``, every
    delivery's arrival (bench/fanout_shape.py): its latency twice, when this
    process has read it, and when it woke up to read it (the first takes in
    the time this process spent reading its other sockets ready at the same
    wake-up: its own queueing)."""
    pin_client()
    socks = []
    for i in range(connections):
        sock = connect(port, login)
        with_receipt(sock, "SUBSCRIBE", {"destination": destination, "id": str(i),
                                         "ack": "auto", "prefetch-count": "1000",
                                         **(extra or {})})
        socks.append(sock)
    ready.put(1)
    import selectors
    selector = selectors.DefaultSelector()
    counts, tails, ends, arrivals = {}, {}, {}, []
    for n, sock in enumerate(socks):
        selector.register(sock, selectors.EVENT_READ, n)
        counts[sock], tails[sock], ends[sock] = 0, b"", b""
    left = len(socks)
    last = time.time()
    while left:
        ready = selector.select(timeout=120)
        woke = time.time()
        for key, _ in ready:
            sock = key.fileobj
            data = sock.recv(1 << 20)
            if not data:
                raise SystemExit("a subscriber was disconnected")
            # Told it skipped messages, it would wait for them forever. The
            # header may be split across two reads: the last read's end too.
            if RECOVERED_FALSE in data or RECOVERED_FALSE in ends[sock] + data[:SPLIT]:
                raise SystemExit("a subscriber skipped messages its topic's history no longer "
                                 "had (x-recovered:false): LOAD_HISTORY is too small")
            ends[sock] = data[-SPLIT:]
            counts[sock] += data.count(b"\0")
            if timed:
                now = time.time()
                frames = (tails[sock] + data).split(b"\0")
                tails[sock] = frames.pop()
                sent = [float(f[f.index(b"\n\n") + 2:]) for f in frames if f.strip()]
                arrivals += [(t, key.data, now - t, woke - t) for t in sent]
            if counts[sock] >= expected:
                selector.unregister(sock)
                left -= 1
            last = time.time()
    results.put((sum(counts.values()), last, arrivals))


def producer(port, login, destination, messages, rate, start, results):
    """``messages`` SENDs in batches; paced to ``rate`` msg/s when given
    (bodies then carry their send time), as fast as TCP takes them when not."""
    pin_client()
    sock = connect(port, login)
    head = f"SEND\ndestination:{destination}\n\n".encode()
    static = b"".join(head + b"x" * 16 + b"\0" for _ in range(BATCH))
    start.wait()
    began = time.time()
    sent = 0
    # Paced: about a millisecond's worth per write, so that a batch does not
    # queue behind itself and the latency is the brokers', not the batch's.
    batch = max(1, int(rate / 1000)) if rate else BATCH
    while sent < messages:
        n = min(batch, messages - sent)
        if rate:
            due = began + sent / rate
            while (wait := due - time.time()) > 0:
                time.sleep(wait)
            now = repr(time.time()).encode()
            sock.sendall(b"".join(head + now + b"\0" for _ in range(n)))
        else:
            sock.sendall(static if n == BATCH else static[:len(static) // BATCH * n])
        sent += n
    # A receipt says every frame before it was taken (RabbitMQ's web-stomp
    # closes on DISCONNECT without its RECEIPT, so a BEGIN's).
    with_receipt(sock, "BEGIN", {"transaction": "done"})
    sock.sendall(frame("DISCONNECT", {}))
    results.put(began)


def queue_consumer(port, login, queue, expected, total, ready, results):
    """``ack:client``: one cumulative ACK per read, for the last message in
    it. Consumers count together (``total``, shared): a broker need not
    split a queue evenly between them."""
    pin_client()
    sock = connect(port, login)
    with_receipt(sock, "SUBSCRIBE", {"destination": f"/queue/{queue}", "id": "q",
                                     "ack": "client", "prefetch-count": "1000"})
    sock.settimeout(0.2)
    ready.put(1)
    got, tail, last = 0, b"", time.time()
    while total.value < expected:
        try:
            data = sock.recv(1 << 20)
        except TimeoutError:
            continue
        if not data:
            raise SystemExit("the queue consumer was disconnected")
        n = data.count(b"\0")
        got += n
        with total.get_lock():
            total.value += n
        last = time.time()
        text = tail + data
        end = text.rfind(b"\0")
        tail = text[end + 1:]
        at = text.rfind(b"\nack:", 0, end)
        if at >= 0:
            ack_id = text[at + 5:text.index(b"\n", at + 5)]
            sock.sendall(b"ACK\nid:" + ack_id + b"\n\n\0")
    results.put((got, last))


# -- runs --------------------------------------------------------------------------------


def results_of(processes: list, results, timeout: float = 600.0) -> list:
    """One result from each of ``processes``; stops the run as soon as one
    of them has failed (it says why on stderr), not after ``timeout``."""
    got, deadline = [], time.monotonic() + timeout
    while len(got) < len(processes):
        try:
            got.append(results.get(timeout=1))
        except Empty:
            if any(p.exitcode not in (None, 0) for p in processes):
                raise SystemExit("a client process failed (above): run stopped") from None
            if time.monotonic() > deadline:
                raise SystemExit(f"no result from the clients in {timeout:g}s") from None
    return got


def processes_for(subscribers: int) -> int:
    return min(subscribers, 4)


def topic_run(broker, subscribers: int, messages: int, rate: float = 0.0,
              producers: int = 1) -> dict:
    ctx = multiprocessing.get_context("spawn")
    ready, results, start, sent = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Queue()
    destination = f"/topic/load{os.getpid()}x{subscribers}x{int(rate)}"
    nproc = processes_for(subscribers)
    per = [subscribers // nproc + (i < subscribers % nproc) for i in range(nproc)]
    extra = getattr(broker, "subscribe_headers", None)
    subs = [ctx.Process(target=subscriber, args=(port_of(broker), broker.login, destination, n,
                                                  messages, bool(rate), ready, results, extra))
            for n in per]
    for p in subs:
        p.start()
    results_of(subs, ready, timeout=120)
    prods = [ctx.Process(target=producer, args=(port_of(broker), broker.login, destination,
                                                 messages // producers,
                                                 rate / producers, start, sent))
             for _ in range(producers)]
    for p in prods:
        p.start()
    time.sleep(1)  # every producer connected and waiting
    cpu_before = broker.cpu_seconds()
    start.set()
    began = min(results_of(prods, sent))
    got = results_of(subs, results)
    cpu = broker.cpu_seconds() - cpu_before
    for p in subs + prods:
        p.join(30)
    delivered = sum(n for n, _, _ in got)
    elapsed = max(last for _, last, _ in got) - began
    # Each delivery as (sent, process, socket, read latency, latency at wake-up)
    arrivals = [(sent, process, *rest) for process, (_, _, mine) in enumerate(got)
                for sent, *rest in mine]
    latencies = [read for _, _, _, read, _ in arrivals]
    at_wake = [woke for _, _, _, _, woke in arrivals]
    result = {"deliveries": delivered, "rate": delivered / elapsed,
              "broker_cpu": cpu / elapsed}
    if latencies:
        # Every latency kept (ms): turns pooled measure a p99 finer than any one turn.
        result["latencies_ms"] = [lat * 1000 for lat in latencies]
        result["arrivals"] = arrivals
        result.update(p50_ms=percentile(latencies, 0.5) * 1000,
                      p99_ms=percentile(latencies, 0.99) * 1000,
                      wake_p50_ms=percentile(at_wake, 0.5) * 1000,
                      wake_p99_ms=percentile(at_wake, 0.99) * 1000)
    return result


def queue_run(broker, messages: int, pairs: int = 2) -> dict:
    ctx = multiprocessing.get_context("spawn")
    ready, results, start, sent = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Queue()
    queue = f"load{os.getpid()}q"
    per = messages // pairs
    total = ctx.Value("q", 0)
    consumers = [ctx.Process(target=queue_consumer, args=(port_of(broker), broker.login, queue,
                                                           per * pairs, total, ready, results))
                 for _ in range(pairs)]
    for p in consumers:
        p.start()
    results_of(consumers, ready, timeout=120)
    prods = [ctx.Process(target=producer, args=(port_of(broker), broker.login, f"/queue/{queue}",
                                                 per, 0.0, start, sent))
             for _ in range(pairs)]
    for p in prods:
        p.start()
    time.sleep(1)
    cpu_before = broker.cpu_seconds()
    start.set()
    began = min(results_of(prods, sent))
    got = results_of(consumers, results)
    cpu = broker.cpu_seconds() - cpu_before
    for p in consumers + prods:
        p.join(30)
    elapsed = max(t for n, t in got if n) - began
    total = sum(n for n, _ in got)
    return {"messages": total, "rate": total / elapsed, "broker_cpu": cpu / elapsed}


def gearhorn_options(broker_cls, args) -> dict:
    return {"bridge_processes": args.bridge_processes} if broker_cls is Gearhorn else {}


# Messages of history kept per load topic: more than a run sends (100,000 to
# topic x10 without --quick). A live or stream subscriber that falls behind
# catches up from history, and one further behind than history reaches is
# told x-recovered:false and skips what was trimmed (docs/stomp.rst): with
# 10,000, a subscriber of a throughput run that fell 10,000 messages behind
# lost some, and the run waited for them in vain. RabbitMQ's queues are
# unbounded here too (and gearhorn's, bench/stomp_bridge.py).
LOAD_HISTORY = "load*=200000"


def stream_subscriptions() -> None:
    """Subscribers read the topics' history (x-stream-offset: next, docs/stomp.rst)
    instead of a queue each: history is kept for the load topics."""
    os.environ["GEARHORN_HISTORY_TOPICS"] = LOAD_HISTORY
    Gearhorn.subscribe_headers = {"x-stream-offset": "next"}


def live_subscriptions() -> None:
    """Plain subscriptions to topics with history (docs/stomp.rst): live
    readers, given their bridge's SENDs before the append; the same
    SUBSCRIBE as RabbitMQ's."""
    os.environ["GEARHORN_HISTORY_TOPICS"] = LOAD_HISTORY


def client_options(parser: argparse.ArgumentParser) -> None:
    """How gearhorn's subscribers subscribe, and over what (also bench/ab.py's)."""
    parser.add_argument("--stream", action="store_true",
                        help="gearhorn's subscribers are stream subscriptions")
    parser.add_argument("--live", action="store_true",
                        help="gearhorn's topics keep a history: plain subscribers are live "
                             "readers")
    parser.add_argument("--websocket", action="store_true",
                        help="every client speaks STOMP over WebSocket (ws://.../ws)")
    parser.add_argument("--broker-cpus", type=cpu_list, metavar="LIST",
                        help="run the brokers on these CPUs only (e.g. 0 or 0,1)")
    parser.add_argument("--client-cpus", type=cpu_list, metavar="LIST",
                        help="run the load generator's clients on these CPUs only")


def use_client_options(args: argparse.Namespace) -> None:
    if args.stream:
        stream_subscriptions()
    if args.live:
        live_subscriptions()
    if not (args.stream or args.live):
        # The defaults: plain subscribers read the real-time topics' history
        # (docs/stomp.rst); as deep as a run sends, for the reason above.
        os.environ.setdefault("GEARHORN_REALTIME_HISTORY_SIZE", LOAD_HISTORY.split("=")[1])
    if args.websocket:  # the spawned processes read it too
        os.environ["STOMP_LOAD_WEBSOCKET"] = "1"
    if args.broker_cpus:  # the brokers this process starts inherit it
        os.sched_setaffinity(0, args.broker_cpus)
    if args.client_cpus:
        os.environ["STOMP_LOAD_CLIENT_CPUS"] = ",".join(map(str, sorted(args.client_cpus)))


def cpu_list(text: str) -> set[int]:
    """``0,2`` -> {0, 2}."""
    return {int(cpu) for cpu in text.split(",")}


def pin_client() -> None:
    """A client process on --client-cpus, if given: apart from the brokers
    (--broker-cpus), neither takes the other's cores."""
    if cpus := os.environ.get("STOMP_LOAD_CLIENT_CPUS"):
        os.sched_setaffinity(0, cpu_list(cpus))


def measure(broker_cls, args) -> dict:
    with broker_cls(**gearhorn_options(broker_cls, args)) as broker:
        topic_run(broker, 10, args.messages // 10)  # warm up
        results = {}
        for subscribers in (10, 100):
            results[f"topic{subscribers}"] = topic_run(
                broker, subscribers, args.messages * 10 // subscribers)
        results["queue"] = queue_run(broker, args.messages)
        half = results["topic10"]["rate"] / 10 / 2  # messages/s at half the peak
        results["latency"] = topic_run(broker, 10, int(half * args.latency_seconds), rate=half)
    show(broker_cls.name, results)
    return results


def latency_at(brokers: list, args) -> dict[str, dict[int, dict]]:
    """p50/p99 of topic deliveries (``args.subscribers`` subscribers) at each
    of ``args.latency_at`` msg/s: the same absolute load for every broker
    (half of each one's own peak is a different rate for each).
    ``args.turns`` turns of every rate, and their medians: single turns on
    a loaded 2-core box swing by 2-5x. The brokers take turns, each started
    afresh for its turn, so a slow minute of the machine falls on both."""
    turns = {cls.name: {rate: [] for rate in args.latency_at} for cls in brokers}
    for turn in range(args.turns):
        for broker_cls in brokers:
            with broker_cls(**gearhorn_options(broker_cls, args)) as broker:
                topic_run(broker, 10, args.messages // 10)  # warm up
                for rate in args.latency_at:
                    r = topic_run(broker, args.subscribers, int(rate * args.latency_seconds),
                                  rate=rate)
                    turns[broker_cls.name][rate].append(r)
                    print(f"  {broker_cls.name:9} turn {turn + 1} topic x{args.subscribers} at "
                          f"{rate:>6,} msg/s: {_latencies(r)}  "
                          f"(cpu {r['broker_cpu']:.2f})", flush=True)
    results: dict[str, dict[int, dict]] = {}
    for name, by_rate in turns.items():
        for rate, runs in by_rate.items():
            median = {key: statistics.median(r[key] for r in runs)
                      for key in ("p50_ms", "p99_ms", "wake_p50_ms", "wake_p99_ms",
                                  "broker_cpu")}
            results.setdefault(name, {})[rate] = median
            print(f"  {name:9} median of {len(runs)}, topic x{args.subscribers} at "
                  f"{rate:>6,} msg/s: {_latencies(median)}", flush=True)
            print(f"  {name:9} all {len(runs)} turns pooled: {pooled(runs)}", flush=True)
            shape = fanout_shape(a for r in runs for a in r["arrivals"])
            print(f"  {name:9} fan-out, pooled: {describe(shape)}", flush=True)
    return results


def pooled(runs: list[dict]) -> str:
    """p50 and p99 of every delivery of ``runs`` together, to a hundredth
    of a ms: a turn's p99 rests on a few dozen deliveries, five turns'
    on five times as many."""
    every = [lat for r in runs for lat in r["latencies_ms"]]
    return (f"p50 {percentile(every, 0.5):.2f} ms  p99 {percentile(every, 0.99):.2f} ms  "
            f"({len(every):,} deliveries)")


def _latencies(r: dict) -> str:
    """p50 and p99 when read, and when the subscriber woke up to read."""
    return (f"p50 {r['p50_ms']:6.2f} ms  p99 {r['p99_ms']:6.2f} ms  "
            f"(at wake-up p50 {r['wake_p50_ms']:5.2f}  p99 {r['wake_p99_ms']:5.2f})")


def profile(args) -> None:
    """py-spy on the bridge process(es) during a topic run to ``--subscribers``
    (10): where its time goes (collapsed stacks to ``args.profile``, the top
    frames printed)."""
    import subprocess
    from collections import Counter

    spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
    with Gearhorn(bridge_processes=args.bridge_processes) as broker:
        topic_run(broker, 10, args.messages // 10)  # warm up
        recorder = subprocess.Popen([spy, "record", "-o", args.profile, "-f", "raw", "-r",
                                     "250", "-s", "-p", str(broker.bridge.pid)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(2)
        result = topic_run(broker, args.subscribers, args.messages * 10 // args.subscribers)
        recorder.send_signal(2)
        recorder.wait(60)
    print(f"  topic x{args.subscribers} under py-spy: {result['rate']:,.0f} deliveries/s",
          flush=True)
    own, total = Counter(), 0
    with open(args.profile) as fp:
        for line in fp:
            stack, _, count = line.rstrip().rpartition(" ")
            total += int(count)
            own[stack.split(";")[-1]] += int(count)
    for frame_name, count in own.most_common(15):
        print(f"  {count / total:6.1%}  {frame_name[:110]}")


def show(name: str, r: dict) -> None:
    print(f"  {name:9} topic x10 {r['topic10']['rate']:>9,.0f} deliveries/s "
          f"(cpu {r['topic10']['broker_cpu']:.2f})  x100 {r['topic100']['rate']:>9,.0f} "
          f"(cpu {r['topic100']['broker_cpu']:.2f})  queue send+ack "
          f"{r['queue']['rate']:>8,.0f} msg/s (cpu {r['queue']['broker_cpu']:.2f})  "
          f"at half load p50 {r['latency']['p50_ms']:.1f} ms p99 "
          f"{r['latency']['p99_ms']:.1f} ms", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--bridge-processes", type=int, default=1)
    parser.add_argument("--no-rabbitmq", action="store_true")
    client_options(parser)
    parser.add_argument("--latency-at", type=int, nargs="+", metavar="MSG_PER_S",
                        help="only the latency of topic x10 at these rates, both brokers")
    parser.add_argument("--subscribers", type=int, default=10,
                        help="with --latency-at or --profile: topic subscribers (10)")
    parser.add_argument("--turns", type=int, default=1,
                        help="turns of each rate (--latency-at) or of the throughput runs, "
                             "brokers alternating; medians are shown")
    parser.add_argument("--profile", metavar="FILE",
                        help="only profile the bridge (py-spy) during a topic run")
    args = parser.parse_args()
    args.messages = 20_000 if args.quick else 100_000
    args.latency_seconds = 5 if args.quick else 15
    use_client_options(args)
    if args.profile:
        profile(args)
        return
    if args.latency_at:
        with_peer = not args.no_rabbitmq and RabbitMQ.installed()
        latency_at([Gearhorn, RabbitMQ] if with_peer else [Gearhorn], args)
        return
    print(f"STOMP load: raw frames; topic {args.messages * 10:,} deliveries per subscriber "
          f"count, queue {args.messages:,} messages; {os.cpu_count()} cores", flush=True)
    if args.no_rabbitmq or not RabbitMQ.installed():
        for _ in range(args.turns):
            measure(Gearhorn, args)
        print("  RabbitMQ: not run (apt-get install rabbitmq-server)")
        return
    throughput_turns(args)


def throughput_turns(args: argparse.Namespace) -> None:
    """``args.turns`` throughput runs of each broker, alternating (A B, B A,
    ...: whichever runs first measures faster), and the median ratio: one
    turn of queue send+ack moves by a quarter (docs/benchmarks.rst)."""
    ours, theirs = [], []
    for turn in range(args.turns):
        order = (Gearhorn, RabbitMQ) if turn % 2 == 0 else (RabbitMQ, Gearhorn)
        for broker_cls in order:
            (ours if broker_cls is Gearhorn else theirs).append(measure(broker_cls, args))
    for key, label in (("topic10", "topic x10"), ("topic100", "topic x100"),
                       ("queue", "queue send+ack")):
        ratios = [mine[key]["rate"] / peer[key]["rate"]
                  for mine, peer in zip(ours, theirs, strict=True)]
        each = f"  (turns: {' '.join(f'{r:.2f}' for r in ratios)})" if len(ratios) > 1 else ""
        print(f"  ratio gearhorn/RabbitMQ {label}: {statistics.median(ratios):.2f}{each}")


if __name__ == "__main__":
    main()
