#!/usr/bin/env bash
# make gpu-check: the CUDA tests, then splitlab bench for the paper's models, on one GPU, in minutes.
# Every JSON and one markdown table land in ${OUT:-runs/gpu-check}; each step has its own timeout, all
# of them together at most ${GPU_CHECK_SECONDS:-480} s (a step gets at most the time left, none with
# under 30 s left; both reported), and a failing step does not stop the others. Random-init backbones (nothing downloaded
# but packages). GPU_CHECK_PYTHON=python3 uses that interpreter instead of the project's .venv (a GPU machine
# whose Python already has torch; splitlab is then run from this checkout).
set -u
OUT=${OUT:+$(realpath -m "$OUT")}  # as given, from where it was given
cd "$(dirname "$0")/.." || exit 2
BIN=${BIN:-.venv/bin}
PY=${GPU_CHECK_PYTHON:-$BIN/python}
OUT=${OUT:-runs/gpu-check}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu-check: no CUDA device is visible to torch on this machine (torch.cuda.is_available() is False);" >&2
    echo "           run it where a GPU is (make test covers the CPU path)." >&2
    exit 2
fi
export PYTHONUNBUFFERED=1  # a step stopped by its timeout keeps its log up to the last line
"$PY" - <<'PY' | tee "$OUT/device.txt"
import torch
from splitlab.backbone import flash_attn_importable
p = torch.cuda.get_device_properties(0)
print(f"device: {p.name}, {p.total_memory / 2**30:.0f} GiB, capability {p.major}.{p.minor}; torch {torch.__version__}, "
      f"CUDA {torch.version.cuda}; flash-attn {'yes' if flash_attn_importable() else 'no (or it does not import)'}")
PY
status=0
deadline=$((SECONDS + ${GPU_CHECK_SECONDS:-480}))
step() {  # step NAME SECONDS COMMAND...: run with a timeout, record the outcome, never stop the script
    local name=$1 limit=$2 left=$((deadline - SECONDS)); shift 2
    if ((left < 30)); then
        echo "== $name: SKIPPED (${left}s of the time budget left)"; status=1; return
    fi
    ((limit > left)) && limit=$left
    echo "== $name (timeout ${limit}s)"
    # SIGINT first: pytest then still writes its summary and JUnit XML, a bench its traceback; a
    # step that ignores it (or GracefulStop's checkpoint-then-stop runs long) is killed 20 s later
    timeout -s INT -k 20 "$limit" "$@" > "$OUT/$name.log" 2>&1
    case $? in
        0) echo "   ok" ;;
        124 | 137) echo "   TIMED OUT after ${limit}s: see $OUT/$name.log"; status=1 ;;
        *) echo "   FAILED: see $OUT/$name.log"; status=1 ;;
    esac
}
bench() {  # bench NAME SECONDS ARGS...
    local name=$1 limit=$2; shift 2
    step "bench-$name" "$limit" "$PY" -m splitlab bench --device cuda --dtype bfloat16 --fraction 0.7 --warmup 3 \
        --iters 10 --json "$OUT/bench-$name.json" "$@"
}
# Most telling first: correctness (the CUDA tests, an FSDP fit), the paper's headline model, then the rest.
# the tests that compile (Inductor, cold on a fresh machine) in a step of their own, so that a slow
# compile cannot take the other tests' results with it
step cuda-tests 120 "$PY" -m pytest -m cuda -q -p no:cacheprovider --junitxml="$OUT/cuda-tests.xml" tests/cuda \
    --ignore=tests/cuda/test_fsdp.py -k "not compiled and not flex"
step cuda-compile-tests 150 "$PY" -m pytest -m cuda -q -p no:cacheprovider --junitxml="$OUT/cuda-compile-tests.xml" \
    tests/cuda --ignore=tests/cuda/test_fsdp.py -k "compiled or flex"
step fsdp-fit 120 "$PY" -m pytest -m cuda -q -p no:cacheprovider --junitxml="$OUT/fsdp.xml" tests/cuda/test_fsdp.py
# the headline model in every form first (eager, compiled, flash): the paths most likely to fail
bench vit-l14-336 90 --model vit_large_patch14_clip_336 --batch-size 128
bench vit-l14-336-compiled 150 --model vit_large_patch14_clip_336 --batch-size 128 --compile
if "$PY" -c "import flash_attn" 2> /dev/null; then
    bench vit-l14-336-flash 90 --model vit_large_patch14_clip_336 --batch-size 128 --attn-backend flash
fi
bench eva02-l16-640 90 --model eva02_large_patch14_448 --patch-size 16 --img-size 640 --levels 64 32 16 --batch-size 4 --iters 3
bench vit-b16-224 60 --model vit_base_patch16_224 --batch-size 256
bench vit-h14-336 90 --model vit_huge_patch14_clip_336 --batch-size 64
bench eva02-l16-1024 90 --model eva02_large_patch14_448 --patch-size 16 --img-size 1024 --levels 64 32 16 --batch-size 2 --iters 3
bench vit-b16-224-compiled 120 --model vit_base_patch16_224 --batch-size 256 --compile
"$PY" - "$OUT" <<'PY' | tee "$OUT/table.md"
import json, pathlib, sys
from splitlab.report import bench_table
out = pathlib.Path(sys.argv[1])
records = [json.loads(p.read_text()) for p in sorted(out.glob("bench-*.json"))]
print((out / "device.txt").read_text().strip() + "\n")
print(bench_table(records) if records else "no benchmark finished")
PY
exit $status
