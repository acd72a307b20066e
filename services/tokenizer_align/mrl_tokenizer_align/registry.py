"""The tokenizer registry: ids to byte tables, loaded only from allow-listed folders, cached by content.

Registration reads files, so it is confined: a path is resolved (symlinks and `..` included)
and must lie under one of the configured roots, or the request is refused. A path the operating
system refuses (a NUL byte, a name too long, a symlink loop) is the caller's bad input, as is a
file it cannot read. Tables are cached by the sha256 of the tokenizer's files, so the same
tokenizer under two ids is loaded once.
"""
import dataclasses
import logging
import pathlib

from mrl.errors import InvalidArgument, NotFound, PermissionDenied, ResourceExhausted
from mrl.experience import validate_name
from mrl_tokenizer_align.vocab import Vocab, content_sha256, load_vocab, shown, tokenizer_files

__all__ = ["TokenizerRegistry"]

log = logging.getLogger(__name__)
PATH_MAX = 4096  # Linux's: no longer path names a file


class TokenizerRegistry:
    def __init__(self, roots: list[pathlib.Path], max_tokenizers: int = 64):
        self.roots = [pathlib.Path(r).resolve() for r in roots]
        self.max_tokenizers = max_tokenizers
        self._by_id: dict[str, Vocab] = {}
        self._by_hash: dict[str, Vocab] = {}

    def register(self, tokenizer_id: str, path: str | pathlib.Path) -> Vocab:
        if len(tokenizer_id) > 64:  # before validate_name, which quotes the whole of it
            raise InvalidArgument(f"tokenizer_id {shown(tokenizer_id, 80)} is too long: at most 64 characters")
        validate_name("tokenizer_id", tokenizer_id)
        if not str(path):
            raise InvalidArgument("path is empty: name a tokenizer file or folder under an allowed root")
        if len(str(path)) > PATH_MAX:  # before resolving it, which takes time quadratic in its length
            raise InvalidArgument(f"tokenizer path {shown(path)} is too long: at most {PATH_MAX} characters")
        try:
            return self._register(tokenizer_id, pathlib.Path(path))
        except (OSError, RuntimeError, ValueError) as exc:  # ValueError: a NUL byte; RuntimeError: a symlink loop
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise InvalidArgument(f"tokenizer path {shown(path)} cannot be used: {reason[:200]}") from None

    def _register(self, tokenizer_id: str, path: pathlib.Path) -> Vocab:
        resolved = path.resolve()
        if not any(resolved.is_relative_to(root) for root in self.roots):
            raise PermissionDenied(f"{shown(path)} is outside the allowed tokenizer roots "
                                   f"({', '.join(map(str, self.roots)) or 'none configured'}; MRL_TOKENIZER_ROOTS)")
        if not resolved.exists():
            raise NotFound(f"tokenizer path {shown(path)} does not exist")
        for f in tokenizer_files(resolved):  # a sidecar or a folder's files may be symlinks too
            real = f.resolve()
            if not real.is_file() or not any(real.is_relative_to(root) for root in self.roots):
                raise PermissionDenied(f"{shown(f)} is not a regular file under the allowed tokenizer roots")
        if tokenizer_id not in self._by_id and len(self._by_id) >= self.max_tokenizers:
            raise ResourceExhausted(f"{self.max_tokenizers} tokenizers are registered already (MRL_MAX_TOKENIZERS)")
        digest = content_sha256(resolved)
        cached = self._by_hash.get(digest)
        if cached is None:
            cached = load_vocab(tokenizer_id, resolved)
            self._by_hash[digest] = cached
            log.info("loaded tokenizer %s (%s, %d ids, byte-exact %s) from %s", tokenizer_id, cached.family,
                     cached.vocab_size, cached.byte_exact, resolved)
        vocab = cached if cached.tokenizer_id == tokenizer_id else dataclasses.replace(cached, tokenizer_id=tokenizer_id)
        self._by_id[tokenizer_id] = vocab
        return vocab

    def get(self, tokenizer_id: str) -> Vocab:
        vocab = self._by_id.get(tokenizer_id)
        if vocab is None:
            known = ", ".join(sorted(self._by_id)) or "none"
            raise InvalidArgument(f"unknown tokenizer {shown(tokenizer_id)}; registered: {known} "
                                  f"(RegisterTokenizer adds one)")
        return vocab

    def all(self) -> list[Vocab]:
        return [self._by_id[k] for k in sorted(self._by_id)]
