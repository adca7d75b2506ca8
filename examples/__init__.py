"""Runnable integrations of lowlat-mw (run them from the repository root)."""
