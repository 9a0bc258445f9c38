"""Speed benchmarks of oelm: one script per question on a shared harness (README.md lists them).

Run a script from the repository root as a module, e.g. `python -m benchmarks.vs_reference --device cpu
--quick`; the harness (`benchmarks.harness`) holds what every script times with.
"""
