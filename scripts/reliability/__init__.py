"""Reliability drivers (`make test-reliability`): each prints a markdown report with a pass/fail
line per criterion and exits 1 when one fails; tests/scripts runs their fast versions.

- `overload.py`: 3x the measured capacity for 60 s: queue bound, fast 503s, goodput, degradation
  levels with hysteresis, openai SDK retries.
- `keys_burst.py`: ten API keys with their own limits, one of them noisy: per-key limits hold and
  the quiet keys are not starved.
- `soak.py`: mixed load for minutes: RSS growth, unexpected errors, gauges back to idle,
  tracemalloc's top allocation sites at start and end.
- `common.py`: the server process, /metrics sampling, RSS, one request, the report.
"""
