import torch

from tba.models.logprobs import sequence_logprobs
from tba.models.tiny import build_tiny_model, build_tiny_tokenizer
from tba.trainer.collate import TrainBatch
from tba.trainer.loss import LossInputs
from tba.trainer.reference import ReferenceResets


def batch(tokenizer) -> TrainBatch:
    prompts = [tokenizer("1+2=").input_ids, tokenizer("3+4=").input_ids]
    completions = [[7, tokenizer.eos_token_id], [8, 9, tokenizer.eos_token_id]]
    stored = torch.tensor([-5.0, -6.0])
    inputs = LossInputs(stored, stored, torch.zeros(2), torch.tensor([0, 1]), 2)
    empty = [torch.zeros(0), torch.zeros(0)]
    versions = torch.zeros(2, dtype=torch.long)
    return TrainBatch(prompts, completions, inputs, versions, 0, empty, empty, torch.zeros(2))


def test_reset_freezes_a_copy_of_the_policy_and_relabels_from_it():
    tokenizer = build_tiny_tokenizer("0123456789+=")
    policy = build_tiny_model(tokenizer, n_layer=1, n_embd=32, n_head=2)
    resets = ReferenceResets(every_steps=3, temperature=0.7, pad_token_id=0, micro_batch_size=1)
    data = batch(tokenizer)
    assert [resets.due(s) for s in range(7)] == [False, False, False, True, False, False, True]
    assert resets.relabel(data) is data  # before the first reset: the stored values

    resets.reset(policy)
    with torch.no_grad():
        at_reset = sequence_logprobs(policy, data.prompts, data.completions, 0.7, 0)
        for p in policy.parameters():
            p.add_(0.5)  # the policy trains on; the reference must not follow
    relabelled = resets.relabel(data)
    torch.testing.assert_close(relabelled.inputs.ref_logprob, at_reset)
    assert relabelled.inputs.behavior_logprob.tolist() == [-5.0, -6.0]
    # The per-token reference log-probs come from the copy too, one per completion token.
    assert [len(t) for t in relabelled.ref_tokens] == [2, 3]
    torch.testing.assert_close(torch.stack([t.sum() for t in relabelled.ref_tokens]), at_reset)

    state = resets.state_dict()
    assert state is not None
    restored = ReferenceResets(3, 0.7, 0, micro_batch_size=4)
    restored.restore(policy, state)
    torch.testing.assert_close(restored.relabel(data).inputs.ref_logprob, at_reset)
    assert all(not p.requires_grad for p in restored.module.parameters())  # type: ignore[union-attr]
