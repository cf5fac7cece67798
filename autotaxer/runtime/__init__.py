"""Runtime pieces: dispatch, its tables and lookup, the custom ops and autograd."""
