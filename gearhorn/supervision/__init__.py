"""The servers gearhorn starts and looks after: Redis with the syncer of its
fsync barrier beside it (``servers``, ``aofsync``), a torn append-only file
cut back after a power cut (``aofrepair``), gear's Python Gearman server
where C gearmand is missing (``gearserver``), and the upgrade of an older
data directory (``queueupgrade``).
"""
