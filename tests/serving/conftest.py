"""Fixtures of the serving-plumbing tests: the shared ones (tests/conftest.py) are all they need."""
