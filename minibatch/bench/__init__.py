"""Benchmarks (``mb bench ...``): speed is measured here, never asserted in tests."""
