"""Observability: per-stream stage timings, Prometheus metrics and OpenTelemetry spans.

Fed by the drivers with what the protocol machines report; may import the protocol layer.
"""
