"""training components of oelm."""
