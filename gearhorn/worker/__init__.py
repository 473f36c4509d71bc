"""The fanout worker: the service (the three Gearman functions), the
process and its pool, the subscriber cache, delayed messages, the janitor,
the warden of bounded queues and the mending of gearmand's replay."""
