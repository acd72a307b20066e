"""Fixtures of the research tests (mrl_research: the benches, the lab, the exchange demo): the shared ones
(tests/conftest.py, tests/helpers.py) are all they need."""
