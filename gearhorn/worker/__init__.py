"""The fanout worker: the service (the three Gearman functions), the
process and its pool, the subscriber cache, delayed messages, the janitor,
and the warden of bounded queues."""
