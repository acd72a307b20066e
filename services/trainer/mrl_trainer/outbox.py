"""The trainer's outbox: experience the exchange has not taken yet, kept in files until it does.

    outbox = Outbox(checkpoint_dir)        # files under checkpoint_dir/outbox
    outbox.put(experiences)                # one file per batch, written atomically (fsync, then rename)
    sent = outbox.send(client.publish)     # oldest first; stops at the first UNAVAILABLE, keeping the rest;
                                           # a batch the exchange refuses moves to outbox/rejected/ (raised once)

A step's experience is written here before it is published and removed once the exchange has taken
it, so an exchange that stays unreachable past the client's retry budget delays the experience to a
later step instead of losing it, and a trainer that stops meanwhile finds the files when it starts
again. A batch sent again after a crash between publish and removal is harmless within the
exchange's dedupe window (MRL_DEDUPE_TTL_S, 1 h by default): publish is idempotent by experience
id. A batch the exchange refuses (not UNAVAILABLE: a bad token, a limit of that exchange) is moved
to outbox/rejected/ for a person to look at, so it cannot block the next run.
"""
import logging
import os
import pathlib
import time

from mrl.errors import MrlError, Unavailable
from mrl.v1 import exchange_pb2 as xpb
from mrl_trainer.errors import TrainerError

__all__ = ["Outbox"]

log = logging.getLogger("mrl.trainer")


class Outbox:
    def __init__(self, checkpoint_dir: str | pathlib.Path):
        self.folder = pathlib.Path(checkpoint_dir) / "outbox"

    def batches(self) -> list[pathlib.Path]:
        """The files waiting, oldest first."""
        if not self.folder.is_dir():
            return []
        return sorted((p for p in self.folder.glob("*.pb") if p.stem.isdigit()), key=lambda p: int(p.stem))

    def pending(self) -> int:
        """How many experiences wait to be sent."""
        return sum(len(_read(path).experiences) for path in self.batches())

    def put(self, experiences) -> None:
        """Keep a batch durably (on disk before this returns); a disk that refuses is a TrainerError."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            waiting = self.batches()
            path = self.folder / f"{int(waiting[-1].stem) + 1 if waiting else 0}.pb"
            tmp = path.with_suffix(".tmp")
            with open(tmp, "wb") as f:
                f.write(xpb.PublishRequest(experiences=experiences).SerializeToString())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            folder = os.open(self.folder, os.O_RDONLY)
            try:
                os.fsync(folder)  # the rename itself survives a crash
            finally:
                os.close(folder)
        except OSError as exc:
            raise TrainerError(f"cannot keep the step's experience in the outbox {self.folder}: {exc}") from exc

    def send(self, publish) -> int:
        """Publish each batch, oldest first, removing it once taken; return how many experiences were taken.

        Stops at the first Unavailable (what is left waits for the next call). Any other refusal moves
        that batch to outbox/rejected/ and is raised: the next call goes on with the batches after it.
        """
        sent = 0
        for path in self.batches():
            experiences = _read(path).experiences
            try:
                publish(experiences)
            except Unavailable as exc:
                log.warning("exchange unreachable: %d experiences wait in %s: %s", self.pending(), self.folder, exc)
                break
            except MrlError:
                rejected = self.folder / "rejected"
                rejected.mkdir(exist_ok=True)
                path.replace(rejected / f"{time.time_ns()}-{path.name}")
                raise
            path.unlink()
            sent += len(experiences)
        return sent


def _read(path: pathlib.Path) -> xpb.PublishRequest:
    return xpb.PublishRequest.FromString(path.read_bytes())
