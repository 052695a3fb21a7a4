"""generate_texts: greedy and sampled completions of text prompts, cut at EOS, seeded."""

from __future__ import annotations

import pytest
import torch

from tba.errors import InvalidArgumentError
from tba.models.generate import cut_at_eos, generate_texts, padded
from tba.models.tiny import build_tiny_model, build_tiny_tokenizer


@pytest.fixture(scope="module")
def lm():
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, n_layer=2, n_embd=32, n_head=2, n_positions=64, seed=3)
    return tokenizer, model.eval()


def test_greedy_matches_one_prompt_at_a_time(lm):
    tokenizer, model = lm
    prompts = ["1+2=", "a much longer prompt than that", ""]
    batched = generate_texts(model, tokenizer, prompts, max_new_tokens=5, batch_size=3)
    for prompt, [completion] in zip(prompts, batched, strict=True):
        [[alone]] = generate_texts(model, tokenizer, [prompt], max_new_tokens=5)
        assert completion == alone
        assert len(completion.token_ids) == 5 or completion.finished
        assert completion.text == tokenizer.decode(completion.token_ids, skip_special_tokens=True)


def test_sampling_is_seeded_and_gives_n_per_prompt(lm):
    tokenizer, model = lm
    first = generate_texts(model, tokenizer, ["x", "y"], 6, temperature=1.0, n=4, seed=7)
    again = generate_texts(model, tokenizer, ["x", "y"], 6, temperature=1.0, n=4, seed=7)
    assert first == again
    assert [len(group) for group in first] == [4, 4]
    assert len({g.text for group in first for g in group}) > 1


def test_completions_end_at_the_first_eos():
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, n_layer=1, n_embd=16, n_head=2, n_positions=64)
    eos = tokenizer.eos_token_id
    # A head that always says EOS: every completion is just EOS, and finished.
    head = torch.nn.Linear(16, len(tokenizer))
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.bias[eos] = 100.0
    model.lm_head = head
    [[completion]] = generate_texts(model.eval(), tokenizer, ["abc"], max_new_tokens=5)
    assert completion.token_ids == [eos]
    assert completion.finished
    assert completion.text == ""


def test_long_prompts_keep_their_end_and_bad_limits_fail(lm):
    tokenizer, model = lm
    [[completion]] = generate_texts(model, tokenizer, ["z" * 200], max_new_tokens=4)
    assert len(completion.token_ids) <= 4
    with pytest.raises(InvalidArgumentError, match="no room"):
        generate_texts(model, tokenizer, ["a"], max_new_tokens=64)
    with pytest.raises(InvalidArgumentError):
        generate_texts(model, tokenizer, ["a"], max_new_tokens=0)


def test_left_padding_keeps_positions_of_real_tokens():
    inputs = padded([[5, 6, 7], [8]], pad_id=0, left=True, device=torch.device("cpu"))
    assert inputs["input_ids"].tolist() == [[5, 6, 7], [0, 0, 8]]
    assert inputs["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert inputs["position_ids"].tolist() == [[0, 1, 2], [0, 0, 0]]


def test_right_padding_leaves_positions_to_the_model():
    inputs = padded([[5, 6, 7], [8]], pad_id=0, left=False, device=torch.device("cpu"))
    assert inputs["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert inputs["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert "position_ids" not in inputs


def test_cut_keeps_the_first_eos_and_says_whether_there_was_one():
    assert cut_at_eos([4, 2, 9, 2, 2], eos_ids=[2, 3]) == ([4, 2], True)
    assert cut_at_eos([4, 3, 2], eos_ids=[2, 3]) == ([4, 3], True)
    assert cut_at_eos([4, 5], eos_ids=[2]) == ([4, 5], False)
