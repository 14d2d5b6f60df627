"""Load and overhead benchmarks of speedgate (run as ``python -m loadtests.<name>``)."""
