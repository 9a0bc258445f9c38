"""The method: registry and records, apply/state, optimizer groups, targets, adapters, schedules, audit, FLOPs, orthogonal init."""
