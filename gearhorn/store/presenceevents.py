"""Presence events: who joined or left a topic, broadcast on a topic of its
own (``presence_events``). Workers, the warden, the janitor and bridges all
change subscriptions through a Registry; its ``changed`` hook is this."""

from __future__ import annotations

import logging
import threading
import time
import uuid

from gearhorn import gearman
from gearhorn.config import Config
from gearhorn.rules.messages import Subscription, presence_event

log = logging.getLogger(__name__)


class PresenceEvents:
    """Submits one background ``fanout`` per change, on a Gearman client of
    its own (a registry is used from several threads)."""

    def __init__(self, config: Config) -> None:
        self.prefix = config.presence_topic_prefix
        self._client = gearman.Client(config.gearman_servers, tls=config.gearman_tls)
        self._lock = threading.Lock()

    def __call__(self, sub: Subscription, joined: bool) -> None:
        job = presence_event(self.prefix, sub, joined, time.time())
        if job is None:
            return
        try:
            with self._lock:
                self._client.submit_background(
                    [gearman.Copy("fanout", f"presence:{uuid.uuid4().hex}", job)])
        except gearman.GearmanError as exc:  # the change stands; only its event is lost
            log.warning("presence event of %s on %s not sent: %s", sub.client_id, sub.topic,
                        exc)

    def close(self) -> None:
        self._client.close()


def announce_changes(config: Config, *registries) -> PresenceEvents | None:
    """Hook presence events into ``registries`` if the config asks for them."""
    if not config.presence_events:
        return None
    events = PresenceEvents(config)
    for registry in registries:
        registry.changed = events
    return events
