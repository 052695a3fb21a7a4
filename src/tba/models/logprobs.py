"""Sequence log-probabilities of completions, and their per-token terms (`token_logprobs`,
whose `sums` are `sequence_logprobs` exactly), shared by the trainer (policy) and the
searcher (reference), so both compute exactly the same quantity (DESIGN.md section 2):
logits divided by the sampling temperature (one for the batch, or each row's own where
searchers drew a temperature per round), completion tokens only (prompt and padding masked,
a final EOS counted).

Completions of one prompt share its forward pass: a packed sequence holds the prompt once
and then each completion, and an attention mask lets each completion see the prompt and its
own earlier tokens only, with positions as if it followed the prompt alone. A group of 8
samples of a 7-token arithmetic prompt so runs 44 tokens where one row per completion ran 96:
a training step's forward and backward take half the time, a reference pass 40%. The values
are those of each (prompt, completion) run alone, to float rounding.

Identical rows (same prompt, completion and temperature) are scored once and their values
shared: small vocabularies repeat completions often (a group of 8 sampled sums of the demo
holds about 3 distinct answers), and a shared value passes each copy's gradient back through
the one forward, the same gradient as scoring every copy.

Attention over a packed sequence costs its length squared, so a completion joins its prompt's
sequence only where that costs fewer multiply-adds than a sequence of its own (long
completions of a short prompt, hundreds of tokens after a dozen, each keep their own), and a
batch is packed only where its sequences, padded to the longest, cost less than one row per
completion."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

# Token owners in a packed sequence besides completion (row) numbers.
_PROMPT, _PADDING = -1, -2


@dataclass(frozen=True)
class SharedPromptBatch:
    """Packed sequences ([S, L]), their attention mask ([S, 1, L, L], True: may attend) and,
    for each completion token ([T]), where its logits are and which row it belongs to."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention: torch.Tensor
    target_sequence: torch.Tensor
    target_position: torch.Tensor
    target_token: torch.Tensor
    target_row: torch.Tensor
    rows: int


@dataclass(frozen=True)
class TokenLogprobs:
    """Each completion token's log-prob ([T], in packed order) and the row it belongs to."""

    values: torch.Tensor
    row: torch.Tensor
    rows: int

    def sums(self) -> torch.Tensor:
        """[rows] the sequence log-prob of each row (`sequence_logprobs`)."""
        return self.values.new_zeros(self.rows).index_add(0, self.row, self.values)

    def per_row(self) -> list[torch.Tensor]:
        """Each row's token log-probs in completion order."""
        order, counts = self._by_row()
        return list(torch.split(self.values[order], counts.tolist()))

    def _by_row(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions of the values in row order (packing keeps a row's tokens in order, so a
        stable sort by row keeps them so), and each row's token count."""
        return torch.argsort(self.row, stable=True), torch.bincount(self.row, minlength=self.rows)

    def cpu_rows(self) -> list[torch.Tensor]:
        """`per_row` detached, as float32 on the CPU, copied from the device once."""
        values = self.values.detach().float().cpu()
        return TokenLogprobs(values, self.row.cpu(), self.rows).per_row()

    def expanded(self, source: torch.Tensor) -> TokenLogprobs:
        """Token log-probs of `len(source)` rows, row r holding the tokens of this row
        source[r] (differentiable: a row's gradient flows to the tokens it was copied from)."""
        order, counts = self._by_row()
        starts = torch.cumsum(counts, 0) - counts
        lengths = counts[source]
        row = torch.repeat_interleave(torch.arange(len(source), device=source.device), lengths)
        first = torch.cumsum(lengths, 0) - lengths
        offset = torch.arange(row.numel(), device=source.device) - first[row]
        return TokenLogprobs(self.values[order[starts[source][row] + offset]], row, len(source))


def token_logprobs(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    temperature: float | torch.Tensor,
    pad_token_id: int,
) -> TokenLogprobs:
    """Every completion token's log-prob under logits / `temperature`: one for every row, or
    ([rows]) each row's own; differentiable (wrap in no_grad for inference)."""
    if not bool((torch.as_tensor(temperature) > 0).all()):
        raise ValueError("temperature must be > 0")
    first, source = distinct_rows(prompts, completions, temperature)
    if len(first) == len(prompts):
        return _score(model, prompts, completions, temperature, pad_token_id)
    if isinstance(temperature, torch.Tensor):
        temperature = temperature[torch.tensor(first, device=temperature.device)]
    prompts, completions = [prompts[r] for r in first], [completions[r] for r in first]
    scored = _score(model, prompts, completions, temperature, pad_token_id)
    return scored.expanded(torch.tensor(source, device=scored.row.device))


def _score(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    temperature: float | torch.Tensor,
    pad_token_id: int,
) -> TokenLogprobs:
    device = next(model.parameters()).device
    batch = pack_shared_prompts(prompts, completions, pad_token_id, hidden_size_of(model), device)
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=_mask_for(model, batch.attention),
        position_ids=batch.position_ids,
        use_cache=False,
    ).logits
    picked = logits[batch.target_sequence, batch.target_position].float()
    picked = picked / _per_target(temperature, batch.target_row)
    token = picked.gather(-1, batch.target_token.unsqueeze(-1)).squeeze(-1)
    return TokenLogprobs(token - torch.logsumexp(picked, dim=-1), batch.target_row, batch.rows)


def distinct_rows(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    temperature: float | torch.Tensor,
) -> tuple[list[int], list[int]]:
    """The first row of each distinct (prompt, completion, temperature), and for every row
    the position of its own among those."""
    if len(prompts) != len(completions):
        raise ValueError("prompts and completions differ in number")
    temperatures = torch.as_tensor(temperature).reshape(-1).tolist()
    position: dict[tuple[tuple[int, ...], tuple[int, ...], float], int] = {}
    first: list[int] = []
    source: list[int] = []
    for row, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
        key = (tuple(prompt), tuple(completion), temperatures[row % len(temperatures)])
        if key not in position:
            position[key] = len(first)
            first.append(row)
        source.append(position[key])
    return first, source


def _per_target(temperature: float | torch.Tensor, row: torch.Tensor) -> float | torch.Tensor:
    """The divisor of each target token's logits: a float as it is (the values of one
    temperature for all, unchanged bit for bit), a row's temperature as float32 ([T, 1]),
    the precision the logits are divided in either way."""
    if not isinstance(temperature, torch.Tensor):
        return temperature
    return temperature.to(device=row.device, dtype=torch.float32)[row].unsqueeze(-1)


def sequence_logprobs(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    temperature: float | torch.Tensor,
    pad_token_id: int,
) -> torch.Tensor:
    """[N] sum of completion-token log-probs; differentiable (wrap in no_grad for inference)."""
    return token_logprobs(model, prompts, completions, temperature, pad_token_id).sums()


def pack_shared_prompts(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    pad_token_id: int,
    hidden_size: int | None = None,
    device: torch.device | str = "cpu",
) -> SharedPromptBatch:
    """`hidden_size`, the model's width, prices attention against the other layers when
    deciding what to pack; None packs each prompt's completions into one sequence."""
    if len(prompts) != len(completions):
        raise ValueError("prompts and completions differ in number")
    if any(len(p) == 0 for p in prompts) or any(len(c) == 0 for c in completions):
        raise ValueError("every prompt and completion needs at least one token")
    sequences = plan_sequences(prompts, completions, hidden_size)
    if hidden_size is not None and not _packing_pays(prompts, completions, sequences, hidden_size):
        sequences = [[row] for row in range(len(prompts))]
    width = max(packed_length(prompts, completions, rows) for rows in sequences)
    # Built as lists and made tensors once: a few small tensors per completion took 3 ms of
    # each step of the demo's trainer.
    input_ids, position_ids, owner = [], [], []
    targets: list[tuple[int, int, int, int]] = []  # sequence, position, token, row
    for s, rows in enumerate(sequences):
        ids, positions, owners = _pack_sequence(prompts, completions, rows, s, targets)
        padding = width - len(ids)
        input_ids.append(ids + [pad_token_id] * padding)
        position_ids.append(positions + [0] * padding)
        owner.append(owners + [_PADDING] * padding)
    sequence, position, token, row = torch.tensor(targets, dtype=torch.long).to(device).T
    return SharedPromptBatch(
        torch.tensor(input_ids, dtype=torch.long).to(device),
        torch.tensor(position_ids, dtype=torch.long).to(device),
        _attention(torch.tensor(owner, dtype=torch.long)).to(device),
        sequence,
        position,
        token,
        row,
        rows=len(prompts),
    )


def _pack_sequence(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    rows: list[int],
    sequence: int,
    targets: list[tuple[int, int, int, int]],
) -> tuple[list[int], list[int], list[int]]:
    """The tokens, positions and owners of one packed sequence (`rows` share a prompt),
    unpadded; appends each completion token's (sequence, position, token, row) to
    `targets`."""
    prompt = prompts[rows[0]]
    prefix = len(prompt) - 1
    ids, positions, owners = list(prompt[:-1]), list(range(prefix)), [_PROMPT] * prefix
    for row in rows:
        completion = completions[row]
        # The prompt's last token predicts the completion's first; its last is only a target.
        fed = [prompt[-1], *completion[:-1]]
        start = len(ids)
        ids += fed
        positions += range(prefix, prefix + len(fed))
        owners += [row] * len(fed)
        targets += [(sequence, start + i, t, row) for i, t in enumerate(completion)]
    return ids, positions, owners


def hidden_size_of(model: torch.nn.Module) -> int | None:
    return int(getattr(getattr(model, "config", None), "hidden_size", 0)) or None


def plan_sequences(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    hidden_size: int | None,
    max_rows: int | None = None,
) -> list[list[int]]:
    """Rows per packed sequence: one prompt's rows in order; a row starts a new sequence where
    joining the open one would cost more than running alone, or hold over `max_rows`. Rows
    given sequence by sequence plan again into the same sequences (or fewer, uncapped)."""
    open_sequence: dict[tuple[int, ...], list[int]] = {}
    sequences: list[list[int]] = []
    for row, prompt in enumerate(prompts):
        key = tuple(prompt)
        rows = open_sequence.get(key)
        full = rows is not None and max_rows is not None and len(rows) >= max_rows
        if (
            rows is None
            or full
            or not _cheaper_joined(prompts, completions, rows, row, hidden_size)
        ):
            rows = open_sequence[key] = []
            sequences.append(rows)
        rows.append(row)
    return sequences


def _cheaper_joined(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    rows: list[int],
    row: int,
    hidden_size: int | None,
) -> bool:
    if hidden_size is None:
        return True
    length, joined, alone = (
        _layer_cost(packed_length(prompts, completions, r), hidden_size)
        for r in (rows, [*rows, row], [row])
    )
    return joined - length < alone


def _packing_pays(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    sequences: list[list[int]],
    hidden_size: int,
) -> bool:
    """Whether the packed sequences, padded to the longest, cost less than one padded row per
    completion: sequences of uneven length (a prompt's 7 completions beside another's 1) can
    pad away what sharing saved."""

    def padded_cost(plan: list[list[int]]) -> int:
        width = max(packed_length(prompts, completions, rows) for rows in plan)
        return len(plan) * _layer_cost(width, hidden_size)

    return padded_cost(sequences) < padded_cost([[row] for row in range(len(prompts))])


def _layer_cost(tokens: int, hidden_size: int) -> int:
    """Multiply-adds of a transformer layer over a sequence, in units of `hidden_size`:
    12 d^2 a token in its projections and MLP, 2 d a token per position attended (every
    position of the sequence, which the mask then hides)."""
    return 12 * hidden_size * tokens + 2 * tokens * tokens


def packed_length(
    prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], rows: list[int]
) -> int:
    return len(prompts[rows[0]]) - 1 + sum(len(completions[r]) for r in rows)


def _attention(owner: torch.Tensor) -> torch.Tensor:
    """[S, 1, L, L] causal, and a completion sees the prompt and itself only (padding sees
    padding, so that no row of the mask is empty)."""
    positions = torch.arange(owner.shape[1])
    causal = positions.unsqueeze(1) >= positions.unsqueeze(0)
    query, key = owner.unsqueeze(2), owner.unsqueeze(1)
    return (causal & ((key == _PROMPT) | (key == query))).unsqueeze(1)


def _mask_for(model: torch.nn.Module, attention: torch.Tensor) -> torch.Tensor:
    """SDPA takes the boolean mask; eager attention adds it to its scores."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", "sdpa") != "eager":
        return attention
    dtype = next(model.parameters()).dtype
    blocked = torch.zeros(attention.shape, dtype=dtype, device=attention.device)
    return blocked.masked_fill(~attention, torch.finfo(dtype).min)
