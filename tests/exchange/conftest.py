"""Fixtures of the exchange tests: real exchange servers over the session's embedded Redis."""
from servers import exchange, start_exchange  # noqa: F401  (fixtures)
