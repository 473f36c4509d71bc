-- Whether a real-time topic's history is kept now (it has readers, or had
-- them lately: lua/history_readers.lua). One key, so a slot being moved
-- answers it (ASK, then the new owner) where the three-key append would
-- get TRYAGAIN until the move ends for a topic whose keys exist nowhere.
-- KEYS[1] the history's offset and epoch (<p>history-meta:{T})
return redis.call('HEXISTS', KEYS[1], 'epoch')
