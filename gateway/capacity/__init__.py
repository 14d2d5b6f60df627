"""KV-cache capacity: bytes per token from a model's config (``footprint``), named
architectures (``presets``), and what one replica holds (``planner``)."""
