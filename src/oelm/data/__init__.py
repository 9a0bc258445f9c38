"""data components of oelm."""
