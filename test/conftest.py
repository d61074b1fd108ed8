"""Shared pytest configuration for the spconv tests."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tests import the _reference helpers

# ---- hypothesis: a short, reproducible profile for CI; `pytest --hypothesis-profile=long` for deep runs ----
try:
    from hypothesis import HealthCheck, settings
except ImportError:  # pragma: no cover - test_fuzz.py skips itself without hypothesis
    pass
else:
    _SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
    settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True, database=None,
                              suppress_health_check=_SLOW_OK)
    settings.register_profile("long", max_examples=1000, deadline=None, suppress_health_check=_SLOW_OK)
    settings.load_profile(os.getenv("SPCONV_HYPOTHESIS_PROFILE", "ci"))
