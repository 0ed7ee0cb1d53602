"""Evaluations of a trained encoder; `python -m bertjax.evaluate NAME` runs one."""
