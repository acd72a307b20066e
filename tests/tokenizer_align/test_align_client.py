"""AlignClient against the real TokenizerAlign service over a real socket: SmolLM2 -> GPT-2, batches split
across RPCs, errors as mrl.errors classes, retries while unreachable, the bearer token."""
import json
import math
import socket

import pytest
import tiktoken
from tiktoken.load import load_tiktoken_bpe
from tokenizers import Tokenizer

from servers import RunningServer
from mrl import errors
from mrl.align_client import AlignClient, Aligned, AlignJob
from mrl.grpc_client import Backoff
from mrl_tokenizer_align.app import AlignServer
from mrl_tokenizer_align.catalog import cache_dir, cached_paths
from mrl_tokenizer_align.settings import AlignSettings

TEXT = "The answer is 395. 😀 日本語 café\n  Second line:\tdone."
SERVER_MAX_BATCH = 8


@pytest.fixture(scope="module")
def paths():
    paths = cached_paths()
    missing = {"gpt2", "smollm2"} - set(paths)
    assert not missing, f"tokenizers {sorted(missing)} are not cached in {cache_dir()}: run `make tokenizers`"
    return paths


@pytest.fixture(scope="module")
def service(paths):
    settings = AlignSettings(port=0, admin_port=0, tokenizers={k: paths[k] for k in ("gpt2", "smollm2")},
                             max_batch=SERVER_MAX_BATCH)
    running = RunningServer(lambda: AlignServer(settings))
    yield running
    running.stop()


@pytest.fixture
def client(service):
    with AlignClient(service.target, backoff=Backoff(base_s=0.01, cap_s=0.05, attempts=3)) as c:
        yield c


@pytest.fixture(scope="module")
def smollm2(paths):
    """SmolLM2's own HF tokenizer (not the service's tables)."""
    return Tokenizer.from_file(str(paths["smollm2"] / "tokenizer.json"))


@pytest.fixture(scope="module")
def gpt2(paths):
    """GPT-2's encoding: tiktoken over the cached ranks, with the sidecar's regex (not the service's tables)."""
    path = paths["gpt2"]
    meta = json.loads(path.with_name(path.name + ".json").read_text())
    return tiktoken.Encoding("gpt2", pat_str=meta["pattern"], mergeable_ranks=load_tiktoken_bpe(str(path)),
                             special_tokens=meta["special_tokens"])


def smol_ids(smollm2, text=TEXT) -> list[int]:
    return smollm2.encode(text, add_special_tokens=False).ids


def test_smollm2_to_gpt2_round_trips_text_and_matches_gpt2s_encoding(client, smollm2, gpt2):
    ids = smol_ids(smollm2)
    a = client.align("smollm2", ids, "gpt2")
    assert isinstance(a, Aligned)
    assert a.text == TEXT
    assert a.target_ids == gpt2.encode_ordinary(TEXT)
    assert a.lossless and a.residual.lossless and a.residual.chunks > 0
    assert len(a.source_chunk) == len(ids) and len(a.target_chunk) == len(a.target_ids)


def test_log_probs_sum_is_preserved_and_traces_sit_on_the_target_ids(client, smollm2):
    ids = smol_ids(smollm2)
    logprobs = [-0.05 * (1 + i % 7) for i in range(len(ids))]
    a = client.align("smollm2", ids, "gpt2", traces={"logprobs": logprobs, "mask": [1.0] * len(ids)},
                     reductions={"mask": "all"})
    assert set(a.traces) == {"logprobs", "mask"}
    assert len(a.traces["logprobs"]) == len(a.target_ids) == len(a.traces["mask"])
    assert math.isclose(sum(a.traces["logprobs"]), sum(logprobs), rel_tol=1e-5)  # float32 on the wire
    assert set(a.traces["mask"]) == {1.0}


def test_target_prompt_ids_are_left_out_of_the_response(client, smollm2, gpt2):
    prompt = gpt2.encode_ordinary("Question: what is 390 + 5?\n")
    ids = smol_ids(smollm2)
    with_prompt = client.align("smollm2", ids, "gpt2", {"logprobs": [-1.0] * len(ids)}, target_prompt_ids=prompt)
    alone = client.align("smollm2", ids, "gpt2", {"logprobs": [-1.0] * len(ids)})
    assert with_prompt.target_ids == alone.target_ids == gpt2.encode_ordinary(TEXT)
    assert with_prompt.traces == alone.traces and with_prompt.text == alone.text == TEXT


def test_batch_split_across_rpcs_equals_one_rpc_and_single_aligns(client, smollm2):
    texts = [f"{i} + {i} = {2 * i}. ✓ {'é' * i}" for i in range(SERVER_MAX_BATCH - 1)]
    ids = [smol_ids(smollm2, t) for t in texts]
    jobs = [AlignJob("smollm2", x, "gpt2", {"logprobs": [-0.5] * len(x)}) for x in ids]
    as_dicts = [{"source_tokenizer_id": "smollm2", "source_ids": x, "target_tokenizer_id": "gpt2",
                 "traces": {"logprobs": [-0.5] * len(x)}} for x in ids]
    rpcs = []
    real = client._stub.AlignBatch
    client._stub.AlignBatch = lambda req, **kw: rpcs.append(len(req.requests)) or real(req, **kw)

    def batch(jobs, **kw):
        rpcs.clear()
        return client.align_batch(jobs, **kw), list(rpcs)

    one, sizes = batch(jobs)
    assert sizes == [len(jobs)]
    split, sizes = batch(jobs, max_batch=3)
    assert sizes == [3, 3, 1]
    by_ids, sizes = batch(as_dicts, max_batch_ids=2 * max(map(len, ids)))
    assert len(sizes) > 2 and sum(sizes) == len(jobs)
    assert one == split == by_ids
    assert [a.text for a in one] == texts
    assert [client.align("smollm2", j.source_ids, "gpt2", j.traces) for j in jobs] == one
    assert batch([]) == ([], [])


def test_a_batch_above_the_servers_limit_is_refused_unless_split(client, smollm2):
    jobs = [AlignJob("smollm2", smol_ids(smollm2, "ok"), "gpt2")] * (SERVER_MAX_BATCH + 2)
    with pytest.raises(errors.InvalidArgument, match=f"at most {SERVER_MAX_BATCH}"):
        client.align_batch(jobs, max_batch=len(jobs))
    assert [a.text for a in client.align_batch(jobs, max_batch=SERVER_MAX_BATCH)] == ["ok"] * len(jobs)


def test_unknown_tokenizer_is_invalid_argument_naming_it(client, smollm2):
    with pytest.raises(errors.InvalidArgument, match="unknown tokenizer 'no-such-tok'"):
        client.align("smollm2", smol_ids(smollm2), "no-such-tok")
    with pytest.raises(errors.InvalidArgument, match=r"requests\[1\]: unknown tokenizer 'nope'"):
        client.align_batch([AlignJob("smollm2", [1], "gpt2"), AlignJob("nope", [1], "gpt2")])


def test_bad_input_is_refused_before_sending(client):
    with pytest.raises(errors.InvalidArgument, match="out of range"):
        client.align("smollm2", [-1], "gpt2")
    with pytest.raises(errors.InvalidArgument, match="reduction 'max' must be one of"):
        client.align("smollm2", [1], "gpt2", {"lp": [0.0]}, reductions={"lp": "max"})
    with pytest.raises(errors.InvalidArgument, match="not given: lp"):
        client.align("smollm2", [1], "gpt2", reductions={"lp": "sum"})
    with pytest.raises(errors.InvalidArgument, match="source_tokenizer"):
        client.align_batch([{"source_ids": [1], "target_tokenizer_id": "gpt2"}])


def test_tokenizers_lists_the_services(client):
    infos = {t.tokenizer_id: t for t in client.tokenizers()}
    assert set(infos) == {"gpt2", "smollm2"}
    assert infos["gpt2"].vocab_size == 50257 and infos["smollm2"].family == "byte_level_bpe"


class CountingBackoff(Backoff):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.waits = 0

    def delays(self):
        for d in super().delays():
            self.waits += 1
            yield d


def test_an_unreachable_service_is_unavailable_after_the_retries():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backoff = CountingBackoff(base_s=0.01, cap_s=0.02, attempts=3)
    with AlignClient(f"127.0.0.1:{port}", backoff=backoff) as c:
        with pytest.raises(errors.Unavailable):
            c.align("smollm2", [1], "gpt2")
    assert backoff.waits == 2  # 3 attempts


def test_the_bearer_token_is_sent(tmp_path, paths):
    import yaml
    from mrl.auth import hash_token
    path = tmp_path / "auth.yaml"
    path.write_text(yaml.safe_dump({"principals": [
        {"name": "policy-a", "role": "policy", "policy": "policy-a", "token_sha256": hash_token("tok-a")}]}))
    running = RunningServer(lambda: AlignServer(AlignSettings(port=0, admin_port=0, auth_file=path,
                                                              tokenizers={"gpt2": paths["gpt2"]})))
    try:
        with AlignClient(running.target, token="tok-a") as c:
            assert c.align("gpt2", [464], "gpt2").text == "The"
        with AlignClient(running.target) as c, pytest.raises(errors.Unauthenticated):
            c.tokenizers()
    finally:
        running.stop()
