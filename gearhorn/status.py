"""``gearhorn status``: what the registry and every gearmand say right now."""

from __future__ import annotations

from gearhorn import gearman
from gearhorn.config import Config
from gearhorn.store import redisconn
from gearhorn.store.keys import Keys
from gearhorn.store.redisconn import REDIS_ERRORS
from gearhorn.store.registry import Registry
from gearhorn.web.snapshot import retention
from gearhorn.worker.delayed import Scheduler


def collect(config: Config) -> dict:
    """A JSON-ready snapshot; an unreachable server is reported, not raised."""
    report: dict = {"redis": config.redis_url, "topics": {}, "workers": {}, "gearman": []}
    try:
        registry = Registry(redisconn.for_config(config, socket_timeout=5),
                            Keys.for_config(config))
        report["topics"] = registry.topics()
        report["workers"] = registry.live_workers()
        report["delayed"] = Scheduler(registry.redis, registry.keys).pending()
        report.update(retention(registry.redis, registry.keys))
    except REDIS_ERRORS as exc:
        report["redis_error"] = str(exc)
    for host, port in config.gearman_servers:
        entry: dict = {"server": f"{host}:{port}"}
        try:
            entry["functions"] = [
                {"name": f.name, "queued": f.queued, "running": f.running, "workers": f.workers}
                for f in sorted(gearman.status(host, port, tls=config.gearman_tls),
                                key=lambda f: f.name)]
        except OSError as exc:
            entry["error"] = str(exc)
        report["gearman"].append(entry)
    report["queues"] = summed_queues(report["gearman"])
    return report


def summed_queues(servers: list[dict]) -> list[dict]:
    """Each function's jobs over every server that answered: with several
    gearmand, a subscriber's copies are spread over all of them."""
    totals: dict[str, dict] = {}
    for server in servers:
        for f in server.get("functions", []):
            row = totals.setdefault(f["name"], {"name": f["name"], "queued": 0, "running": 0,
                                                "workers": 0, "servers": 0})
            for field in ("queued", "running", "workers"):
                row[field] += f[field]
            row["servers"] += 1
    return sorted(totals.values(), key=lambda row: row["name"])


def render(report: dict) -> str:
    lines = [f"redis {report['redis']}"]
    if "redis_error" in report:
        lines.append(f"  unreachable: {report['redis_error']}")
    lines.append(f"topics ({len(report['topics'])}):")
    lines += [f"  {name:40} {count:>8} subscribers"
              for name, count in sorted(report["topics"].items())]
    if "delayed" in report:
        lines.append(f"delayed messages waiting: {report['delayed']}")
    lines += _retention_lines(report)
    lines.append(f"live workers ({len(report['workers'])}):")
    lines += [f"  {wid:40} pid {info.get('pid', '?'):>7} jobs {info.get('jobs', '?')}"
              for wid, info in sorted(report["workers"].items())]
    if len(report["gearman"]) > 1:
        lines.append(f"queues over all {len(report['gearman'])} gearmand:")
        lines.append(f"  {'function':40} {'queued':>8} {'running':>8} {'workers':>8}")
        lines += [f"  {f['name']:40} {f['queued']:>8} {f['running']:>8} {f['workers']:>8}"
                  for f in report["queues"]]
    for server in report["gearman"]:
        lines.append(f"gearmand {server['server']}:")
        if "error" in server:
            lines.append(f"  unreachable: {server['error']}")
            continue
        lines.append(f"  {'function':40} {'queued':>8} {'running':>8} {'workers':>8}")
        lines += [f"  {f['name']:40} {f['queued']:>8} {f['running']:>8} {f['workers']:>8}"
                  for f in server["functions"]]
    return "\n".join(lines)


def _retention_lines(report: dict) -> list[str]:
    """The warden's view: the queue store, and the largest subscriber backlogs
    with the oldest copy's age; ``!`` marks one that nobody consumes."""
    lines = []
    store = report.get("store") or {}
    if store.get("over"):
        lines.append(f"REFUSING FANOUTS: {store['over']}")
    elif int(store.get("max") or 0):
        lines.append(f"queue store: {int(store['used']) / 1048576:.0f} of "
                     f"{int(store['max']) / 1048576:.0f} MiB (fanouts refused from "
                     f"{int(store['guard']) / 1048576:.0f} MiB)")
    backlogs = report.get("backlogs") or []
    if backlogs:
        lines.append("subscriber backlogs (largest; ! = no consumer):")
        lines.append(f"  {'queue':40} {'queued':>8} {'oldest':>8} {'readers':>7}  limits")
        for b in backlogs:
            age = "-" if b["oldest_age"] is None else f"{b['oldest_age']:.0f}s"
            mark = " " if b["consumers"] else "!"
            lines.append(f"{mark} {b['queue']:40} {b['depth']:>8} {age:>8} "
                         f"{b['consumers']:>7}  {b['limits']}")
    return lines
