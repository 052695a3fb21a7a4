"""A tiny char-level tokenizer and GPT-2 model built from a config, for tests and the
one-machine demo (no hub downloads here). Both save with `save_pretrained` and load with
`AutoTokenizer` / `AutoModelForCausalLM` and vLLM as they are."""

from __future__ import annotations

import string
from typing import Any

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
# Printable ASCII without the vertical tab and form feed: enough for arithmetic and for
# running GSM8K text through the code paths in tests.
DEFAULT_CHARS = "".join(c for c in string.printable if c not in "\x0b\x0c\r")


def build_tiny_tokenizer(chars: str = DEFAULT_CHARS) -> Any:
    """A character-level `PreTrainedTokenizerFast` that prepends <bos> to every text."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for char in dict.fromkeys(chars):
        vocab.setdefault(char, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, vocab[BOS])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,
    )


def build_tiny_model(
    tokenizer: Any,
    n_layer: int = 3,
    n_embd: int = 128,
    n_head: int = 4,
    n_positions: int = 128,
    seed: int = 0,
) -> Any:
    """A randomly initialised `GPT2LMHeadModel` (a vLLM-supported architecture) whose
    special token ids match `tokenizer` (GPT-2's defaults of 50256 would not)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        # GPT-2's tanh GELU as one fused op: `gelu_new`, the default, computes the same
        # function in eight elementwise passes, a third of a CPU forward pass (vLLM runs both).
        activation_function="gelu_pytorch_tanh",
        # RL needs the training forward to match sampling: no dropout.
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    torch.manual_seed(seed)
    return GPT2LMHeadModel(config)


def build_tiny_classifier(
    tokenizer: Any, labels: list[str], n_embd: int = 32, n_positions: int = 128, seed: int = 0
) -> Any:
    """A randomly initialised 2-layer `GPT2ForSequenceClassification` with `labels` (one
    label: a reward model) on `tokenizer`'s special token ids."""
    import torch
    from transformers import GPT2Config, GPT2ForSequenceClassification

    # Label fields are PretrainedConfig's keyword arguments, not GPT2Config's own.
    label_fields: dict[str, Any] = {
        "id2label": dict(enumerate(labels)),
        "label2id": {name: i for i, name in enumerate(labels)},
    }
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=2,
        n_head=2,
        **label_fields,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    torch.manual_seed(seed)
    model = GPT2ForSequenceClassification(config)
    # A larger score head than GPT-2's init spreads scores enough to rank texts apart.
    torch.nn.init.normal_(model.score.weight, std=1.0)
    return model
