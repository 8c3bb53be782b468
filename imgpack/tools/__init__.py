"""Measuring and tuning tools built on the reader."""
