"""How the trainer divides a step over torchrun's ranks (mrl_trainer.distributed.Ranks), without a process group:
every sequence of a micro-batch goes to exactly one rank, and the ranks' rollout blocks cover the prompts once."""
import pytest

from mrl_trainer.distributed import Ranks


@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("n", [0, 1, 4, 7])
def test_the_ranks_deals_split_a_micro_batch_without_overlap_or_loss(world, n):
    group = list(range(10, 10 + n))
    deals = [Ranks(rank, world).deal(group) for rank in range(world)]
    assert sorted(x for deal in deals for x in deal) == group
    assert max(map(len, deals)) - min(map(len, deals)) <= 1          # as even as it gets


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [1, 4, 5, 7])
def test_the_ranks_blocks_cover_the_prompts_once_in_order_and_are_equally_long(world, n):
    prompts = [f"p{i}" for i in range(n)]
    blocks = [Ranks(rank, world).block(prompts) for rank in range(world)]
    assert [p for block, real in blocks for p in block[:real]] == prompts      # the real items, in order
    assert len({len(block) for block, _ in blocks}) == 1                        # every rank generates as many
    assert all(p in prompts for block, _ in blocks for p in block)             # padding repeats a real prompt
