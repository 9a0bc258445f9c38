"""models components of oelm."""
