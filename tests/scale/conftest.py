"""Fixtures of the scale tests: a real 3-master Redis Cluster, exchange and scheduler servers (on the session's
embedded Redis unless told another `redis_url`)."""
import pytest

from redis_cluster import LocalCluster
from servers import start_exchange, start_scheduler  # noqa: F401  (fixtures)


@pytest.fixture(scope="session")
def cluster_url(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("cluster"), masters=3) as url:
        yield url
