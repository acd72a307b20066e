"""The trainer's outbox in-process: batches kept on disk in order, sent oldest first, kept while the exchange
is unreachable, and a refused batch moved aside so it cannot block the batches after it (or the next run)."""
import pytest

from helpers import rollout
from mrl.errors import InvalidArgument, Unavailable
from mrl_trainer.errors import TrainerError
from mrl_trainer.outbox import Outbox


def _ids(batch) -> list[str]:
    return [e.experience_id for e in batch]


def test_batches_are_sent_oldest_first_and_removed_once_taken(tmp_path):
    outbox = Outbox(tmp_path)
    first, second = [rollout("run-1")], [rollout("run-1"), rollout("run-1")]
    outbox.put(first)
    outbox.put(second)
    assert outbox.pending() == 3
    taken = []
    assert outbox.send(lambda batch: taken.append(_ids(batch))) == 3
    assert taken == [_ids(first), _ids(second)] and outbox.pending() == 0


def test_an_unreachable_exchange_keeps_everything_for_the_next_call(tmp_path):
    outbox = Outbox(tmp_path)
    outbox.put([rollout("run-1")])

    def down(batch):
        raise Unavailable("exchange restarting")
    assert outbox.send(down) == 0 and outbox.pending() == 1
    assert Outbox(tmp_path).send(lambda batch: None) == 1     # a new trainer process finds it


def test_a_refused_batch_moves_aside_and_the_next_call_sends_the_rest(tmp_path):
    outbox = Outbox(tmp_path)
    bad, good = [rollout("run-1")], [rollout("run-1")]
    outbox.put(bad)
    outbox.put(good)

    def refuse_bad(batch):
        if _ids(batch) == _ids(bad):
            raise InvalidArgument("rollout.token_ids: at most 10 token ids")
    with pytest.raises(InvalidArgument):
        outbox.send(refuse_bad)
    assert len(list((tmp_path / "outbox" / "rejected").iterdir())) == 1
    assert outbox.send(refuse_bad) == 1 and outbox.pending() == 0


def test_stray_files_are_ignored_and_an_unwritable_folder_is_a_trainer_error(tmp_path):
    (tmp_path / "outbox").mkdir()
    (tmp_path / "outbox" / "notes.pb").write_text("not a batch")
    assert Outbox(tmp_path).pending() == 0
    blocked = tmp_path / "file"
    blocked.write_text("a file where the checkpoint folder should be")
    with pytest.raises(TrainerError, match="outbox"):
        Outbox(blocked).put([rollout("run-1")])
