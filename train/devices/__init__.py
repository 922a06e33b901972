"""Devices, then the distribution strategy, in that order (`runtime`), the multi-worker one made within a
start-up deadline (`runtime.StartupDeadline`); the one seam for TensorFlow's device calls, which tests replace with
fake GPUs (`backend`); and the host's memory left (`host_memory`)."""
