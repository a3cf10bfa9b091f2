#!/usr/bin/env bash
# Attached agents on NCCL, on a machine with 2 GPUs: two torchrun "nodes" of one GPU each (one
# torchrun command per node, rendezvous on 127.0.0.1), one driver that checks a DDP that hangs
# (it skips the parameters whose local gradient is None) and then a correct DDP on the same
# agents; then a driver refused at a dead address. Prints the verdicts, the hang report, every
# exit code and how long each step took; about 2 minutes.
#
#   scripts/attached_nccl.sh [OUT_DIR]       (PYTHON=python3 by default; src/ is put on
#                                            PYTHONPATH, hypothesis must be importable)
#
# The agents' logs and the driver's output are left in OUT_DIR (default: a new temporary one).
# BACKEND=gloo runs the same on CPU (where gloo may abort an agent: then the check stops there).
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${1:-$(mktemp -d)}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
PORT=${PORT:-29531}
MUTANT=paracheck.mutants.ddp:SkipNoneGradDDP
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

"$PY" -c 'import torch; print("torch", torch.__version__, "GPUs:", torch.cuda.device_count())'

t0=$(now)
for k in 0 1; do
    # One GPU per "node": each node's local rank 0 sees only its own card.
    CUDA_VISIBLE_DEVICES=$k timeout 170 "$PY" -m torch.distributed.run --nnodes 2 --node-rank $k \
        --nproc-per-node 1 --master-addr 127.0.0.1 --master-port "$PORT" \
        -m paracheck.agent --backend "${BACKEND:-nccl}" --wait 160 >"$OUT/node$k.log" 2>&1 &
    eval "node$k=$!"
done

echo "== driver: $MUTANT, then naive, on the same two agents"
t1=$(now)
timeout 150 "$PY" -m paracheck.cli check "$MUTANT" naive --attach "127.0.0.1:$PORT" \
    --world-sizes 2 --max-examples 20 --timeout 20 --no-database >"$OUT/driver.txt" 2>&1
driver=$?
driver_s=$(since "$t1")
grep -E '^(PASS|FAIL|paracheck)' "$OUT/driver.txt"
echo "-- the hang's report (what failed), first lines:"
grep -A 14 -m 1 'what failed:' "$OUT/driver.txt"
echo "-- driver exit $driver after ${driver_s} s (agents started ${t0}, driver ${t1})"

wait "$node0"; code0=$?
wait "$node1"; code1=$?
echo "-- torchrun nodes exit $code0 $code1, $(since "$t0") s from their start"
for k in 0 1; do echo "-- node $k log:"; grep 'paracheck.agent' "$OUT/node$k.log"; done

echo "== a driver at the same address once the job ended (--attach-timeout 5)"
t2=$(now)
timeout 60 "$PY" -m paracheck.cli check naive --attach "127.0.0.1:$PORT" --attach-timeout 5 \
    >"$OUT/dead.txt" 2>&1
dead=$?
cat "$OUT/dead.txt"
echo "-- exit $dead after $(since "$t2") s"
echo "logs in $OUT"
[ "$driver" = 1 ] && grep -q '^PASS naive' "$OUT/driver.txt" && [ "$dead" = 2 ]
