"""Thin per-framework adapters, installed as ``lowlat_mw.adapters.<framework>``."""
