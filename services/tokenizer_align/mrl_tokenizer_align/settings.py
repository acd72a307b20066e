"""Settings of the alignment service (env `MRL_*`, or the YAML file named by `MRL_CONFIG`)."""
import pathlib
from typing import ClassVar

from pydantic import Field

from mrl_serving.settings import ServerSettings
from mrl_tokenizer_align.catalog import cache_dir, cached_paths

__all__ = ["AlignSettings"]


class AlignSettings(ServerSettings):
    command: ClassVar[tuple[str, ...]] = ("align", "serve")
    needs_redis: ClassVar[bool] = False
    port: int = Field(50052, ge=0, le=65535, description="gRPC port; 0 picks a free one.")
    admin_port: int = Field(8081, ge=0, le=65535, description="REST port; 0 picks a free one.")
    tokenizer_roots: list[pathlib.Path] = Field(
        default_factory=lambda: [cache_dir()],
        description="Folders RegisterTokenizer may read from (JSON list in the env); nothing outside them.")
    tokenizers: dict[str, pathlib.Path] = Field(
        default_factory=lambda: dict(cached_paths()),
        description="Tokenizers loaded at start, id -> path (default: every tokenizer `make tokenizers` cached), "
                    "so every replica answers the same ids.")
    max_ids: int = Field(32768, gt=0, description="Most source ids (or prompt ids) in one alignment.")
    max_batch: int = Field(512, gt=0, description="Most alignments in one AlignBatch.")
    max_batch_ids: int = Field(262_144, gt=0, description="Most source ids in one AlignBatch (its answer must fit "
                                                          "one message).")
    max_traces: int = Field(16, gt=0, description="Most traces per alignment.")
    max_tokenizers: int = Field(64, gt=0, description="Most tokenizers held in memory.")
