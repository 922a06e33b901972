"""Scripts the tests run in fresh processes (devices are fixed once per process)."""
