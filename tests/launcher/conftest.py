"""Fixtures of the launcher tests: the shared ones (tests/conftest.py) are all they need."""
