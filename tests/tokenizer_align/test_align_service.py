"""The TokenizerAlign service over real gRPC and HTTP: align, batch, registry confinement, bad input."""
import math
import os

import grpc
import httpx
import numpy as np
import pytest

from servers import RunningServer
from mrl.v1 import tokenizer_align_pb2 as tpb
from mrl.v1 import tokenizer_align_pb2_grpc
from mrl_tokenizer_align.app import AlignServer
from mrl_tokenizer_align.catalog import cache_dir, cached_paths
from mrl_tokenizer_align.settings import AlignSettings

TEXT = "The answer is 395. 😀 日本語 café"


@pytest.fixture(scope="module")
def hostile_root(tmp_path_factory):
    """A second allowed root holding what a path may hit: a symlink loop."""
    root = tmp_path_factory.mktemp("hostile")
    os.symlink(root / "loop.tiktoken", root / "loop.tiktoken")
    return root


@pytest.fixture(scope="module")
def service(hostile_root):
    paths = cached_paths()
    missing = {"gpt2", "mistral-v1", "minilm"} - set(paths)
    assert not missing, f"tokenizers {sorted(missing)} are not cached in {cache_dir()}: run `make tokenizers`"
    settings = AlignSettings(port=0, admin_port=0, tokenizers={k: paths[k] for k in ("gpt2", "mistral-v1", "minilm")},
                             tokenizer_roots=[cache_dir(), hostile_root], max_ids=4096, max_batch=8)
    running = RunningServer(lambda: AlignServer(settings))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def stub(service):
    with grpc.insecure_channel(service.target) as channel:
        yield tokenizer_align_pb2_grpc.TokenizerAlignStub(channel)


def gpt2_ids(service, text=TEXT):
    return service.server.aligner.registry.get("gpt2").encode(text).tolist()


def request(service, **overrides):
    ids = gpt2_ids(service)
    fields = dict(source_tokenizer_id="gpt2", source_ids=ids, target_tokenizer_id="mistral-v1",
                  traces=[tpb.Trace(name="logprobs", values=[-0.25] * len(ids), reduction=tpb.TRACE_REDUCTION_SUM),
                          tpb.Trace(name="mask", values=[1.0] * len(ids), reduction=tpb.TRACE_REDUCTION_ALL)])
    fields.update(overrides)
    return tpb.AlignRequest(**fields)


def test_align_over_grpc_is_lossless_and_conserves_log_probs(service, stub):
    req = request(service)
    resp = stub.Align(req)
    mistral = service.server.aligner.registry.get("mistral-v1")
    assert resp.text == TEXT
    assert list(resp.target_ids) == mistral.encode(TEXT).tolist()
    assert resp.residual.lossless and resp.residual.chunks > 0
    assert math.isclose(sum(resp.traces[0].values), -0.25 * len(req.source_ids), rel_tol=1e-6)
    assert set(resp.traces[1].values) == {1.0}
    assert len(resp.source_chunk) == len(req.source_ids) and len(resp.target_chunk) == len(resp.target_ids)


def test_align_batch_and_aggregate(service, stub):
    reqs = [request(service), request(service, target_tokenizer_id="minilm")]
    resp = stub.AlignBatch(tpb.AlignBatchRequest(requests=reqs))
    assert [r.residual.lossless for r in resp.responses] == [True, False]
    assert resp.aggregate.lossless is False and resp.aggregate.normalizer_mismatch is True
    assert resp.aggregate.chunks == sum(r.residual.chunks for r in resp.responses)


def test_list_tokenizers(stub):
    infos = {t.tokenizer_id: t for t in stub.ListTokenizers(tpb.ListTokenizersRequest()).tokenizers}
    assert set(infos) == {"gpt2", "mistral-v1", "minilm"}
    assert (infos["minilm"].family, infos["minilm"].byte_exact) == ("wordpiece", False)
    assert infos["gpt2"].vocab_size == 50257 and len(infos["gpt2"].content_sha256) == 64


def test_rest_twin_answers_like_grpc(service, stub):
    from google.protobuf import json_format
    req = request(service)
    body = json_format.MessageToDict(req, preserving_proto_field_name=True)
    r = httpx.post(f"{service.admin}/v1/align", json=body)
    assert r.status_code == 200, r.text
    assert json_format.ParseDict(r.json(), tpb.AlignResponse()) == stub.Align(req)
    assert httpx.get(f"{service.admin}/v1/tokenizers").status_code == 200
    assert httpx.post(f"{service.admin}/v1/align", content=b"not json").status_code == 400
    bad = httpx.post(f"{service.admin}/v1/align", json={**body, "source_tokenizer_id": "nope"})
    assert bad.status_code == 400 and "unknown tokenizer 'nope'" in bad.json()["detail"]


def test_register_reads_only_under_allowed_roots(service, stub, tmp_path):
    root = cache_dir()
    ok = stub.RegisterTokenizer(tpb.RegisterTokenizerRequest(tokenizer_id="gpt2-again", path=str(root / "gpt2.tiktoken")))
    assert ok.tokenizer.vocab_size == 50257
    link = tmp_path / "escape"
    outside = [("/etc/passwd", grpc.StatusCode.PERMISSION_DENIED),
               (str(root / ".." / ".." / ".." / "etc" / "passwd"), grpc.StatusCode.PERMISSION_DENIED),
               (str(tmp_path), grpc.StatusCode.PERMISSION_DENIED),
               (str(root / "does-not-exist.tiktoken"), grpc.StatusCode.NOT_FOUND),
               ("", grpc.StatusCode.INVALID_ARGUMENT)]
    os.symlink("/etc", link)
    outside.append((str(link / "passwd"), grpc.StatusCode.PERMISSION_DENIED))
    for path, code in outside:
        with pytest.raises(grpc.RpcError) as info:
            stub.RegisterTokenizer(tpb.RegisterTokenizerRequest(tokenizer_id="evil", path=path))
        assert info.value.code() == code, (path, info.value.details())
    assert "evil" not in {t.tokenizer_id for t in stub.ListTokenizers(tpb.ListTokenizersRequest()).tokenizers}


@pytest.mark.parametrize("overrides, fragment", [
    ({"source_tokenizer_id": "nope"}, "unknown tokenizer 'nope'"),
    ({"target_tokenizer_id": "nope"}, "unknown tokenizer 'nope'"),
    ({"source_ids": [50257]}, "token id 50257 is outside the vocabulary of 'gpt2'"),
    ({"traces": [tpb.Trace(name="logprobs", values=[0.0])]}, "trace 'logprobs' has 1 values for"),
    ({"source_ids": [464, 3280], "traces": [tpb.Trace(name="lp", values=[0.0, math.nan])]}, "trace 'lp'[1] is nan"),
    ({"source_ids": [464], "traces": [tpb.Trace(name="lp", values=[0.0], reduction=42)]}, "unknown reduction 42"),
    ({"source_ids": [464] * 4097, "traces": []}, "at most 4096 per alignment"),
    ({"target_prompt_ids": [10**6]}, "target_prompt_ids: token id 1000000 is outside the vocabulary"),
    ({"source_tokenizer_id": "x" * 100_000}, "unknown tokenizer 'xxx"),
    ({"source_ids": [464], "traces": [tpb.Trace(name="n" * 100_000, values=[0.0, 1.0])]}, "has 2 values for 1"),
], ids=["unknown-source", "unknown-target", "id-outside-vocab", "trace-length", "nan-trace", "unknown-reduction",
        "too-many-ids", "prompt-id-outside-vocab", "huge-tokenizer-id", "huge-trace-name"])
def test_bad_input_is_invalid_argument(service, stub, overrides, fragment):
    with pytest.raises(grpc.RpcError) as info:
        stub.Align(request(service, **overrides))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()[:200]
    assert fragment in info.value.details() and len(info.value.details()) < 1000  # a value is echoed shortened


def test_oversize_batch_is_invalid_argument(service, stub):
    with pytest.raises(grpc.RpcError) as info:
        stub.AlignBatch(tpb.AlignBatchRequest(requests=[request(service)] * 9))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "at most 8" in info.value.details()


def test_token_bytes_gather_matches_per_token_concatenation(service):
    gpt2 = service.server.aligner.registry.get("gpt2")
    ids = np.asarray(gpt2_ids(service))
    per_token = b"".join(gpt2.buf[gpt2.starts[i]:gpt2.starts[i] + gpt2.lens[i]].tobytes() for i in ids)
    assert gpt2.token_bytes(ids) == per_token == TEXT.encode()


def test_auth_policy_may_align_only_admin_registers(tmp_path):
    import yaml
    from mrl.auth import hash_token
    tokens = {"policy-a": "tok-policy", "admin": "tok-admin"}
    path = tmp_path / "auth.yaml"
    path.write_text(yaml.safe_dump({"principals": [
        {"name": "policy-a", "role": "policy", "policy": "policy-a", "token_sha256": hash_token(tokens["policy-a"])},
        {"name": "admin", "role": "admin", "token_sha256": hash_token(tokens["admin"])}]}))
    gpt2 = cached_paths()["gpt2"]
    settings = AlignSettings(port=0, admin_port=0, auth_file=path, tokenizers={"gpt2": gpt2})
    running = RunningServer(lambda: AlignServer(settings))
    try:
        with grpc.insecure_channel(running.target) as channel:
            stub = tokenizer_align_pb2_grpc.TokenizerAlignStub(channel)
            req = tpb.AlignRequest(source_tokenizer_id="gpt2", source_ids=[464], target_tokenizer_id="gpt2")
            register = tpb.RegisterTokenizerRequest(tokenizer_id="again", path=str(gpt2))
            with pytest.raises(grpc.RpcError) as info:
                stub.Align(req)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert stub.Align(req, metadata=[("authorization", "Bearer tok-policy")]).text == "The"
            with pytest.raises(grpc.RpcError) as info:
                stub.RegisterTokenizer(register, metadata=[("authorization", "Bearer tok-policy")])
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert stub.RegisterTokenizer(register, metadata=[("authorization", "Bearer tok-admin")]).tokenizer.vocab_size
        assert httpx.get(f"{running.admin}/v1/tokenizers").status_code == 401
        assert httpx.post(f"{running.admin}/v1/tokenizers", headers={"authorization": "Bearer tok-policy"},
                          json={"tokenizer_id": "x", "path": str(gpt2)}).status_code == 403
    finally:
        running.stop()


def test_rest_bodies_are_capped_and_never_a_server_error(tmp_path):
    settings = AlignSettings(port=0, admin_port=0, tokenizers={"gpt2": cached_paths()["gpt2"]},
                             max_message_bytes=256 * 1024)
    running = RunningServer(lambda: AlignServer(settings))
    try:
        url = f"{running.admin}/v1/align"
        big = httpx.post(url, content=b"{" + b" " * (300 * 1024) + b"}", headers={"content-type": "application/json"})
        assert big.status_code == 400 and "at most 262144" in big.json()["detail"]
        deep = httpx.post(url, content=b"[" * 100_000)
        assert deep.status_code == 400
        wrong = httpx.post(url, json={"source_ids": "not a list"})
        assert wrong.status_code == 400 and "malformed AlignRequest" in wrong.json()["detail"]
    finally:
        running.stop()


def test_batch_id_budget_is_checked_before_any_work(service, stub):
    service.server.aligner.settings.max_batch_ids, old = 100, service.server.aligner.settings.max_batch_ids
    try:
        with pytest.raises(grpc.RpcError) as info:
            stub.AlignBatch(tpb.AlignBatchRequest(requests=[request(service, traces=[], source_ids=[464] * 60)] * 2))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "at most 100" in info.value.details()
    finally:
        service.server.aligner.settings.max_batch_ids = old


def test_a_symlinked_sidecar_outside_the_roots_is_refused(tmp_path):
    import shutil
    from mrl_tokenizer_align.registry import TokenizerRegistry
    from mrl.errors import PermissionDenied
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    shutil.copy(cached_paths()["gpt2"], root / "gpt2.tiktoken")
    (outside / "side.json").write_text('{"pattern": "."}')
    os.symlink(outside / "side.json", root / "gpt2.tiktoken.json")
    with pytest.raises(PermissionDenied, match="not a regular file under the allowed tokenizer roots"):
        TokenizerRegistry([root]).register("evil", root / "gpt2.tiktoken")


def test_rest_enum_out_of_range_is_refused_not_wrapped(service):
    from google.protobuf import json_format
    body = json_format.MessageToDict(request(service), preserving_proto_field_name=True)
    body["traces"][0]["reduction"] = 2**32 + 2
    r = httpx.post(f"{service.admin}/v1/align", json=body)
    assert r.status_code == 400 and "is not a TraceReduction" in r.json()["detail"]


@pytest.mark.parametrize("make_path, fragment", [
    (lambda root, hostile: str(root / "gpt2.tiktoken") + "\x00", "null byte"),
    (lambda root, hostile: "\x00", "null byte"),
    (lambda root, hostile: str(root / ("a" * 300 + ".tiktoken")), "File name too long"),
    (lambda root, hostile: str(root) + "/a" * 3000, "too long"),
    (lambda root, hostile: str(hostile / "loop.tiktoken"), "loop"),
], ids=["nul-after-a-real-file", "nul-alone", "name-too-long", "path-too-long", "symlink-loop"])
def test_register_a_path_that_cannot_be_used_is_invalid_argument(service, stub, hostile_root, make_path, fragment):
    """Over gRPC and REST: INVALID_ARGUMENT / 400 with the reason, never UNKNOWN / 500; nothing registered."""
    path = make_path(cache_dir(), hostile_root)
    with pytest.raises(grpc.RpcError) as info:
        stub.RegisterTokenizer(tpb.RegisterTokenizerRequest(tokenizer_id="hostile", path=path))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert fragment in info.value.details() and len(info.value.details()) < 1000
    r = httpx.post(f"{service.admin}/v1/tokenizers", json={"tokenizer_id": "hostile", "path": path})
    assert r.status_code == 400 and fragment in r.json()["detail"], r.text
    listed = {t.tokenizer_id for t in stub.ListTokenizers(tpb.ListTokenizersRequest()).tokenizers}
    assert "hostile" not in listed and {"gpt2", "mistral-v1", "minilm"} <= listed
    assert stub.Align(request(service)).residual.lossless


def test_a_huge_path_is_refused_with_a_short_message(service, stub):
    """A path or an id is quoted shortened: a long one is refused with its own status, not with one whose
    details overflow gRPC's metadata limit (RESOURCE_EXHAUSTED on the client), and a path longer than any
    file's is refused before it is resolved (time quadratic in its length)."""
    gpt2 = str(cache_dir() / "gpt2.tiktoken")
    for tokenizer_id, path, code, http in (
            ("hostile", "/etc/" + "a" * 4000, grpc.StatusCode.PERMISSION_DENIED, 403),
            ("hostile", "/etc/" + "a" * 200_000, grpc.StatusCode.INVALID_ARGUMENT, 400),
            ("hostile", str(cache_dir()) + "/a" * 100_000, grpc.StatusCode.INVALID_ARGUMENT, 400),
            ("x" * 200_000, gpt2, grpc.StatusCode.INVALID_ARGUMENT, 400)):
        with pytest.raises(grpc.RpcError) as info:
            stub.RegisterTokenizer(tpb.RegisterTokenizerRequest(tokenizer_id=tokenizer_id, path=path))
        assert info.value.code() == code and len(info.value.details()) < 1000, info.value.details()[:200]
        r = httpx.post(f"{service.admin}/v1/tokenizers", json={"tokenizer_id": tokenizer_id, "path": path})
        assert r.status_code == http and len(r.text) < 1000, r.text[:200]


def test_invalid_utf8_in_the_middle_and_at_the_end_over_grpc(service, stub):
    """AlignResponse.text keeps every valid byte and leaves out each invalid sequence, wherever it is."""
    gpt2 = service.server.aligner.registry.get("gpt2")
    ids = (gpt2.encode("abc").tolist() + gpt2.encode("\u00ff").tolist()[:1] + gpt2.encode(" déf").tolist()
           + gpt2.encode("😀").tolist()[:1])
    resp = stub.Align(request(service, source_ids=ids, traces=[]))
    assert resp.text == "abc déf"
    r = resp.residual
    assert (r.invalid_utf8_bytes, r.dropped_bytes, r.lossless, r.truncated) == (4, 4, False, True)
