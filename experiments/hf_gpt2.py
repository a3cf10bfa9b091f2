"""A model written elsewhere: Hugging Face ``transformers``' GPT-2 (``GPT2LMHeadModel``, its
token embedding tied to its head), at a tiny configuration, for ``--model``. ``transformers`` is
not a dependency of paracheck; install it beside it to run this (docs/measurements.md, "A model
written elsewhere"):

    pip install --target /tmp/hfpkgs transformers
    PYTHONPATH=/tmp/hfpkgs paracheck check bucketed sharded fsdp torch-ddp \\
        --model experiments/hf_gpt2.py:build --batch experiments/hf_gpt2.py:batch \\
        --loss-fn experiments/hf_gpt2.py:loss

Dropout is off (every ``*_pdrop``): two forwards of one batch must agree for any data-parallel
wrapper to equal one process.
"""

from __future__ import annotations

import torch
from torch import nn

VOCAB, CONTEXT = 17, 6


def build(seed: int, dtype: torch.dtype) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=CONTEXT,
        n_embd=8,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(seed)
    return GPT2LMHeadModel(config).to(dtype)


def batch(seed: int, n: int, dtype: torch.dtype):
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (n, CONTEXT + 1), generator=generator)
    return tokens[:, :-1], tokens[:, 1:]


def loss(output, targets: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy over the batch's tokens (``output.logits``: the model returns a
    ``CausalLMOutputWithCrossAttentions``)."""
    return nn.functional.cross_entropy(output.logits.flatten(0, 1), targets.flatten())
