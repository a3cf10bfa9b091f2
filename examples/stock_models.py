"""A model written with nothing but PyTorch's own layers, as a user would write one without
paracheck in mind, to check a data-parallel wrapper on (docs/guide.md, "Your own model"):

    paracheck check bucketed sharded fsdp --model examples/stock_models.py:stock_lm \\
        --batch examples/stock_models.py:stock_lm_batch --loss-fn examples/stock_models.py:stock_lm_loss

The DDP, sharded-optimizer and paracheck FSDP built-ins pass on it. ``torch.compile``
(aot_eager, torch 2.13) of this model alone, in one process, raises at two rows or more ("view
size is not compatible with input tensor's size and stride", the head's linear on the
BatchNorm's transposed output): a DDP's ``+compile`` row skips those cases with torch's words
(Note [A user's model torch cannot compile]) and says how many it skipped. ``torch-fsdp`` raises,
as it would in training (docs/guide.md, "Your own model"): ``nn.MultiheadAttention`` reads
``out_proj.weight`` without calling ``out_proj``, and ``fully_shard``, applied to every
submodule that owns parameters, raises on ``out_proj``.

``stock_lm``: a causal language model of stock layers: ``nn.Embedding`` for tokens and for
positions, a pre-norm ``nn.TransformerEncoder`` (two ``nn.TransformerEncoderLayer``, GELU,
dropout off, a causal mask, a final ``nn.LayerNorm``), a ``nn.BatchNorm1d`` in eval mode (frozen
statistics, drawn from the seed as a pretrained network's would be: buffers a wrapper must
broadcast), and an output ``nn.Linear`` whose weight is the token embedding's (tied: one
parameter, two uses, which ``model.parameters()`` yields once). Dropout is off and the
BatchNorm frozen because paracheck refuses what no data-parallel wrapper can equal (two forwards
of one batch that differ; a forward that couples the rows of a batch).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["StockLM", "stock_lm", "stock_lm_batch", "stock_lm_loss"]

VOCAB, WIDTH, HEADS, FF, LAYERS, CONTEXT = 13, 8, 2, 16, 2, 5


class StockLM(nn.Module):
    def __init__(self, vocab: int, width: int, heads: int, ff: int, layers: int, context: int):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)
        layer = nn.TransformerEncoderLayer(
            width, heads, ff, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(
            layer, layers, norm=nn.LayerNorm(width), enable_nested_tensor=False
        )
        self.norm = nn.BatchNorm1d(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tokens.weight  # tied

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        h = self.tokens(tokens) + self.positions(torch.arange(t, device=tokens.device))
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=h.device, dtype=h.dtype)
        h = self.encoder(h, mask=mask, is_causal=True)
        h = self.norm(h.transpose(1, 2)).transpose(1, 2)  # BatchNorm1d normalises dim 1
        return self.head(h)


def stock_lm(seed: int, dtype: torch.dtype) -> nn.Module:
    model = StockLM(VOCAB, WIDTH, HEADS, FF, LAYERS, CONTEXT)
    with torch.no_grad():  # statistics a pretrained network would have, drawn from the seed
        model.norm.running_mean.normal_(0.0, 0.1)
        model.norm.running_var.uniform_(0.5, 1.5)
    model.norm.eval()
    return model.to(dtype)


def stock_lm_batch(seed: int, n: int, dtype: torch.dtype):
    tokens = torch.randint(0, VOCAB, (n, CONTEXT + 1))
    return tokens[:, :-1], tokens[:, 1:]


def stock_lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy over the batch's tokens (every row has as many)."""
    return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
