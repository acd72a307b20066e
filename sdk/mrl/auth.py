"""Authentication and per-policy authorization, shared by every service.

Tokens are bearer secrets (`authorization: Bearer <token>` in gRPC metadata and HTTP headers).
The auth file stores only their sha256, never the tokens:

    principals:
      - name: lab-b-trainer
        role: policy            # policy | admin
        policy: qwen-0.5b       # the only producer/subscriber id it may use
        runs: ["run-7"]         # runs it belongs to; ["*"] for all
        token_sha256: 3f1a...   # `mrl token new` prints a token and this hash
                                # (`--auth-file auth.yaml` adds the entry to the file: `add_principal`)

With no principals configured, auth is off: every caller is the admin `anonymous`, and the
services bind only to loopback (see `loopback_only`).
"""
import contextlib
import fcntl
import hashlib
import ipaddress
import os
import pathlib
import secrets
import tempfile
from typing import Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from mrl.errors import InvalidArgument, MrlError, PermissionDenied, Unauthenticated
from mrl.experience import validate_name

__all__ = ["Principal", "Authenticator", "add_principal", "checked_entry", "hash_token", "new_token", "ANONYMOUS",
           "is_loopback"]


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return "mrl_" + secrets.token_urlsafe(32)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Principal(BaseModel):
    name: str = Field(min_length=1)
    role: Literal["policy", "admin"]
    policy: str | None = Field(None, description="The policy id a `policy` principal acts as.")
    runs: list[str] = Field(default_factory=lambda: ["*"], description="Runs it belongs to; '*' is every run.")
    token_sha256: str = Field(..., pattern=r"^[0-9a-f]{64}$", description="sha256 hex of the token")

    @field_validator("policy")
    @classmethod
    def _policy_is_a_name(cls, policy: str | None) -> str | None:
        return policy and _name("policy", policy)

    @field_validator("runs")
    @classmethod
    def _runs_are_names(cls, runs: list[str]) -> list[str]:
        return [run if run == "*" else _name("run", run) for run in runs]

    @model_validator(mode="after")
    def _policy_needs_id(self):
        if self.role == "policy" and not self.policy:
            raise ValueError(f"principal {self.name!r} has role 'policy' but no 'policy' id to act as")
        return self

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    def require_run(self, run_id: str) -> None:
        if not (self.is_admin or "*" in self.runs or run_id in self.runs):
            raise PermissionDenied(f"principal {self.name!r} does not belong to run {run_id!r}")

    def require_policy(self, policy: str, run_id: str | None, action: str) -> None:
        """A policy principal may `action` (publish, subscribe, ack) only as itself, in its runs (run_id None: in
        whichever run)."""
        if run_id is not None:
            self.require_run(run_id)
        if not self.is_admin and policy != self.policy:
            raise PermissionDenied(f"principal {self.name!r} may {action} only as policy {self.policy!r}, "
                                   f"not as {policy!r}")

    def require_admin(self) -> None:
        if not self.is_admin:
            raise PermissionDenied(f"principal {self.name!r} is not an admin")


def _name(what: str, value: str) -> str:
    """`value` if it is a valid id (as the exchange checks the ids a principal acts on); the error does not repeat
    it: a token pasted here must not reach the logs."""
    try:
        return validate_name(what, value)
    except MrlError:
        raise ValueError(f"not a valid {what} id: use 1-64 characters of letters, digits, '.', '_' or '-', "
                         f"starting with a letter or digit") from None


def _problems(exc: ValidationError) -> str:
    """A principal's validation errors, without the input values: a token pasted where its hash belongs must
    not reach the logs."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'principal'}: {e['msg']}"
                     for e in exc.errors(include_url=False, include_input=False))


ANONYMOUS = Principal(name="anonymous", role="admin", token_sha256="0" * 64)  # never matched: auth is off


class Authenticator:
    """Maps a bearer token to its principal; `enabled` is False when no principal is configured."""

    def __init__(self, principals: list[Principal] = ()):
        self._by_hash = {p.token_sha256: p for p in principals}
        if len(self._by_hash) != len(principals):
            raise InvalidArgument("two principals share a token hash; give each principal its own token")
        self.enabled = bool(principals)

    @classmethod
    def from_file(cls, path: str | pathlib.Path | None) -> "Authenticator":
        if path is None:
            return cls()
        try:
            doc = yaml.safe_load(pathlib.Path(path).read_text()) or {}
            if not isinstance(doc, dict):
                raise InvalidArgument(f"auth file {path}: expected a mapping with a 'principals' list, "
                                      f"got a {type(doc).__name__}")
            return cls([Principal(**p) for p in doc.get("principals", [])])
        except ValidationError as exc:
            raise InvalidArgument(f"auth file {path}: {_problems(exc)}") from None
        except (OSError, yaml.YAMLError, TypeError) as exc:
            raise InvalidArgument(f"auth file {path}: {exc}") from exc

    def authenticate(self, authorization: str | None) -> Principal:
        if not self.enabled:
            return ANONYMOUS
        if not authorization:
            raise Unauthenticated("missing credentials: send 'authorization: Bearer <token>'")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("malformed credentials: send 'authorization: Bearer <token>'")
        principal = self._by_hash.get(hash_token(token.strip()))
        if principal is None:
            raise Unauthenticated("unknown token")
        return principal


def checked_entry(entry: dict) -> dict:
    """`entry` (a principal, as the auth file holds it), checked as the services will load it; InvalidArgument
    naming what is wrong otherwise."""
    try:
        Principal(**entry)
    except ValidationError as exc:
        raise InvalidArgument(f"principal {entry.get('name')!r}: {_problems(exc)}") from None
    return entry


def add_principal(path: str | pathlib.Path, entry: dict) -> None:
    """Add `entry` (a principal, as the auth file holds it) to the auth file at `path`, created if missing.

    The file is rewritten whole (its comments are not kept) through a temporary file renamed over it, so
    a reader sees the old file or the new one, never half of one. InvalidArgument, the file untouched,
    when it does not load or already holds a principal of that name, or when `entry` is not one it could load."""
    path = pathlib.Path(path)
    checked_entry(entry)
    try:
        with _locked(path.parent):             # two `mrl token new --auth-file` at once: one after the other
            doc: dict = {}
            if path.exists():
                Authenticator.from_file(path)  # it must load as it is
                doc = yaml.safe_load(path.read_text()) or {}
            principals = doc.setdefault("principals", [])
            if any(p["name"] == entry["name"] for p in principals):
                raise InvalidArgument(f"principal {entry['name']!r} is already in {path}: choose another name, or "
                                      f"remove its entry first")
            principals.append(entry)
            _replace(path, yaml.safe_dump(doc, sort_keys=False))
    except OSError as exc:
        raise InvalidArgument(f"auth file {path}: {exc}") from exc


@contextlib.contextmanager
def _locked(folder: pathlib.Path):
    """An exclusive flock on a folder (no lock file left behind) for the block."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _replace(path: pathlib.Path, text: str) -> None:
    """Write `text` to a temporary file beside `path` (mode 0600, or path's), then rename it over `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
