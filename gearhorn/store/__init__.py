"""What gearhorn keeps in Redis: the keys, the registry of subscriptions,
liveness, message headers, hand-outs, tallies, dead letters, the ledger
and the metrics' counters; the Redis connection and the Lua scripts."""
