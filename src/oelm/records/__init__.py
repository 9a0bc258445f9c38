"""Everything on disk about a run and a sweep, owned in one place.

`run` (results.json's schema, a run's status, loading run directories and compact records),
`layout` (the sweep's run-directory layout, built and parsed here only), `artifacts` (typed
readers of freeze_audit.json and timing_stats.json), `sweep` (the sweep record, SWEEP/sweep.yaml),
`plan` (the confirmation plan) and `compact` (the small committed record of one run). Every writer
and reader imports these; nothing else parses these files.
"""
