"""mrl_serving.embedded_redis: a data folder too deep for a unix socket path still gets its Redis."""
import redis

from mrl_serving.embedded_redis import EmbeddedRedis


def test_a_deep_data_dir_gets_a_short_socket_and_keeps_its_data_there(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)              # data_dir/redis.sock would pass sun_path's 108 bytes
    server = EmbeddedRedis(deep)
    with server as url:
        assert len(url) < 108 and not url.endswith(f"{deep}/redis.sock")
        redis.Redis.from_url(url).set("k", "v")
        socket = server.socket
    assert (deep / "redis.log").is_file() and any(deep.glob("appendonly*"))   # the data stays in data_dir
    assert not socket.parent.exists()                                        # the socket's folder is removed
    with EmbeddedRedis(deep) as url:                                         # a second start finds the data
        assert redis.Redis.from_url(url).get("k") == b"v"
