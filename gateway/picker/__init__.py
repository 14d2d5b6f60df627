"""Picker mode: speedgate as the endpoint picker of an Envoy-based gateway (Gateway API
Inference Extension), over Envoy's ``ext_proc`` gRPC protocol. Envoy carries the bytes;
speedgate decides where they go with its own admission, tier and routing code.

- ``messages``: the protocol's ext_proc messages (the pick, the subset hint, the served
  endpoint, immediate errors, body chunks);
- ``decide``: one request's decision and the feedback of its answer to the ledgers;
- ``usage_tap``: usage read from a response body streamed to the picker;
- ``stream``: one ext_proc stream (one HTTP request), in full-duplex or buffered body mode;
- ``runtime``: the gateway parts a picker runs (pools, probes, routing, admission, keys);
- ``kube``: endpoints from the Kubernetes API (the pool's pods, watched; tier by label);
- ``envoy``: a static Envoy bootstrap for picker mode and its launcher (tests, benchmark);
- ``grpc_server``: the gRPC server (ext_proc and health) and ``serve_picker``.
"""
