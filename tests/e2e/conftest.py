"""Fixtures of the end-to-end tests: real exchanges and schedulers over the session's embedded Redis."""
from servers import exchange, start_exchange, start_scheduler  # noqa: F401  (fixtures)
