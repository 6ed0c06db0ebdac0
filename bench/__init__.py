"""Benchmark scripts and their helpers; not installed with jaxremat.

The scripts run from the repository root (``PYTHONPATH=. python bench/memory.py``) and
import each other by module name; tests import helpers as ``bench.<module>``.
"""
