"""The fleet: the engine replicas the gateway serves from and their live state, shared by every
step of the request path. ``pools``: ``Replica`` (health, in-flight, engine load, outlier state),
``Pool`` (one model at one tier) and ``PoolRegistry``; ``outlier``: passive ejection;
``retry_budget``: each pool's retry budget; ``rates``: each pool's measured prefill and decode
rates (tokens/s, for moving or waiting on KV room). Nothing here does I/O: the steps above (routing,
upstream polling, failover) read and update this state.
"""
