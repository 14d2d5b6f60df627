"""Unit tests of the protocol adapters (gateway.protocols)."""
