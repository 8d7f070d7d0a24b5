"""Experiment tracking with Aim, driver-side only (workers return metrics, they never open runs).

- `aim_tracker`: `AimTracker` opens one run per stage; `TrackedRun` tracks metrics, params, texts and
  artifacts, and is indexed the moment it closes.
- `lineage`: the params every run records (graph, hash, fiddle JSON, overrides, git, data, plan).
- `query`: reading runs, metrics, texts and artifacts back.
"""
