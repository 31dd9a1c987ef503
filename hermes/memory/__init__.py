"""The model-free HERMES memory: config, tiers, scoring, smoothing, rope, the cache and its policies."""
