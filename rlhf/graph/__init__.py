"""Experiment graphs as data, knowing no components: fiddle JSON, a deterministic hash, flat params
(`io`), the difference of two graphs (`diff`), and every configured value against its parameter's
annotation (`typecheck`). The runtime, tracking, the preflight and the command line all build on it.
"""
