"""Note [Compiling is not hanging]: a rank's stack printed to its 100 innermost frames still says
"compiling" when Dynamo's frame conversion is cut off below them."""

from paracheck.cases import Case
from paracheck.check.properties.compiled import compiling_too_long

# The innermost frames of a rank of a correct DDP's compiled case that timed out on a loaded
# machine (torch 2.13): importing the inductor's kernels from inside AOTAutograd's partitioner,
# the stack cut off ("...") before Dynamo's convert_frame.
CUT_OFF = """Current thread 0x00007f3a5d5ecb80 (most recent call first):
  File "/v/lib/python3.11/site-packages/jinja2/utils.py", line 199 in <module>
  File "/v/lib/python3.11/site-packages/torch/_inductor/kernel/flex/flex_decoding.py", line 114 in <module>
  File "/v/lib/python3.11/site-packages/torch/_inductor/lowering.py", line 9108 in <module>
  File "/v/lib/python3.11/site-packages/torch/_functorch/compile_utils.py", line 61 in fx_graph_cse
  File "/v/lib/python3.11/site-packages/torch/_functorch/partitioners.py", line 3766 in min_cut_rematerialization_partition
  File "/v/lib/python3.11/site-packages/torch/_functorch/_aot_autograd/graph_compile.py", line 1929 in _partition_joint_graph_into_fw_bw
  File "/v/lib/python3.11/site-packages/torch/_dynamo/output_graph.py", line 3119 in _call_user_compiler
  File "/v/lib/python3.11/site-packages/torch/_dynamo/symbolic_convert.py", line 5616 in RETURN_VALUE
  ..."""
# A rank running what was compiled, waiting in a collective it issued: a hang.
RUNNING = """Current thread 0x00007f3a5d5ecb80 (most recent call first):
  File "/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2810 in all_reduce
  File "/v/lib/python3.11/site-packages/torch/_functorch/_aot_autograd/runtime_wrappers.py", line 3 in call
  File "/v/lib/python3.11/site-packages/torch/_dynamo/eval_frame.py", line 845 in compile_wrapper"""


class _Hang:
    kind = "hung"

    def __init__(self, *stacks):
        self.failures = [type("F", (), {"detail": s})() for s in stacks]


def test_a_stack_cut_off_below_the_partitioner_is_still_compiling():
    compiled = Case(compiled="aot_eager+compiled-autograd")
    why = compiling_too_long(compiled, _Hang(CUT_OFF, "(no stack)"))
    assert why is not None and why.startswith("compiling (aot_eager+compiled-autograd) took longer")
    assert compiling_too_long(compiled, _Hang(RUNNING, RUNNING)) is None
    assert compiling_too_long(Case(), _Hang(CUT_OFF, CUT_OFF)) is None
