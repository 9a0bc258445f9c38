"""Small utilities with no oelm dependencies above them: errors, atomic I/O, locks, hub names."""
