"""``paracheck.fsdp.gather_units`` (Note [A module reads its children's parameters]): which
module's call gathers each module's parameters, tested without processes."""

from torch import nn

from paracheck.fsdp import gather_units
from paracheck.workloads.toy import ToyModel


def _matrix(p) -> bool:
    return p.requires_grad and p.dim() >= 2  # the reference FSDP's sharded parameters


def test_attention_gathers_the_output_projection_it_reads_without_calling():
    """``nn.MultiheadAttention`` owns ``in_proj_weight`` and reads ``out_proj.weight`` in its own
    call: ``out_proj`` is gathered by it; the layer's other Linears stay their own units."""
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    units = gather_units(layer, _matrix)
    assert units[layer.self_attn.out_proj] is layer.self_attn
    assert units[layer.self_attn] is layer.self_attn
    assert units[layer.linear1] is layer.linear1 and units[layer.norm1] is layer.norm1


def test_layers_under_a_container_or_a_frozen_root_are_their_own_units():
    """A ``Sequential`` shards nothing of its own, nor does the CS336 toy model's root (a frozen
    vector): every layer is its own unit, as the generated models' are."""
    seq = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    assert all(units_of is m for m, units_of in gather_units(seq, _matrix).items())
    toy = ToyModel()
    assert all(u is m for m, u in gather_units(toy, _matrix).items())
    assert gather_units(toy, lambda p: True)[toy.fc1] is toy  # were the frozen vector sharded
