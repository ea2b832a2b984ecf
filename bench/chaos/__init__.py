"""The fault harness (``python -m bench.chaos``); see ``bench/chaos/run.py``."""
