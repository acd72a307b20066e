"""Fixtures of the integration tests: real exchange and THL servers over the session's embedded Redis."""
from servers import align, exchange, start_exchange  # noqa: F401  (fixtures)
