"""experiments components of oelm."""
