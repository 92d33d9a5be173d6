"""Validation of the cost model against measured training runs."""
