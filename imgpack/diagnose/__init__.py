"""Diagnostics users run to see and fix data starvation: the meter (``watch``) and ``tune``."""
