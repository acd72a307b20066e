"""mrl.auth in-process: tokens and their hashes, the auth file, bearer credentials, per-policy authorization."""
import pytest
import yaml

from mrl.auth import ANONYMOUS, Authenticator, Principal, hash_token, is_loopback, new_token
from mrl.errors import InvalidArgument, PermissionDenied, Unauthenticated


def _file(tmp_path, principals) -> Authenticator:
    path = tmp_path / "auth.yaml"
    path.write_text(yaml.safe_dump({"principals": principals}))
    return Authenticator.from_file(path)


def test_tokens_are_random_and_only_their_sha256_is_kept():
    a, b = new_token(), new_token()
    assert a != b and len(a) >= 32
    assert len(hash_token(a)) == 64 and hash_token(a) != a and hash_token(a) == hash_token(a)


def test_bearer_token_maps_to_its_principal(tmp_path):
    token = new_token()
    auth = _file(tmp_path, [{"name": "lab-b", "role": "policy", "policy": "qwen", "token_sha256": hash_token(token)}])
    assert auth.authenticate(f"Bearer {token}").name == "lab-b"
    assert auth.authenticate(f"bearer {token}").policy == "qwen"
    for bad in (None, "", "Basic abc", "Bearer", f"Bearer {new_token()}"):
        with pytest.raises(Unauthenticated):
            auth.authenticate(bad)


def test_no_auth_file_means_anonymous_admin():
    auth = Authenticator.from_file(None)
    assert not auth.enabled and auth.authenticate(None) is ANONYMOUS


def test_a_policy_acts_only_as_itself_in_its_runs():
    p = Principal(name="lab-b", role="policy", policy="qwen", runs=["run-7"], token_sha256="a" * 64)
    p.require_policy("qwen", "run-7", "publish")
    with pytest.raises(PermissionDenied, match="only as policy 'qwen'"):
        p.require_policy("llama", "run-7", "publish")
    with pytest.raises(PermissionDenied, match="run-8"):
        p.require_policy("qwen", "run-8", "publish")
    with pytest.raises(PermissionDenied):
        p.require_admin()
    Principal(name="ops", role="admin", token_sha256="b" * 64).require_policy("anyone", "any-run", "ack")


@pytest.mark.parametrize("principals, message", [
    ([{"name": "x", "role": "policy", "token_sha256": "a" * 64}], "no 'policy' id"),
    ([{"name": "x", "role": "root", "token_sha256": "a" * 64}], "role"),
    ([{"name": "x", "role": "admin", "token_sha256": "a-pasted-token"}], "token_sha256"),
    ([{"name": "x", "role": "policy", "policy": "Bearer a-pasted-token", "token_sha256": "a" * 64}],
     "not a valid policy id"),
    ([{"name": "x", "role": "admin", "runs": ["a-pasted-token "], "token_sha256": "a" * 64}], "not a valid run id"),
    ([{"name": "x", "role": "admin", "token_sha256": "a" * 64}, {"name": "y", "role": "admin",
                                                                 "token_sha256": "a" * 64}], "share a token hash"),
])
def test_a_bad_auth_file_is_invalid_argument_without_echoing_values(tmp_path, principals, message):
    with pytest.raises(InvalidArgument, match=message) as exc:
        _file(tmp_path, principals)
    assert "a-pasted-token" not in str(exc.value)


def test_an_unreadable_auth_file_is_invalid_argument(tmp_path):
    with pytest.raises(InvalidArgument):
        Authenticator.from_file(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(InvalidArgument, match="mapping"):
        Authenticator.from_file(tmp_path / "list.yaml")


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("::1", True), ("[::1]", True),
                                            ("localhost", True), ("0.0.0.0", False), ("10.0.0.2", False),
                                            ("example.org", False)])
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback
