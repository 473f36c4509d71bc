"""The ``gearhorn`` command: its arguments, its settings and its errors;
what each command does is in gearhorn/cli/commands.py."""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields

from gearhorn import config as configuration
from gearhorn.cli.commands import (
    cmd_audit,
    cmd_bridge,
    cmd_consume,
    cmd_dlq,
    cmd_fsyncd,
    cmd_history,
    cmd_ledger,
    cmd_node,
    cmd_passwd,
    cmd_presence,
    cmd_publish,
    cmd_status,
    cmd_subscribe,
    cmd_unsubscribe,
    cmd_up,
    cmd_web,
    cmd_worker,
)
from gearhorn.config import Config
from gearhorn.errors import GearhornError
from gearhorn.runtime.logs import setup_logging


def _common(nested: bool = False) -> argparse.ArgumentParser:
    """The options every command takes. ``nested``: for a sub-command of a
    command that takes them too (``gearhorn ledger --redis-url X export``),
    so an option not repeated after the sub-command keeps its value."""
    common = argparse.ArgumentParser(add_help=False,
                                     argument_default=argparse.SUPPRESS if nested else None)
    common.add_argument("--config", metavar="FILE",
                        help="INI file with a [gearhorn] section (env GEARHORN_CONFIG)")
    common.add_argument("--gearman", metavar="HOST:PORT", action="append",
                        dest="gearman_servers",
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
    parser = argparse.ArgumentParser(prog="gearhorn", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = _common()
    for add in (_add_worker, _add_up, _add_node, _add_fsyncd, _add_bridge, _add_subscriptions,
                _add_publish, _add_consume, _add_ledger, _add_audit, _add_report,
                _add_passwd, _add_dlq, _add_web, _add_status, _add_presence, _add_history):
        add(sub, common)
    return parser


# Each command's options that are settings have the setting's name as their
# dest: load_config takes every one given, by name (config.py has the rest).


def _add_worker(sub, common) -> None:
    worker = sub.add_parser("worker", parents=[common], help="run the fanout worker pool")
    worker.add_argument("--processes", type=int, metavar="N",
                        help="worker processes (default: number of cores)")
    _durability(worker)
    worker.set_defaults(func=cmd_worker)


def _add_up(sub, common) -> None:
    up = sub.add_parser("up", parents=[common],
                        help="start Redis, a Gearman server and the worker pool on loopback")
    up.add_argument("--processes", type=int, metavar="N")
    up.add_argument("--data-dir", metavar="DIR",
                    help="where the started Redis and gearmand keep data (default .gearhorn)")
    up.add_argument("--persistence", choices=("sqlite", "none"),
                    help="how gearmand keeps the jobs submitted straight to it "
                         "(gearman -b) across a crash (default sqlite); gearhorn's "
                         "copies are held in Redis either way")
    up.add_argument("--no-persistence", dest="persistence", action="store_const",
                    const="none", help="gearmand keeps the jobs submitted straight to it "
                                       "in memory only")
    up.add_argument("--audit", dest="audit_enabled", action="store_const", const=True,
                    help="start the live delivery audit (the default: gearhorn audit; its "
                         "findings on this terminal and at /metrics)")
    up.add_argument("--no-audit", dest="audit_enabled", action="store_const", const=False,
                    help="do not start the live delivery audit")
    _durability(up)
    up.set_defaults(func=cmd_up)


def _add_node(sub, common) -> None:
    node = sub.add_parser("node", parents=[common],
                          help="run one node of three: Redis, Sentinel, gearmand, the pool, "
                               "the bridge and the console, started again when they die")
    node.add_argument("nodes", nargs="+", metavar="ADDRESS",
                      help="this node's address, then its peers' (the same three on "
                           "every node, this one first)")
    node.add_argument("--data-dir", metavar="DIR",
                      help="where this node keeps Redis's data and the logs "
                           "(default .gearhorn)")
    node.add_argument("--processes", type=int, metavar="N", help="worker processes")
    node.add_argument("--only", choices=("redis", "fsyncd", "sentinel", "gearmand", "worker",
                                         "bridge", "web"),
                      help="run this part alone (a service manager runs each part as its "
                           "own service: etc/systemd/)")
    node.set_defaults(func=cmd_node)


def _durability(command) -> None:
    command.add_argument("--durability", choices=("auto", "fsync", "written"),
                         help="auto (default): after an fsync where a syncer serves the "
                              "Redis (or appendfsync always), once written elsewhere; "
                              "fsync: only after an fsync covering it (a Redis no syncer "
                              "serves stops the start); written: once Redis wrote it (a "
                              "power cut loses up to a second)")


def _add_fsyncd(sub, common) -> None:
    fsyncd = sub.add_parser("fsyncd", parents=[common],
                            help="serve the fsync barrier of a Redis you run yourself "
                                 "(run it on that Redis's host)")
    fsyncd.add_argument("--url", metavar="URL",
                        help="the Redis to serve (default: --redis-url)")
    fsyncd.add_argument("--dir", metavar="DIR",
                        help="its data directory (default: asked of Redis, CONFIG GET dir)")
    fsyncd.set_defaults(func=cmd_fsyncd)


def _add_bridge(sub, common) -> None:
    bridge = sub.add_parser("bridge", parents=[common], help="run the STOMP bridge")
    bridge.add_argument("--host", dest="bridge_host",
                        help="address to listen on (default 127.0.0.1)")
    bridge.add_argument("--port", type=int, dest="bridge_port",
                        help="port to listen on (default 61613)")
    bridge.add_argument("--processes", type=int, metavar="N", dest="bridge_processes",
                        help="bridge processes sharing the ports (default 1; one per "
                             "core uses every core)")
    bridge.add_argument("--ws-port", type=int, metavar="PORT", dest="bridge_ws_port",
                        help="STOMP over WebSocket at ws://HOST:PORT/ws (default 15674; "
                             "0: off)")
    _durability(bridge)
    bridge.set_defaults(func=cmd_bridge)


def _add_subscriptions(sub, common) -> None:
    for name, text, func in (("subscribe", "subscribe CLIENT_ID to TOPIC", cmd_subscribe),
                             ("unsubscribe", "unsubscribe CLIENT_ID from TOPIC",
                              cmd_unsubscribe)):
        p = sub.add_parser(name, parents=[common], help=text)
        p.add_argument("topic")
        p.add_argument("client_id")
        p.set_defaults(func=func)


def _add_publish(sub, common) -> None:
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
    publish.set_defaults(func=cmd_publish)


def _add_consume(sub, common) -> None:
    consume = sub.add_parser("consume", parents=[common],
                             help="print the copies sent to CLIENT_ID for TOPIC")
    consume.add_argument("topic")
    consume.add_argument("client_id")
    consume.add_argument("--count", type=int, help="stop after N copies")
    consume.add_argument("--timeout", type=float, help="stop after waiting this many seconds")
    consume.set_defaults(func=cmd_consume)


def _add_ledger(sub, common) -> None:
    ledger = sub.add_parser("ledger", parents=[common], help="the delivery ledger")
    ledger_sub = ledger.add_subparsers(dest="ledger_command", required=True, metavar="ACTION")
    export = ledger_sub.add_parser("export", parents=[_common(nested=True)],
                                   help="write new ledger events to files, by date")
    export.add_argument("--out", required=True, metavar="DIR")
    export.add_argument("--format", choices=("parquet", "jsonl"), default="parquet")
    ledger.set_defaults(func=cmd_ledger)


def _add_audit(sub, common) -> None:
    audit = sub.add_parser("audit", parents=[common],
                           help="the live delivery audit (is anything lost right now?), "
                                "until Ctrl-C")
    audit.add_argument("--dir", metavar="DIR",
                       help="its inbox, checkpoints, state and findings (default "
                            "DATA_DIR/audit)")
    audit.add_argument("--master", help="run it as a Spark Structured Streaming job on this "
                                        "Spark master (local[*]: Spark's own); without "
                                        "it, counts first, in this process")
    audit.add_argument("--deadline", type=float, dest="audit_deadline", metavar="SECONDS",
                       help="a copy not delivered this long after its enqueue, while its "
                            "subscriber takes others, is a finding (default 60)")
    audit.add_argument("--lateness", type=float, dest="audit_lateness", metavar="SECONDS",
                       help="how late an event may reach the ledger (default 5)")
    audit.add_argument("--interval", type=float, dest="audit_interval", metavar="SECONDS",
                       help="seconds between two reads of the ledger (default 2)")
    audit.add_argument("--from-start", action="store_true",
                       help="a first start audits the whole ledger kept, not from now on")
    audit.set_defaults(func=cmd_audit)


def _add_report(sub, common) -> None:
    # Listed for --help; its options are the Spark job's own (pipeline/job.py).
    sub.add_parser("report", help="Spark job: statistics and reconciliation of an exported "
                                  "ledger (gearhorn report --help)")


def _add_passwd(sub, common) -> None:
    passwd = sub.add_parser("passwd", help="set a STOMP user's passcode (hashed) in a "
                                           "credentials file; reads it from stdin or asks")
    passwd.add_argument("file", help="credentials file (created if missing)")
    passwd.add_argument("user")
    passwd.set_defaults(func=cmd_passwd)


def _add_dlq(sub, common) -> None:
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
    dlq.set_defaults(func=cmd_dlq)


def _add_web(sub, common) -> None:
    web = sub.add_parser("web", parents=[common],
                         help="Prometheus /metrics, /healthz, /readyz and the live console")
    web.add_argument("--host", dest="web_host", help="address (default 127.0.0.1)")
    web.add_argument("--port", type=int, dest="web_port", help="port (default 15672)")
    web.set_defaults(func=cmd_web)


def _add_presence(sub, common) -> None:
    presence = sub.add_parser("presence", parents=[common],
                              help="who is subscribed to TOPIC, and where")
    presence.add_argument("topic")
    presence.add_argument("--limit", type=int, default=1000, metavar="N",
                          help="list about N subscribers (default 1000)")
    presence.add_argument("--json", action="store_true", help="machine-readable output")
    presence.set_defaults(func=cmd_presence)


def _add_history(sub, common) -> None:
    history = sub.add_parser("history", parents=[common],
                             help="TOPIC's last messages, with their offsets")
    history.add_argument("topic")
    history.add_argument("--since", type=int, default=0, metavar="N",
                         help="messages after offset N (default: from the oldest kept)")
    history.add_argument("--limit", type=int, default=100, metavar="N",
                         help="at most N messages (default 100)")
    history.add_argument("--json", action="store_true", help="machine-readable output")
    history.set_defaults(func=cmd_history)


def _add_status(sub, common) -> None:
    status = sub.add_parser("status", parents=[common],
                            help="topics, subscribers, live workers and queue depths")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=cmd_status)


_SETTINGS = frozenset(f.name for f in fields(Config))


def load_config(args: argparse.Namespace) -> Config:
    """Defaults < file < environment < the flags given, which are the
    options whose dest is a setting's name."""
    if args.command == "passwd":  # no gearhorn servers involved
        return configuration.load({}, None)
    flags = {name: value for name, value in vars(args).items() if name in _SETTINGS}
    if flags.get("gearman_servers"):
        flags["gearman_servers"] = tuple(flags["gearman_servers"])
    return configuration.load(flags, args.config)


def _service_errors() -> tuple[type[BaseException], ...]:
    """Redis and Gearman errors: a server away is one line, not a traceback
    (imported when one happens: gear is slow to import)."""
    from gearhorn import gearman
    from gearhorn.store.redisconn import REDIS_ERRORS

    return (*REDIS_ERRORS, gearman.GearmanError, OSError)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["report"]:  # the Spark job parses its own options
        from gearhorn.pipeline.needs import spark_missing

        if (reason := spark_missing()) is not None and "-h" not in argv and "--help" not in argv:
            print(f"gearhorn report: {reason}", file=sys.stderr)
            return 1
        from gearhorn.pipeline.job import main as report

        return report(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args)
        setup_logging(config.log_level)
        return args.func(config, args) or 0
    except GearhornError as exc:  # one line for a person; anything else is a bug
        print(f"gearhorn {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code
    except _service_errors() as exc:  # the expression is evaluated only then
        print(f"gearhorn {args.command}: {_said(exc)}", file=sys.stderr)
        return 1


def _said(exc: BaseException) -> str:
    """A Gearman error's message is written for a person; others get their type."""
    from gearhorn import gearman

    return str(exc) if isinstance(exc, gearman.GearmanError) else f"{type(exc).__name__}: {exc}"


