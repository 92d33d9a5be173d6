"""Cost terms: compute, communication, pipeline, memory, and the step-time estimate built from them."""
