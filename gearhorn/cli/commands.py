"""What each ``gearhorn`` command does, given its settings and arguments
(gearhorn/cli/main.py parses them). Modules are imported by the command that
needs them: ``gearhorn status`` must not wait for gevent or Spark."""

from __future__ import annotations

import argparse
import json
import os
import sys

from gearhorn import config as configuration
from gearhorn.config import Config
from gearhorn.errors import GearhornError


class CommandError(GearhornError):
    """Ends a command with a one-line message and exit status 1."""


def cmd_worker(config: Config, args: argparse.Namespace) -> int:
    from gearhorn.store.durability import check_at_start
    from gearhorn.worker.pool import Pool

    check_at_start(config)  # a setting that cannot be kept stops the start here
    return Pool(config).run()


def cmd_bridge(config: Config, args: argparse.Namespace) -> int:
    from gevent import monkey

    if not monkey.is_module_patched("socket"):
        # Patch before anything imports the standard library: a fresh
        # process, which reads this config from its environment.
        _exec_patched("gearhorn.stomp", config)
    from gearhorn.stomp.app import run_bridge

    return run_bridge(config)


def cmd_up(config: Config, args: argparse.Namespace) -> int:
    from gearhorn.cli.up import Embedded

    return Embedded(config).run()


def cmd_node(config: Config, args: argparse.Namespace) -> int:
    from gearhorn.supervision.node import Node

    if len(set(args.nodes)) < 3:
        raise CommandError("gearhorn node needs this node's address and its two peers' "
                           "(three different addresses)")
    return Node(config, args.nodes, args.data_dir or config.data_dir, args.only).run()


def cmd_fsyncd(config: Config, args: argparse.Namespace) -> int:
    """Serve the fsync barrier of one Redis until SIGTERM or Ctrl-C."""
    import signal
    import threading

    from gearhorn.supervision.aofsync import AofSyncer, aof_files

    url = args.url or config.redis_url
    if args.dir and not os.path.isdir(args.dir):
        raise CommandError(f"no folder {args.dir}: run fsyncd on the host of the Redis it serves")
    syncer = AofSyncer(url, args.dir).start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if not syncer.serving.wait(30):
        syncer.stop()
        raise CommandError(f"cannot serve the fsync barrier of {url}: "
                           f"{syncer.refused or 'is Redis there?'}")
    layout = syncer.layout
    if not aof_files(layout):
        syncer.stop()
        raise CommandError(f"no append-only file of the Redis at {url} in {layout.data_dir} "
                           f"({layout.folder}/ or {layout.filename}): is appendonly on, and "
                           f"is this its host?")
    print(f"serving the fsync barrier of {url} (files in {layout.data_dir}/{layout.folder})",
          flush=True)
    stop.wait()
    syncer.stop()
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


def cmd_history(config: Config, args: argparse.Namespace) -> int:
    with _producer(config) as producer:
        found = producer.history(args.topic, args.since, args.limit)
    if args.json:
        print(json.dumps(found))
        return 0
    print(f"{found['topic']}: offsets {found['first']} to {found['last']}, epoch "
          f"{found['epoch'] or '-'}" + ("" if found["recovered"] else
                                         "; some after --since are gone"))
    for m in found["messages"]:
        body = m.get("payload", f"(base64) {m.get('payload_base64', '')}")
        print(f"  {m['offset']:>8}  {body}")
    return 0


def cmd_presence(config: Config, args: argparse.Namespace) -> int:
    with _producer(config) as producer:
        found = producer.presence(args.topic, args.limit)
    if args.json:
        print(json.dumps(found))
        return 0
    print(f"{found['topic']}: {found['subscribers']} subscribers")
    for p in found["patterns"]:
        print(f"  {p['pattern']:40} {p['subscribers']:>8} by prefix")
    for c in found["clients"]:
        where = f"stomp, bridge {c['bridge']}" if c["via"] == "stomp" else c["via"]
        print(f"  {c['client_id']:40} {where}{', durable' if c['durable'] else ''}")
    if found["cursor"]:
        print(f"  ... {found['direct'] - len(found['clients'])} more")
    return 0


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
    from gearhorn.store.ledgerexport import export, write_queue_snapshot

    client = redisconn.for_config(config, socket_timeout=30)
    # Before the ledger is read: a copy that arrives in between is then in
    # the ledger and not in the snapshot (reported unaccounted: a false
    # alarm), never in the snapshot and not in the ledger, where its count
    # would hide a lost one.
    queued = _queued_now(config)
    result = export(client, Keys.for_config(config), args.out, args.format,
                    shards=config.ledger_shards)
    print(f"exported {result['rows']:,} rows in {len(result['files'])} files to {args.out} "
          f"(ledger up to {result['last_id']})")
    if queued is not None:
        write_queue_snapshot(args.out, queued)
    if result["trimmed"]:
        print("warning: the ledger was trimmed (ledger_maxlen) before some events were "
              "exported; export more often", file=sys.stderr)
    return 0


def cmd_audit(config: Config, args: argparse.Namespace) -> int:
    from gearhorn.pipeline.audit import AuditSettings
    from gearhorn.store import redisconn
    from gearhorn.store.keys import Keys

    settings = AuditSettings(
        folder=args.dir or os.path.join(config.data_dir, "audit"),
        deadline_ms=int(config.audit_deadline * 1000),
        lateness_ms=int(config.audit_lateness * 1000), interval_s=config.audit_interval,
        master=args.master, from_start=args.from_start, shards=config.ledger_shards)
    client, keys = redisconn.for_config(config, socket_timeout=30), Keys.for_config(config)
    if args.master is None:  # count first: no Spark, no Java (docs/design/audit.rst)
        from gearhorn.pipeline import countaudit

        return countaudit.run(client, keys, settings)
    from gearhorn.pipeline.needs import require_spark

    require_spark()  # one line, not an import's traceback
    from gearhorn.pipeline.audit import run

    return run(client, keys, settings)


def _queued_now(config: Config) -> dict[str, int] | None:
    """Jobs per queue on every gearmand now, written beside the export: the
    report checks plain Gearman subscribers (which record no delivery)
    against it. None, said once, when a gearmand does not answer."""
    from gearhorn import gearman

    try:
        found = gearman.totals(config.gearman_servers, config.gearman_tls)
    except (gearman.GearmanError, OSError) as exc:
        print(f"warning: no gearmand snapshot ({exc}): the report cannot check plain "
              "Gearman subscribers", file=sys.stderr)
        return None
    return {name: f.queued for name, f in found.items()}


def cmd_passwd(config: Config, args: argparse.Namespace) -> int:
    import getpass

    from gearhorn.rules import auth

    if sys.stdin.isatty():
        passcode = getpass.getpass(f"passcode for {args.user}: ")
        if getpass.getpass("again: ") != passcode:
            raise CommandError("the passcodes differ")
    else:
        passcode = sys.stdin.readline().rstrip("\n")
    if not passcode:
        raise CommandError("empty passcode")
    auth.save_passcode(args.file, args.user, passcode)
    print(f"{args.user}: passcode set in {args.file} (add read/write patterns there)")
    return 0


def cmd_status(config: Config, args: argparse.Namespace) -> int:
    from gearhorn.cli.status import collect, render

    report = collect(config)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


def cmd_dlq(config: Config, args: argparse.Namespace) -> int:
    import time

    from gearhorn.rules.naming import dead_letter_queue
    from gearhorn.store import deadletters, redisconn

    index, mover = deadletters.for_config(config, redisconn.for_config(config,
                                                                       socket_timeout=30))
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
    return 0


def cmd_web(config: Config, args: argparse.Namespace) -> int:
    from gevent import monkey

    if not monkey.is_module_patched("socket"):  # as cmd_bridge: a fresh, patched process
        _exec_patched("gearhorn.web", config)
    from gearhorn.web.app import run_web

    return run_web(config)


def _exec_patched(module: str, config: Config) -> None:
    """Become ``python -m module`` (gevent patches the standard library
    first there), with ``config`` in the environment, setting by setting."""
    env = {**os.environ, **configuration.to_env(config)}
    env.pop("GEARHORN_CONFIG", None)  # every setting is in env already
    os.execve(sys.executable, [sys.executable, "-m", module], env)
