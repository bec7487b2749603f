"""Where a run's time goes: the bottleneck doctor and the profiler command (top layer, beside bench/cli)."""
