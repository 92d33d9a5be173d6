"""Measured runs (dataset), their prediction (runner) and the error summary `autopar validate` prints."""
