"""The ``gearhorn`` command. Parses arguments and calls the modules that do the work."""

from __future__ import annotations

import argparse
import json
import os
import sys

from gearhorn import config as configuration
from gearhorn.config import Config
from gearhorn.errors import GearhornError
from gearhorn.logs import setup_logging


def _common(nested: bool = False) -> argparse.ArgumentParser:
    """The options every command takes. ``nested``: for a sub-command of a
    command that takes them too (``gearhorn ledger --redis-url X export``),
    so an option not repeated after the sub-command keeps its value."""
    common = argparse.ArgumentParser(add_help=False,
                                     argument_default=argparse.SUPPRESS if nested else None)
    common.add_argument("--config", metavar="FILE",
                        help="INI file with a [gearhorn] section (env GEARHORN_CONFIG)")
    common.add_argument("--gearman", metavar="HOST:PORT", action="append",
                        type=configuration.parse_server,
                        help="a gearmand server; repeat for several (env GEARHORN_GEARMAN, "
                             "comma-separated; default 127.0.0.1:4730)")
    common.add_argument("--redis-url", metavar="URL",
                        help="Redis for the registry (env GEARHORN_REDIS_URL; "
                             "default redis://127.0.0.1:6379/0)")
    common.add_argument("--log-level", metavar="LEVEL", help="DEBUG, INFO, WARNING (env "
                        "GEARHORN_LOG_LEVEL)")
    return common


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    parser = argparse.ArgumentParser(prog="gearhorn", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    worker = sub.add_parser("worker", parents=[common], help="run the fanout worker pool")
    worker.add_argument("--processes", type=int, metavar="N",
                        help="worker processes (default: number of cores)")

    up = sub.add_parser("up", parents=[common],
                        help="start Redis, a Gearman server and the worker pool on loopback")
    up.add_argument("--processes", type=int, metavar="N")
    up.add_argument("--data-dir", metavar="DIR",
                    help="where the started Redis and gearmand keep data (default .gearhorn)")
    up.add_argument("--persistence", choices=("redis", "sqlite", "none"),
                    help="how gearmand keeps queued jobs across a crash (default redis)")
    up.add_argument("--no-persistence", dest="persistence", action="store_const",
                    const="none", help="keep queued jobs in memory only: faster, and a "
                                       "gearmand crash loses them")

    mend = sub.add_parser("replay", parents=[common],
                          help="around a start of gearmand -q redis: hold the queued jobs "
                               "gearmand 1.1.20 would replay wrong, resubmit them after")
    mend.add_argument("step", choices=("hold", "resubmit"),
                      help="hold: before gearmand starts; resubmit: once it listens")
    mend.add_argument("--queue-redis-url", metavar="URL",
                      help="the Redis of gearmand's queue (default redis://127.0.0.1:6380/0)")

    bridge = sub.add_parser("bridge", parents=[common], help="run the STOMP bridge")
    bridge.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    bridge.add_argument("--port", type=int, help="port to listen on (default 61613)")
    bridge.add_argument("--processes", type=int, metavar="N", dest="bridge_processes",
                        help="bridge processes sharing the ports (default 1; one per "
                             "core uses every core)")
    bridge.add_argument("--ws-port", type=int, metavar="PORT",
                        help="STOMP over WebSocket at ws://HOST:PORT/ws (default 15674; "
                             "0: off)")

    for name, text in (("subscribe", "subscribe CLIENT_ID to TOPIC"),
                       ("unsubscribe", "unsubscribe CLIENT_ID from TOPIC")):
        p = sub.add_parser(name, parents=[common], help=text)
        p.add_argument("topic")
        p.add_argument("client_id")

    publish = sub.add_parser("publish", parents=[common], help="broadcast PAYLOAD to TOPIC")
    publish.add_argument("topic")
    publish.add_argument("payload", help="sent as text; with --json, parsed as a JSON value")
    publish.add_argument("--json", action="store_true", help="PAYLOAD is JSON")
    publish.add_argument("--background", action="store_true",
                         help="return once gearmand accepted every copy")
    publish.add_argument("--unique", help="Gearman unique key (coalesces repeats)")
    publish.add_argument("--priority", choices=("high", "normal", "low"), default="normal")
    publish.add_argument("--delay", type=float, metavar="SECONDS",
                         help="deliver this many seconds from now")
    publish.add_argument("--deliver-at", metavar="TIME",
                         help="deliver at this epoch second or RFC 3339 time")
    publish.add_argument("--header", action="append", default=[], metavar="NAME=VALUE",
                         help="a header STOMP subscribers receive (repeatable)")

    consume = sub.add_parser("consume", parents=[common],
                             help="print the copies sent to CLIENT_ID for TOPIC")
    consume.add_argument("topic")
    consume.add_argument("client_id")
    consume.add_argument("--count", type=int, help="stop after N copies")
    consume.add_argument("--timeout", type=float, help="stop after waiting this many seconds")

    ledger = sub.add_parser("ledger", parents=[common], help="the delivery ledger")
    ledger_sub = ledger.add_subparsers(dest="ledger_command", required=True, metavar="ACTION")
    export = ledger_sub.add_parser("export", parents=[_common(nested=True)],
                                   help="write new ledger events to files, by date")
    export.add_argument("--out", required=True, metavar="DIR")
    export.add_argument("--format", choices=("parquet", "jsonl"), default="parquet")

    # Listed for --help; its options are the Spark job's own (pipeline/job.py).
    sub.add_parser("report", help="Spark job: statistics and reconciliation of an exported "
                                  "ledger (gearhorn report --help)")

    passwd = sub.add_parser("passwd", help="set a STOMP user's passcode (hashed) in a "
                                           "credentials file; reads it from stdin or asks")
    passwd.add_argument("file", help="credentials file (created if missing)")
    passwd.add_argument("user")

    dlq = sub.add_parser("dlq", parents=[common], help="dead letters of a queue "
                                                      "(<queue>.dlq): list, requeue, purge")
    dlq_sub = dlq.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")
    listing = dlq_sub.add_parser("list", parents=[_common(nested=True)],
                                 help="show dead letters with reason and delivery count "
                                      "(without consuming them)")
    listing.add_argument("--limit", type=int, default=100, help="at most N (default 100)")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    requeue = dlq_sub.add_parser("requeue", parents=[_common(nested=True)],
                                 help="move dead letters back to their queue")
    requeue.add_argument("--count", type=int, help="at most N (default: all)")
    dlq_sub.add_parser("purge", parents=[_common(nested=True)], help="drop every dead letter")
    for action in dlq_sub.choices.values():
        action.add_argument("queue", help="the queue (Gearman function) whose dead letters")

    web = sub.add_parser("web", parents=[common],
                         help="Prometheus /metrics, /healthz, /readyz and the live console")
    web.add_argument("--host", dest="web_host", help="address (default 127.0.0.1)")
    web.add_argument("--port", type=int, dest="web_port", help="port (default 15672)")

    status = sub.add_parser("status", parents=[common],
                            help="topics, subscribers, live workers and queue depths")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def load_config(args: argparse.Namespace) -> Config:
    if args.command == "passwd":  # no gearhorn servers involved
        return configuration.load({}, None)
    servers = tuple(args.gearman) if args.gearman else None
    flags = {"gearman_servers": servers, "redis_url": args.redis_url,
             "log_level": args.log_level, "processes": getattr(args, "processes", None),
             "data_dir": getattr(args, "data_dir", None),
             "persistence": getattr(args, "persistence", None),
             "queue_redis_url": getattr(args, "queue_redis_url", None),
             "bridge_host": getattr(args, "host", None), "bridge_port": getattr(args, "port", None),
             "bridge_ws_port": getattr(args, "ws_port", None),
             "bridge_processes": getattr(args, "bridge_processes", None),
             "web_host": getattr(args, "web_host", None),
             "web_port": getattr(args, "web_port", None)}
    return configuration.load(flags, args.config)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["report"]:  # the Spark job parses its own options
        from gearhorn.pipeline.job import main as report

        return report(argv[1:])
    args = build_parser().parse_args(argv)
    args.argv = argv
    try:
        config = load_config(args)
        setup_logging(config.log_level)
        return globals()[f"cmd_{args.command}"](config, args) or 0
    except GearhornError as exc:  # one line for a person; anything else is a bug
        print(f"gearhorn {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code


class CommandError(GearhornError):
    """Ends a command with a one-line message and exit status 1."""


def cmd_worker(config: Config, args: argparse.Namespace) -> int:
    from gearhorn.worker.pool import Pool

    return Pool(config).run()


def cmd_bridge(config: Config, args: argparse.Namespace) -> int:
    from gevent import monkey

    if not monkey.is_module_patched("socket"):
        # Patch before anything imports the standard library: a fresh process.
        import os

        os.execv(sys.executable, [sys.executable, "-m", "gearhorn.stomp", *args.argv[1:]])
    from gearhorn.stomp.app import run_bridge

    return run_bridge(config)


def cmd_up(config: Config, args: argparse.Namespace) -> int:
    from gearhorn.embedded import Embedded

    return Embedded(config).run()


def cmd_replay(config: Config, args: argparse.Namespace) -> int:
    import redis

    from gearhorn import gearman
    from gearhorn.store import redisconn
    from gearhorn.store.keys import Keys
    from gearhorn.store.redisconn import REDIS_ERRORS
    from gearhorn.worker import replay

    keys = Keys.for_config(config)
    queue = redis.Redis.from_url(config.queue_redis_url, socket_timeout=60)
    try:
        dashed = replay.DashedFunctions(redisconn.for_config(config), keys).load()
        if args.step == "hold":
            print(f"held {replay.hold(queue, dashed, keys):,} jobs")
            return 0
        client = gearman.Client(config.gearman_servers, connect_timeout=60,
                                tls=config.gearman_tls)
        try:
            print(f"resubmitted {replay.resubmit(queue, dashed, keys, client):,} jobs")
        finally:
            client.close()
    except (*REDIS_ERRORS, gearman.GearmanError) as exc:
        raise CommandError(str(exc)) from None
    return 0


def _producer(config: Config):
    from gearhorn.client import Producer

    return Producer(config.gearman_servers, tls=config.gearman_tls)


def _run_job(config: Config, method: str, *args, **kwargs) -> int:
    with _producer(config) as producer:
        result = getattr(producer, method)(*args, **kwargs)
    print(json.dumps(result))
    return 0


def cmd_subscribe(config: Config, args: argparse.Namespace) -> int:
    return _run_job(config, "subscribe", args.topic, args.client_id)


def cmd_unsubscribe(config: Config, args: argparse.Namespace) -> int:
    return _run_job(config, "unsubscribe", args.topic, args.client_id)


def cmd_publish(config: Config, args: argparse.Namespace) -> int:
    payload = args.payload
    if args.json:
        try:
            payload = json.loads(payload)
        except ValueError as exc:
            raise CommandError(f"PAYLOAD is not JSON: {exc}") from None
    headers = {}
    for item in args.header:
        name, sep, value = item.partition("=")
        if not sep:
            raise CommandError(f"--header {item!r}: use NAME=VALUE")
        headers[name] = value
    deliver_at: float | str | None = args.deliver_at
    if deliver_at is not None and deliver_at.replace(".", "", 1).isdigit():
        deliver_at = float(deliver_at)  # else an RFC 3339 time: the worker parses it
    return _run_job(config, "publish", args.topic, payload,
                    background=args.background, unique=args.unique, priority=args.priority,
                    delay=args.delay, deliver_at=deliver_at, headers=headers or None)


def cmd_consume(config: Config, args: argparse.Namespace) -> int:
    from gearhorn.client import Consumer

    consumer = Consumer(config.gearman_servers, args.topic, args.client_id,
                        tls=config.gearman_tls)
    received = 0
    with consumer:
        while args.count is None or received < args.count:
            data = consumer.get(args.timeout)
            if data is None:
                break
            sys.stdout.buffer.write(data + b"\n")
            sys.stdout.flush()
            received += 1
    return 0


def cmd_ledger(config: Config, args: argparse.Namespace) -> int:
    from gearhorn.store import redisconn
    from gearhorn.store.keys import Keys
    from gearhorn.store.ledger import export, write_queue_snapshot
    from gearhorn.store.redisconn import REDIS_ERRORS

    client = redisconn.for_config(config, socket_timeout=30)
    # Before the ledger is read: a copy that arrives in between is then in
    # the ledger and not in the snapshot (reported unaccounted: a false
    # alarm), never in the snapshot and not in the ledger, where its count
    # would hide a lost one.
    queued = _queued_now(config)
    try:
        result = export(client, Keys.for_config(config), args.out,
                        args.format, shards=config.ledger_shards)
    except REDIS_ERRORS as exc:
        raise CommandError(str(exc)) from None
    print(f"exported {result['rows']:,} rows in {len(result['files'])} files to {args.out} "
          f"(ledger up to {result['last_id']})")
    if queued is not None:
        write_queue_snapshot(args.out, queued)
    if result["trimmed"]:
        print("warning: the ledger was trimmed (ledger_maxlen) before some events were "
              "exported; export more often", file=sys.stderr)
    return 0


def _queued_now(config: Config) -> dict[str, int] | None:
    """Jobs per queue on every gearmand now, written beside the export: the
    report checks plain Gearman subscribers (which record no delivery)
    against it. None, said once, when a gearmand does not answer."""
    from gearhorn import gearman

    queued: dict[str, int] = {}
    try:
        for host, port in config.gearman_servers:
            for function in gearman.status(host, port, tls=config.gearman_tls):
                queued[function.name] = queued.get(function.name, 0) + function.queued
    except (gearman.GearmanError, OSError) as exc:
        print(f"warning: no gearmand snapshot ({exc}): the report cannot check plain "
              "Gearman subscribers", file=sys.stderr)
        return None
    return queued


def cmd_passwd(config: Config, args: argparse.Namespace) -> int:
    import getpass

    from gearhorn.stomp import auth

    if sys.stdin.isatty():
        passcode = getpass.getpass(f"passcode for {args.user}: ")
        if getpass.getpass("again: ") != passcode:
            raise CommandError("the passcodes differ")
    else:
        passcode = sys.stdin.readline().rstrip("\n")
    if not passcode:
        raise CommandError("empty passcode")
    try:
        with open(args.file, encoding="utf-8") as fp:
            text = fp.read()
    except FileNotFoundError:
        text = ""
    updated = auth.set_passcode(text, args.user, passcode)
    fd = os.open(args.file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fp:
        fp.write(updated)
    print(f"{args.user}: passcode set in {args.file} (add read/write patterns there)")
    return 0


def cmd_status(config: Config, args: argparse.Namespace) -> int:
    from gearhorn.status import collect, render

    report = collect(config)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


def cmd_dlq(config: Config, args: argparse.Namespace) -> int:
    import time

    from gearhorn import gearman
    from gearhorn.naming import dead_letter_queue
    from gearhorn.store import deadletters, redisconn
    from gearhorn.store.redisconn import REDIS_ERRORS

    index, mover = deadletters.for_config(config, redisconn.for_config(config,
                                                                       socket_timeout=30))
    try:
        if args.dlq_command == "requeue":
            print(f"{mover.requeue(args.queue, args.count)} dead letters moved back to "
                  f"{args.queue}")
        elif args.dlq_command == "purge":
            print(f"{mover.purge(args.queue)} dead letters of {args.queue} dropped")
        else:
            letters = index.list(args.queue, args.limit)
            queued = deadletters.queued(config.gearman_servers, dead_letter_queue(args.queue),
                                        config.gearman_tls)
            if args.json:
                print(json.dumps({"queue": args.queue, "queued": queued,
                                  "letters": [d.to_dict() for d in letters]}, indent=2))
                return 0
            print(f"{dead_letter_queue(args.queue)}: {queued} queued")
            for d in letters:
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(d.at))
                print(f"  {when}  {d.deliveries:>3} deliveries  {d.reason:12}  "
                      f"{d.size:>7} bytes  {d.preview[:60]!r}")
    except (*REDIS_ERRORS, gearman.GearmanError, OSError) as exc:
        raise CommandError(f"{type(exc).__name__}: {exc}") from None
    return 0


def cmd_web(config: Config, args: argparse.Namespace) -> int:
    from gevent import monkey

    if not monkey.is_module_patched("socket"):  # as cmd_bridge: a fresh, patched process
        os.execv(sys.executable, [sys.executable, "-m", "gearhorn.web", *args.argv[1:]])
    from gearhorn.web.app import run_web

    return run_web(config)
