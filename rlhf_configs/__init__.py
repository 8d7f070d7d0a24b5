"""Reusable graph pieces (models, policy groups, runtimes) and shared fiddlers for experiments."""
