"""The human report: report.html with PNG charts, from small pandas frames."""

from __future__ import annotations

import html
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _chart(path: str, draw) -> str:
    fig, ax = plt.subplots(figsize=(7, 3.2), dpi=100)
    draw(ax)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return os.path.basename(path)


def _volume(ax, volume) -> None:
    if volume.empty:
        ax.text(0.5, 0.5, "no messages", ha="center")
        return
    top = volume.groupby("topic")["copies"].sum().nlargest(8).index
    for topic in top:
        rows = volume[volume["topic"] == topic]
        ax.plot(rows["hour"], rows["copies"], marker="o", label=topic)
    ax.set_title("copies per hour (top topics)")
    ax.legend(fontsize=7)
    ax.figure.autofmt_xdate()


def _width(ax, width) -> None:
    ax.bar(width["width"].astype(str), width["messages"], color="#4a7")
    ax.set_title("fanout width: messages by subscriber count")


def _latency(ax, latency) -> None:
    if latency.empty:
        ax.text(0.5, 0.5, "no deliveries recorded", ha="center")
        return
    x = range(len(latency))
    for offset, col in ((-0.25, "delivery_p50_ms"), (0, "delivery_p95_ms"),
                        (0.25, "delivery_p99_ms")):
        ax.bar([i + offset for i in x], latency[col].fillna(0), width=0.25, label=col)
    ax.set_xticks(list(x), latency["topic"], rotation=30, fontsize=7)
    ax.set_title("delivery latency (ms)")
    ax.legend(fontsize=7)


def _table(frame, limit: int = 50) -> str:
    if frame.empty:
        return "<p><em>none</em></p>"
    return frame.head(limit).to_html(index=False, border=0, classes="t")


def _audit_section(findings) -> str:
    """What the live audit found (``--findings``), beside this reconciliation."""
    if findings is None:
        return ""
    return ("<h2>Live audit findings</h2><p>Copies the live audit (gearhorn audit) judged "
            "not delivered within its deadline, and duplicates, as it found them.</p>"
            + _table(findings))


def write_report(out_dir: str, summary: dict, tables: dict) -> str:
    os.makedirs(out_dir, exist_ok=True)
    charts = [
        _chart(os.path.join(out_dir, "volume.png"), lambda ax: _volume(ax, tables["volume"])),
        _chart(os.path.join(out_dir, "fanout_width.png"),
               lambda ax: _width(ax, tables["fanout_width"])),
        _chart(os.path.join(out_dir, "latency.png"), lambda ax: _latency(ax, tables["latency"])),
    ]
    recon = tables["reconciliation"]
    unaccounted = summary.get("unaccounted", {})
    if not recon.empty:
        verdict = f"{len(recon)} problems found: see the reconciliation."
    elif unaccounted:
        verdict = (f"No loss among tracked subscribers; {sum(unaccounted.values()):,} copies "
                   f"of {len(unaccounted)} untracked Gearman subscribers are unaccounted: "
                   "taken by consumers that record nothing, or lost (the ledger cannot tell).")
    else:
        verdict = ("Nothing lost: every enqueued copy of a tracked subscriber was delivered, "
                   "and every copy of an untracked one is still queued in gearmand.")
    policy = summary.get("policy") or {}
    if policy:
        verdict += (f" Not delivered by policy (the subscriptions' limits, not a loss): "
                    f"{', '.join(f'{n:,} {reason}' for reason, n in sorted(policy.items()))}.")
    stale = tables["subscribers"][tables["subscribers"]["stale"]]
    body = f"""<!doctype html><meta charset="utf-8"><title>gearhorn delivery report</title>
<style>body{{font:14px sans-serif;margin:2em;max-width:60em}} .t td,.t th{{padding:2px 8px}}
.t{{border-collapse:collapse}} .t tr:nth-child(even){{background:#f3f3f3}}</style>
<h1>gearhorn delivery report</h1>
<p>{summary['events']:,} events read, {summary['malformed']:,} malformed rows skipped.</p>
<h2>Reconciliation</h2><p><strong>{html.escape(verdict)}</strong></p>
{_table(recon)}
<h2>Untracked subscribers</h2><p>Plain Gearman consumers record no delivery: their copies
are checked against what gearmand still held at the export.</p>{_table(tables['untracked'])}
<h2>Not delivered by policy</h2><p>Copies a subscription's limits did not keep
(max length or bytes, expired, removed, or refused when full).</p>{_table(tables['policy'])}
{_audit_section(tables.get('audit_findings'))}
<h2>Volume</h2>{''.join(f'<img src="{c}">' for c in charts)}
<h2>Latency per topic</h2>{_table(tables['latency'])}
<h2>Stale subscribers</h2>{_table(stale)}
<h2>Subscribers</h2>{_table(tables['subscribers'])}
<h2>Failures</h2>{_table(tables['failures'])}
"""
    path = os.path.join(out_dir, "report.html")
    with open(path, "w", encoding="utf-8") as fp:
        fp.write(body)
    return path
