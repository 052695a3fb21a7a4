import torch

from tba.domain import Batch, Prompt, PromptGroup, SampleSource
from tba.trainer.collate import collate, plan_micro_batches, shard_rows, splits_groups
from tests.fixtures.data import trajectory, with_token_logprobs


def group(prompt_id: str, *completions: tuple[int, ...], policy_version: int = 0) -> PromptGroup:
    trajs = [
        trajectory(
            prompt_id, c, reward=float(i), policy_version=policy_version, ref_logprob=-float(i)
        )
        for i, c in enumerate(completions)
    ]
    return PromptGroup(Prompt(prompt_id, "text"), trajs, SampleSource.RECENCY)


def test_collate_keeps_rows_in_order_with_their_group():
    batch = Batch(
        [group("a", (5, 2), (6, 7, 2)), group("empty"), group("b", (9,), policy_version=3)],
        latest_version=4,
    )
    train = collate(batch)
    assert train.size == 3
    assert train.inputs.num_groups == 2  # the empty group is dropped
    assert train.inputs.group_index.tolist() == [0, 0, 1]
    assert train.completions == [[5, 2], [6, 7, 2], [9]]
    assert train.prompts[0] == [1, 10, 11]
    assert train.inputs.reward.tolist() == [0.0, 1.0, 0.0]
    assert train.inputs.ref_logprob.tolist() == [0.0, -1.0, 0.0]
    assert train.policy_version.tolist() == [0, 0, 3]
    assert train.latest_version == 4


def test_micro_batches_pack_whole_groups_and_split_only_oversized_ones():
    groups = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 3])
    plan = plan_micro_batches(groups, micro_batch_size=4)
    # Group 2 (5 rows) is split; group 3 fills the gap left beside group 1.
    assert [p.tolist() for p in plan] == [[0, 1, 2], [5, 6, 7, 8], [9], [3, 4, 10]]
    assert sorted(torch.cat(plan).tolist()) == list(range(11))
    assert splits_groups(plan, groups)
    whole = plan_micro_batches(groups[:5], micro_batch_size=5)
    assert [p.tolist() for p in whole] == [[0, 1, 2, 3, 4]]
    assert not splits_groups(whole, groups[:5])


def test_shards_cover_every_row_once_with_equal_lengths():
    shards = [shard_rows(7, rank, 3) for rank in range(3)]
    assert {len(rows) for rows, _ in shards} == {3}
    real = [
        r for rows, mask in shards for r, m in zip(rows.tolist(), mask.tolist(), strict=True) if m
    ]
    assert real == list(range(7))
    assert shards[2][1].tolist() == [1.0, 0.0, 0.0]


def test_collate_unpacks_each_rows_token_logprobs_and_leaves_missing_ones_empty():
    sent = with_token_logprobs(trajectory("a", (5, 2)), [-0.5, -0.25], [-1.0, -2.0])
    batch = Batch(
        [PromptGroup(Prompt("a", "t"), [sent, trajectory("a", (6,))], SampleSource.RECENCY)], 0
    )
    train = collate(batch)
    assert [t.tolist() for t in train.behavior_tokens] == [[-0.5, -0.25], []]
    assert [t.tolist() for t in train.ref_tokens] == [[-1.0, -2.0], []]
    assert [t.tolist() for t in train.select(torch.tensor([1, 0])).ref_tokens] == [[], [-1, -2]]
