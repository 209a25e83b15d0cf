"""NumPy references of every operation: the executable specification and the CPU path."""
