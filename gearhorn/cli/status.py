"""``gearhorn status``: the console's snapshot (gearhorn/web/snapshot.py),
as text or JSON. One collector feeds both, so they never disagree."""

from __future__ import annotations

from gearhorn.config import Config
from gearhorn.store import durability, redisconn
from gearhorn.store.keys import Keys
from gearhorn.store.redisconn import REDIS_ERRORS
from gearhorn.store.registry import Registry
from gearhorn.web.snapshot import Collector

# Topics and queues listed at most (the largest first); totals are exact.
STATUS_TOP = 1000


def collect(config: Config) -> dict:
    """The snapshot; an unreachable server is reported, not raised."""
    registry = Registry(redisconn.for_config(config, socket_timeout=5), Keys.for_config(config))
    collector = Collector(registry, config.gearman_servers, top=STATUS_TOP,
                          tls=config.gearman_tls)
    snapshot = collector.collect()
    snapshot["redis"]["url"] = config.redis_url
    snapshot["acknowledgements"] = _acknowledgements(config)
    return snapshot


def _acknowledgements(config: Config) -> list[str]:
    """What an acknowledgement covers, as a worker starting now would say."""
    try:
        found = durability.for_config(config)
        try:
            return durability.promises(config, durability.verdicts(config, found))
        finally:
            found.close()
    except (durability.SetupError, *REDIS_ERRORS) as exc:
        return [f"a worker would not start: {exc}"]


def render(snap: dict) -> str:
    redis = snap["redis"]
    lines = [f"redis {redis.get('url', '')}"]
    if not redis["up"]:
        lines.append(f"  unreachable: {redis['error']}")
    lines.append("acknowledgements:")
    lines += [f"  {line}" for line in snap.get("acknowledgements", [])]
    lines.append(f"topics ({snap.get('topic_count', 0) + snap.get('pattern_count', 0)}):")
    lines += [f"  {t['topic']:40} {t['subscribers']:>8} subscribers"
              for t in sorted(snap.get("topics", []), key=lambda t: t["topic"])]
    if "delayed" in snap:
        lines.append(f"delayed messages waiting: {snap['delayed']}")
    lines += _retention_lines(snap)
    if audit := snap.get("audit"):
        lines += _audit_lines(audit, snap.get("at", 0))
    workers = snap.get("workers", [])
    lines.append(f"live workers ({len(workers)}):")
    lines += [f"  {w['id']:40} pid {w.get('pid', '?'):>7} jobs {w.get('jobs', '?')}"
              for w in workers]
    servers = snap["gearmand"]
    if len(servers) > 1:
        lines.append(f"queues over all {len(servers)} gearmand:")
        lines += _queue_lines(snap["queues"])
    for server in servers:
        lines.append(f"gearmand {server['server']}:")
        if not server["up"]:
            lines.append(f"  unreachable: {server['error']}")
            continue
        lines += _queue_lines(server["functions"])
    return "\n".join(lines)


AUDIT_NAMED = 10  # findings named (the newest), and topics listed (the most findings)


def _audit_lines(audit: dict, now_s: float) -> list[str]:
    """The audit's line, then where its findings are: per topic, and the
    newest by message id and subscriber (the findings folder has them all)."""
    age = max(0.0, now_s - audit["updated_ms"] / 1000)
    lines = [f"{audit['line']} (updated {age:.0f} s ago)"]
    topics = [(topic, kinds) for topic, kinds in audit.get("topics", {}).items()
              if any(kinds.values())][:AUDIT_NAMED]
    if topics:
        lines.append("  findings by topic:")
        lines += [f"    {topic or '-':40} " + ", ".join(f"{kind} {n}" for kind, n in
                                                        sorted(kinds.items()) if n)
                  for topic, kinds in topics]
    recent = audit.get("recent", [])[-AUDIT_NAMED:]
    if recent:
        lines.append("  newest findings:")
        lines += [f"    {f['kind']}: message {f.get('message_id') or '-'} for "
                  f"{f.get('subscriber')} (topic {f.get('topic')}): {f.get('detail', '')}"
                  for f in reversed(recent)]
    return lines


def _queue_lines(queues: list[dict]) -> list[str]:
    return [f"  {'queue':40} {'queued':>8} {'running':>8} {'workers':>8}"] + [
        f"  {q['queue']:40} {q['queued']:>8} {q['running']:>8} {q['workers']:>8}"
        for q in sorted(queues, key=lambda q: q["queue"])]


def _retention_lines(snap: dict) -> list[str]:
    """The warden's view: the queue store, and the largest subscriber backlogs
    with the oldest copy's age; ``!`` marks one that nobody consumes."""
    lines = []
    store = snap.get("store") or {}
    if store.get("over"):
        lines.append(f"REFUSING FANOUTS: {store['over']}")
    elif int(store.get("max") or 0):
        lines.append(f"queue store: {int(store['used']) / 1048576:.0f} of "
                     f"{int(store['max']) / 1048576:.0f} MiB (fanouts refused from "
                     f"{int(store['guard']) / 1048576:.0f} MiB)")
    backlogs = snap.get("backlogs") or []
    if backlogs:
        lines.append("subscriber backlogs (largest; ! = no consumer):")
        lines.append(f"  {'queue':40} {'queued':>8} {'oldest':>8} {'readers':>7}  limits")
        for b in backlogs:
            age = "-" if b["oldest_age"] is None else f"{b['oldest_age']:.0f}s"
            mark = " " if b["consumers"] else "!"
            lines.append(f"{mark} {b['queue']:40} {b['depth']:>8} {age:>8} "
                         f"{b['consumers']:>7}  {b['limits']}")
    return lines
