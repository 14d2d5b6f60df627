"""The live console: what the pools, tiers and sessions of this gateway process are doing now,
as a page in the browser and the JSON it polls.

Public surface:

- ``routes.install_console(app, sources, gate)``: ``GET /console`` (the page, package data
  ``console.html``: inline JS/CSS, SVG charts drawn by the page, no external asset),
  ``GET /v1/console/state`` (the JSON; admin key when auth is on) and the ``/`` redirect;
- ``snapshot.console_snapshot(sources, window_s=None)`` and ``snapshot.ConsoleSources``: the JSON
  document from the live pools, auto-tier estimates, engine counters and the recorder;
- ``recorder.ConsoleRecorder``: bounded in-memory windows fed once per finished request by the
  accounting step (``observe(rec)``, O(1)): per-pool TTFT and output-speed percentiles, tokens,
  cost, auto decisions, retries/fallbacks/timeouts, sessions;
- the pieces it is built from: ``window.StepRing`` (ring of time buckets), ``sketch.LogSketch``
  (relative-error quantiles), ``sessions.SessionTable`` (LRU of sessions with decayed rates),
  ``incidents.incidents_of`` (retries, fallbacks, timeouts of one request),
  ``engine.EngineRates`` (prefix-cache hit rate and spec-decode acceptance per replica).

Nothing here stores prompt or completion text, and no API key ever enters the state.
"""
