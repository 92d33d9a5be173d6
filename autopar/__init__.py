"""autopar: an automatic parallelism planner for LLM training."""

__version__ = "0.1.0"
