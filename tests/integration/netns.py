"""Three test hosts on one machine: a network namespace per node, joined
through the namespace the scenario runs in (which forwards between them),
so that nftables can cut a node off from the others, or silence it
altogether (tests/integration/node_loss.py, minority.py)."""

from __future__ import annotations

import subprocess

NODES = ("10.0.2.2", "10.0.3.2", "10.0.4.2")
TABLE = "gearhorn_netns"


def make_namespaces(tag: str) -> list[str]:
    """A namespace per node with a veth to this one; forwarding between them."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    subprocess.run(["sysctl", "-qw", "net.ipv4.ip_forward=1"], check=True)
    names = []
    for address in NODES:
        n = address.split(".")[2]
        name = f"gh{tag}-{n}"
        commands = [
            ["ip", "netns", "add", name],
            ["ip", "link", "add", f"gh{n}", "type", "veth", "peer", "name", "eth0", "netns", name],
            ["ip", "addr", "add", f"10.0.{n}.1/24", "dev", f"gh{n}"],
            ["ip", "link", "set", f"gh{n}", "up"],
            ["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"],
            ["ip", "netns", "exec", name, "ip", "addr", "add", f"{address}/24", "dev", "eth0"],
            ["ip", "netns", "exec", name, "ip", "link", "set", "eth0", "up"],
            ["ip", "netns", "exec", name, "ip", "route", "add", "default", "via", f"10.0.{n}.1"]]
        names.append(name)
        for command in commands:
            subprocess.run(command, check=True)
    return names


def remove_namespaces(names: list[str]) -> None:
    subprocess.run(["nft", "delete", "table", "inet", TABLE], capture_output=True)
    for name in names:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def _rules(*rules: str) -> None:
    subprocess.run(["nft", f"add table inet {TABLE}"], check=True)
    for hook in ("forward", "input", "output"):
        subprocess.run(["nft", f"add chain inet {TABLE} {hook} "
                               f"{{ type filter hook {hook} priority 0 ; }}"], check=True)
    for rule in rules:
        subprocess.run(["nft", rule], check=True)


def cut_off(address: str) -> None:
    """Drop what crosses between ``address`` and the other nodes (not this
    namespace's own traffic to it: the clients here still reach it)."""
    others = "{ " + ", ".join(a for a in NODES if a != address) + " }"
    _rules(f"add rule inet {TABLE} forward ip saddr {address} ip daddr {others} drop",
           f"add rule inet {TABLE} forward ip saddr {others} ip daddr {address} drop")


def silence(address: str) -> None:
    """Drop every packet to and from ``address``: a node that lost its power
    or its cable, as the others and the clients see it (nothing answers,
    nothing is refused)."""
    rules = [f"add rule inet {TABLE} {hook} ip {side} {address} drop"
             for hook in ("forward", "input", "output") for side in ("saddr", "daddr")]
    _rules(*rules)


def heal() -> None:
    subprocess.run(["nft", "delete", "table", "inet", TABLE], capture_output=True)
