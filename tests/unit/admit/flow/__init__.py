"""Unit tests of flow control: the queue discipline, fairness, shedding, bands (pure)."""
