"""Engines for speedgate: vLLM launch profiles and the CPU engine simulator (``engines.sim``)."""
