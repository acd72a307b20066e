"""Fixtures of the scheduler tests: real schedulers over the session's embedded Redis."""
from servers import start_scheduler  # noqa: F401  (fixtures)
