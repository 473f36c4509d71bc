"""``gearhorn web``: Prometheus metrics, health checks and the live console.

=============  ==========================================================
``snapshot``   what Redis and every gearmand say now, in one JSON-ready dict
``metrics``    a snapshot as Prometheus metric families (prometheus_client)
``history``    per-topic rates over the last minutes (pure)
``access``     who may look and who may act (HTTP Basic, the bridge's users)
``app``        the WSGI app under gevent: routes, Server-Sent Events, actions
=============  ==========================================================
"""
