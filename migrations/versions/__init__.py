"""Migration scripts, one per schema revision (they never import the live models)."""
