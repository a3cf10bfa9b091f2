"""A collective on a CPU tensor under NCCL (a token count made with ``torch.tensor(n)``) is
diagnosed as such, with the user's line; other tracebacks are left alone."""

from paracheck.check.diagnose import cpu_tensor_on_nccl

# A rank's traceback as a training loop raised it on an H100 with NCCL.
TRACEBACK = """Traceback (most recent call last):
  File "/x/site-packages/paracheck/world/_rank.py", line 416, in _serve
    result = fn(payload)
  File "/x/site-packages/paracheck/check/ranks/loop.py", line 62, in run_loop
    step_fn(model, optimizer, batches, **extra)
  File "/home/me/mypkg/train.py", line 18, in train_step
    dist.all_reduce(local)
  File "/x/site-packages/paracheck/world/_collectives.py", line 227, in counted
    return fn(*args, **kwargs)
  File "/x/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py", line 3068, in all_reduce
    work = group.allreduce([tensor], opts)
RuntimeError: No backend type associated with device type cpu
"""


def test_a_cpu_tensor_under_nccl_is_named_with_the_users_line():
    said = cpu_tensor_on_nccl(TRACEBACK)
    assert said is not None
    assert "a collective on a CPU tensor under NCCL (dist.all_reduce(local) at train.py:18)" in said
    assert "device=p.device" in said


def test_other_failures_are_not_diagnosed_so():
    assert cpu_tensor_on_nccl(TRACEBACK.replace("No backend type", "Some other error")) is None
