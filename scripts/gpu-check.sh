#!/usr/bin/env bash
# make gpu-check: the CUDA tests, then `splitlab bench` for the paper's models, on one GPU, within
# ${GPU_CHECK_SECONDS:-480} s counted from the start. Random-init backbones (nothing downloaded but
# packages). Every JSON, log and JUnit XML, steps.md (every step: ok / FAILED / TIMED OUT / SKIPPED, its
# time, its log) and table.md (the device, the benchmark table, the steps) land in ${OUT:-runs/gpu-check};
# table.md is printed at the end. GPU_CHECK_PYTHON=python3 uses that interpreter instead of the
# project's .venv (a GPU machine whose Python already has torch; splitlab then runs from this checkout).
#
# Order, with each step's limit in seconds (why: everything gets a real chance in 480 s, the most
# telling first, and a slow step cannot take the others' results with it):
#   1. preflight: a CUDA device, splitlab's imports, the device line (~10 s); exit 2 at once if either
#      is missing, before any time is spent.
#   2. correctness, three steps at once: they time nothing, so they can share the GPU and the CPU,
#      and this phase costs its longest step instead of their sum (limits: 120 s instead of 310 s):
#        cuda-tests 90 (no compilation) | cuda-compile-tests 120 (Inductor: compiled blocks, flex) |
#        fsdp-fit 100                                                             -> 120 wall
#   3. eager benches, bf16, f = 0.7, `auto` backend (flash-attn where it imports, else SDPA on
#      nested tensors; the JSON names it), one at a time, alone on the machine:
#        ViT-L/14-336 b128 40 | ViT-B/16-224 sweep b1,8,32,64,256 with the dense ideal 60 |
#        ViT-H/14-336 b64 50 | EVA-02-L/16 640 b4 30 | EVA-02-L/16 1024 b2 30 |
#        the dense recipes' whole models, images in and outputs out (`--task`: tasks/coco.yaml's
#        Mask R-CNN at 1024 px b2 60, tasks/ade20k.yaml's UperNet at 640 px b4 40)
#        (ViTs 10 timed batches, EVA and the dense models 3)                     -> 310
#   4. compiled benches (--compile; cold Inductor compiles are most of it):
#        ViT-L/14-336 100 | ViT-B/16-224 70 | ViT-H/14-336 120                  -> 290
#   5. only where flash-attn imports (phases 3-4 then ran flash): the eager ViTs on nested tensors,
#      so that both backends are in the table: ViT-L 40 | ViT-B sweep 40 | ViT-H 50 -> 130
# The limits are about twice the expected times and sum to ~730 s (~860 s with flash-attn) against
# the 480 s budget; expected in all ~470 s (the compiled and nested benches after it may be cut). A step gets at most the time left, none starts
# with under 30 s left (it is listed SKIPPED), so when steps run long the last ones are cut first.
# At its limit a step gets SIGINT (pytest still writes its summary and JUnit XML, a bench its
# traceback), and 20 s later SIGKILL; Ctrl-C stops the running steps the same way and still writes
# the listing. Exit status: 0 when every step ran and passed; 1 when one failed, timed out or was
# skipped for time; 2 when nothing can run (no GPU, splitlab does not import); 130 after Ctrl-C.
set -u
OUT=${OUT:+$(realpath -m "$OUT")} # as given, from where it was given
cd "$(dirname "$0")/.." || exit 2
BIN=${BIN:-.venv/bin}
PY=${GPU_CHECK_PYTHON:-$BIN/python}
OUT=${OUT:-runs/gpu-check}
BUDGET=${GPU_CHECK_SECONDS:-480}
deadline=$((SECONDS + BUDGET))
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 # a step stopped by its timeout keeps its log up to the last line

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2> /dev/null; then
    if ! "$PY" -c "import torch" 2> /dev/null; then
        echo "gpu-check: $PY cannot import torch; run make gpu-check (it installs the project into .venv)," >&2
        echo "           or set GPU_CHECK_PYTHON to a Python that has torch." >&2
    else
        echo "gpu-check: no CUDA device is visible to torch on this machine (torch.cuda.is_available() is False);" >&2
        echo "           run it where a GPU is (make test covers the CPU path)." >&2
    fi
    exit 2
fi
mkdir -p "$OUT" || exit 2
STATE=$(mktemp -d) || exit 2 # what the steps hand each other (flash-attn, finished JSONs); not results
trap 'rm -rf "$STATE"' EXIT

# Preflight: every bench goes through `python -m splitlab` (the CLI's imports: lightning, jsonargparse,
# ...) and builds a PackedViT (timm >= 1.0.20); if either fails nothing but a few tests could run, so
# stop now with the reason.
timeout 120 "$PY" - "$STATE" > "$OUT/device.txt" <<'PY'
import pathlib
import sys

import torch

try:
    import lightning
    import timm

    import splitlab.commands  # `splitlab bench` and the CLI
    from splitlab.backbone import PackedViT, flash_attn_importable

    for name in ("vit_tiny_patch16_224", "eva02_tiny_patch14_224"):  # a timm too old fails here, in a second
        PackedViT(name, depth=1)
except Exception as err:  # a missing package, one too old: say which, with no traceback
    print(f"gpu-check: splitlab does not run with {sys.executable}: {type(err).__name__}: {err};", file=sys.stderr)
    print("           install the project's dependencies (make gpu-check does, into .venv) and run it again.", file=sys.stderr)
    sys.exit(2)
flash = flash_attn_importable()
(pathlib.Path(sys.argv[1]) / "flash").write_text("1" if flash else "0")
p = torch.cuda.get_device_properties(0)
print(
    f"device: {p.name}, {p.total_memory / 2**30:.0f} GiB, capability {p.major}.{p.minor}; torch {torch.__version__}, "
    f"CUDA {torch.version.cuda}, timm {timm.__version__}, lightning {lightning.__version__}; "
    f"flash-attn {'yes' if flash else 'no (not installed, or it does not import)'}"
)
PY
rc=$?
if ((rc)); then # 2: the reason is printed above
    ((rc == 2)) || echo "gpu-check: the preflight (imports, device query) failed (exit $rc); nothing was run." >&2
    exit 2
fi
cat "$OUT/device.txt"
flash=$(cat "$STATE/flash")

printf '| step | outcome | time | limit | log | last words |\n|---|---|---|---|---|---|\n' > "$OUT/steps.md"
status=0
interrupted=0
names=() pids=() limits=() starts=() # the steps running now

row() { # row NAME OUTCOME TIME LIMIT LOG NOTE: one line of steps.md
    local note=${6//|/\\|}
    printf '| %s | %s | %s | %s | %s | %s |\n' "$1" "$2" "$3" "$4" "$5" "${note:0:400}" >> "$OUT/steps.md"
}

start() { # start NAME SECONDS COMMAND...: run COMMAND in the background under its own timeout
    local name=$1 limit=$2 left=$((deadline - SECONDS))
    shift 2
    if ((interrupted)); then
        row "$name" "SKIPPED (interrupted)" - "${limit} s" - ""
        return
    fi
    if ((left < 30)); then
        ((left < 0)) && left=0
        echo "== $name: SKIPPED (${left} s of the ${BUDGET} s budget left)"
        row "$name" "SKIPPED (${left} s of the budget left)" - "${limit} s" - ""
        status=1
        return
    fi
    ((limit > left)) && limit=$left
    echo "== $name (timeout ${limit}s)"
    # timeout runs the step in a process group of its own: it forwards our SIGINT on Ctrl-C (on_signal)
    timeout -s INT -k 20 "$limit" "$@" > "$OUT/$name.log" 2>&1 &
    names+=("$name") pids+=("$!") limits+=("$limit") starts+=("$SECONDS")
}

last_words() { # last_words NAME: what a reader of steps.md needs from the log (pytest: failures + summary)
    local log=$OUT/$1.log
    if [[ $1 == *test* || $1 == fsdp* ]]; then
        { grep -E '^(FAILED|ERROR) ' "$log" | cut -c1-160 | head -n 5; tail -n 1 "$log"; } | paste -sd ';' -
    else
        tail -n 1 "$log"
    fi
}

finish() { # wait for the running steps; record each outcome as it ends
    local i rc took outcome
    while ((${#pids[@]})); do
        for i in "${!pids[@]}"; do
            kill -0 "${pids[$i]}" 2> /dev/null && continue
            wait "${pids[$i]}"
            rc=$?
            took=$((SECONDS - starts[i]))
            case $rc in
                0) outcome=ok ;;
                124 | 137) outcome="TIMED OUT" ;;
                *) outcome="FAILED (exit $rc)" ;;
            esac
            ((rc && interrupted)) && outcome="INTERRUPTED (exit $rc)"
            [[ $outcome == ok ]] || status=1
            if [[ $outcome == ok ]]; then
                echo "   ${names[$i]}: ok (${took}s)"
            else
                echo "   ${names[$i]}: $outcome after ${took}s: see $OUT/${names[$i]}.log"
            fi
            if [[ $outcome == ok && ${names[$i]} == bench-* ]]; then
                echo "$OUT/${names[$i]}.json" >> "$STATE/json"
                row "${names[$i]}" "$outcome" "${took} s" "${limits[$i]} s" "${names[$i]}.log" ""
            else
                row "${names[$i]}" "$outcome" "${took} s" "${limits[$i]} s" "${names[$i]}.log" "$(last_words "${names[$i]}")"
            fi
            unset 'names[i]' 'pids[i]' 'limits[i]' 'starts[i]'
        done
        ((${#pids[@]})) && sleep 0.25
    done
    names=() pids=() limits=() starts=()
}

# shellcheck disable=SC2329  # invoked by the trap below
on_signal() {
    ((interrupted)) && return
    interrupted=1
    status=1
    echo "gpu-check: interrupted: stopping the running step(s) (SIGINT), then writing what finished" >&2
    local p
    for p in "${pids[@]}"; do kill -INT "$p" 2> /dev/null; done
}
trap on_signal INT TERM

pytest_step() { # pytest_step NAME SECONDS PYTEST-ARGS...: the cuda tests, with a JUnit XML and a tmp of its own
    local name=$1 limit=$2
    shift 2
    # OMP: three steps share the CPU in phase 2 (Inductor's compile workers use it too)
    start "$name" "$limit" env OMP_NUM_THREADS=4 "$PY" -m pytest -m cuda -q -p no:cacheprovider \
        --junitxml="$OUT/$name.xml" --basetemp="$STATE/tmp-$name" "$@"
}

bench() { # bench NAME SECONDS ARGS...: splitlab bench in bf16 at f = 0.7
    local name=bench-$1 limit=$2
    shift 2
    rm -f "$OUT/$name.json" # the table reads this run's JSONs only
    start "$name" "$limit" "$PY" -m splitlab bench --device cuda --dtype bfloat16 --budget 0.7 --warmup 3 \
        --json "$OUT/$name.json" "$@"
    finish
}

VIT_L=(--model vit_large_patch14_clip_336 --batch-size 128 --iters 10)
VIT_B=(--model vit_base_patch16_224 --batch-size 256 --iters 10)
# ViT-B at every batch size a user serves (issue 39), with the dense ideal: what this GPU allows SPLIT's
# token count (at batch 1 a GPU runs ViT-B on launches more than on FLOPs)
VIT_B_SWEEP=(--model vit_base_patch16_224 --batch-sizes "1,8,32,64,256" --iters 10 --min-seconds 1)
VIT_H=(--model vit_huge_patch14_clip_336 --batch-size 64 --iters 10)
EVA=(--model eva02_large_patch14_448 --patch-size 16 --levels 64 32 16 --iters 3)

# 2. correctness, at once
pytest_step cuda-tests 90 tests/cuda --ignore=tests/cuda/test_fsdp.py -k "not compiled and not flex"
pytest_step cuda-compile-tests 120 tests/cuda --ignore=tests/cuda/test_fsdp.py -k "compiled or flex"
pytest_step fsdp-fit 100 tests/cuda/test_fsdp.py
finish
# 3. eager
bench vit-l14-336 40 "${VIT_L[@]}"
bench vit-b16-224-sweep 60 "${VIT_B_SWEEP[@]}" --dense-ideal
bench vit-h14-336 50 "${VIT_H[@]}"
bench eva02-l16-640 30 "${EVA[@]}" --img-size 640 --batch-size 4
bench eva02-l16-1024 30 "${EVA[@]}" --img-size 1024 --batch-size 2
bench coco-mask-rcnn-dense 60 --task detection --batch-size 2 --iters 3
bench ade20k-upernet-dense 40 --task segmentation --batch-size 4 --iters 3
# 4. compiled
bench vit-l14-336-compiled 100 "${VIT_L[@]}" --compile
bench vit-b16-224-compiled 70 "${VIT_B[@]}" --compile
bench vit-h14-336-compiled 120 "${VIT_H[@]}" --compile
# 5. the other backend, where there is one
if [[ $flash == 1 ]]; then
    bench vit-l14-336-nested 40 "${VIT_L[@]}" --attn-backend nested
    bench vit-b16-224-sweep-nested 40 "${VIT_B_SWEEP[@]}" --attn-backend nested
    bench vit-h14-336-nested 50 "${VIT_H[@]}" --attn-backend nested
else
    row "bench-*-nested" "SKIPPED (flash-attn does not import: the benches above ran nested)" - - - ""
fi

touch "$STATE/json"
if ! timeout 60 "$PY" - "$OUT" "$STATE/json" > "$OUT/table.md" <<'PY'; then
import json
import pathlib
import sys

from splitlab.commands.bench_dense import format_dense_run
from splitlab.commands.bench_table import bench_table, format_sweep

out, done = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
records = [json.loads(pathlib.Path(p).read_text()) for p in done.read_text().splitlines()]
print((out / "device.txt").read_text().strip() + "\n")
print((bench_table(records) if records else "no benchmark finished") + "\n")
for record in records:  # a sweep's own table: the spread of its pairs and the dense ideal
    if "sweep" in record:
        print(format_sweep(record["sweep"]) + "\n")
for record in records:  # a detector or segmenter end to end, part by part (splitlab bench --task)
    if "dense" in record:
        print(format_dense_run(record) + "\n")
print((out / "steps.md").read_text().strip())
PY
    echo "gpu-check: the benchmark table could not be written (above); table.md holds the steps only" >&2
    cat "$OUT/device.txt" - "$OUT/steps.md" <<< "" > "$OUT/table.md"
    status=1
fi
echo
cat "$OUT/table.md"
((interrupted)) && exit 130
exit $status
