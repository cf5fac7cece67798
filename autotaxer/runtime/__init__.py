"""Runtime pieces: the Iris symmetric heap and (later) dispatch tables."""
