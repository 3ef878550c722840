#!/usr/bin/env bash
# shellcheck disable=SC2317,SC2016  # functions run through step's `bash -c`, which expands "$@" itself
# One rented GPU machine, one command: everything the GPU checks need, within 9 minutes.
#
#  0. nvidia-smi, python/torch versions, which of the trainer's packages import.
#  1. rasterio (data generation and prepare need it; training does not): where it does not import,
#     the wheels in $GPU_WHEELS (default var/gpu_wheels, carried beside the working tree: *.whl is
#     git-ignored) are unpacked into a temporary directory on PYTHONPATH, those whose distribution
#     is already installed left out.
#  2. The tiny dataset, as the pipeline's data job makes it (`python -m vcloud.data.synthetic
#     --preset tiny --seed 0`, then `python -m vcloud.data.prepare`). Meanwhile, in the background,
#     benchmarks/quality.py's datasets (`small` seed 0, `small-hazier` seed 1 with its splits),
#     made by quality.py's own functions so that it reuses them.
#  3. benchmarks/gpu_node.sh on the tiny dataset, writing into $OUT (gpu.txt, memory_full.txt,
#     train_tiny.log, gpu_run.tar.gz, refused.log).
#  4. benchmarks/quality.py --device cuda, seeds 0 and 1 at once on the one GPU, each until its
#     stages reach model_small.yaml's configured epochs (train.stageN.epochs: 10/20/10/4) or the
#     --budget-minutes left by the steps before (at most 5) runs out; $OUT/quality_seed{0,1}.log.
#
# Every step runs under `timeout` (its whole process group is killed), a failed step does not stop
# the next, and the last lines are one summary line per step. All output also goes to
# $OUT/session.log; $OUT ends with at most 8 files, none over 16 MiB (gpu_run.tar.gz is dropped if
# it is larger).
#
#     OUT=DIR bash benchmarks/gpu_session.sh            # on the GPU machine ($OUT comes back)
#     bash benchmarks/gpu_session.sh --data-only DIR    # CPU check: steps 0-2 into DIR, no GPU steps
#
# Environment: GPU_SESSION_LIMIT_S (default 540: the whole script's wall time), GPU_WHEELS,
# GPU_SESSION_WORK (working directory, default a new temporary one; datasets found there are
# reused), QUALITY_ARGS (appended to both quality.py command lines, so they win: e.g. a CPU check
# with "--device cpu --budget-minutes 0.5 --test-limit 2").
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
root=$PWD

data_only=""
if [[ ${1:-} == --data-only ]]; then
  data_only=${2:?--data-only DIR}
  mkdir -p "$data_only" && data_only=$(cd "$data_only" && pwd)
  export OUT=$data_only/out
fi
: "${OUT:?set OUT to the directory whose files come back}"
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)

limit=${GPU_SESSION_LIMIT_S:-540}
wheels=${GPU_WHEELS:-var/gpu_wheels}
work=${data_only:-${GPU_SESSION_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/gpu_session.XXXXXX")}}
export PYTHONPATH=$root/trainer/src PYTHONUNBUFFERED=1 OUT work wheels

summary=()
failed=0
left() { echo $((limit - SECONDS)); }

# step NAME TIMEOUT_S COMMAND...: run it under timeout, record one summary line.
step() {
  local name=$1 seconds=$2 start=$SECONDS rc note
  shift 2
  if ((seconds < 5)); then
    summary+=("$(printf '%-14s SKIPPED  (no time left)' "$name")"); failed=1; return 1
  fi
  echo "== $name (timeout ${seconds}s, ${SECONDS}s into the session)"
  # A fresh bash that knows this script's functions: timeout runs commands, not functions, and
  # kills the whole process group when time is up.
  timeout -k 10 "$seconds" bash -c "$(declare -f); "'"$@"' "$name" "$@"
  rc=$?
  note="exit $rc"
  ((rc == 124 || rc == 137)) && note="TIMED OUT after ${seconds}s"
  ((rc != 0)) && failed=1
  summary+=("$(printf '%-14s %-8s %4ds  %s' "$name" "$([[ $rc == 0 ]] && echo ok || echo FAILED)" \
    $((SECONDS - start)) "$note")")
  return "$rc"
}

show_env() {
  nvidia-smi || echo "nvidia-smi: not available"
  python3 - <<'EOF'
import importlib, platform, sys
print("python", platform.python_version(), sys.executable)
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
for name in ("numpy", "yaml", "tifffile", "rasterio", "affine", "matplotlib", "tensorboard"):
    try:
        module = importlib.import_module(name)
        print(f"  {name:<12} {getattr(module, '__version__', '?')}")
    except Exception as exc:  # noqa: BLE001
        print(f"  {name:<12} missing ({type(exc).__name__}: {exc})")
EOF
}

# rasterio from carried wheels: unpacked (a wheel is a zip), no pip or network needed.
ensure_rasterio() {
  if python3 -c 'import rasterio' 2>/dev/null; then
    echo "rasterio imports already"; return 0
  fi
  if ! compgen -G "$wheels/*.whl" > /dev/null; then
    echo "rasterio does not import and $wheels holds no wheels: data generation will fail"; return 1
  fi
  local pylibs=$work/pylibs
  python3 - "$wheels" "$pylibs" <<'EOF' || return 1
import importlib.metadata as md, sys, zipfile
from pathlib import Path
wheels, target = Path(sys.argv[1]), Path(sys.argv[2])
for wheel in sorted(wheels.glob("*.whl")):
    dist = wheel.name.split("-")[0]
    try:
        print(f"{wheel.name}: {dist} {md.version(dist)} installed, left out")
        continue
    except md.PackageNotFoundError:
        pass
    zipfile.ZipFile(wheel).extractall(target)
    print(f"{wheel.name}: unpacked")
EOF
  export PYTHONPATH=$PYTHONPATH:$pylibs
  python3 -c 'import rasterio; print("rasterio", rasterio.__version__, "GDAL", rasterio.__gdal_version__)'
}

tiny_data() {
  python3 -m vcloud.data.synthetic --out "$work/tiny_raw" --preset tiny --seed 0 &&
    python3 -m vcloud.data.prepare --raw "$work/tiny_raw" --out "$work/tiny" --overwrite
}

# quality.py's datasets in --work layout (WORK/prepared, WORK/shifted/prepared), from its own
# functions and constants; small and small-hazier in two processes, niced below the GPU work.
quality_data() {
  local q=$1 code
  if [[ -f $q/prepared/index.json && -f $q/shifted/prepared/index.json ]]; then
    echo "quality data already in $q: reused"; return 0
  fi
  code='
import sys
from pathlib import Path
sys.path.insert(0, "benchmarks")
import quality as q
which, work = sys.argv[1], Path(sys.argv[2])
if which == "small":
    q.generate_raw(work / "raw", preset="small", seed=0)
    q.prepare_dataset(work / "raw", work / "prepared", workers=4, overwrite=True)
else:
    q.generate_raw(work / "shifted" / "raw", preset=q.SHIFTED_PRESET, seed=q.SHIFTED_SEED)
    q.prepare_dataset(work / "shifted" / "raw", work / "shifted" / "prepared",
                      q.PrepareSettings(fractions=q.SHIFTED_SPLITS), workers=2, overwrite=True)
print(which, "prepared")
'
  local small shifted rc
  nice -n 10 python3 -c "$code" small "$q" &
  small=$!
  nice -n 10 python3 -c "$code" shifted "$q" &
  shifted=$!
  wait "$small"; rc=$?
  wait "$shifted" || rc=1
  rm -rf "$q/raw" "$q/shifted/raw"  # quality.py reads only the prepared stacks
  for d in "$q/prepared" "$q/shifted/prepared"; do
    [[ -f $d/index.json ]] || { echo "no $d/index.json"; rm -rf "$d"; rc=1; }
  done
  return "$rc"
}

# One quality.py run per seed, both on the GPU at once; the budget is what the session has left.
quality_runs() {
  local budget=$1 seed pids=() rc=0
  mkdir -p "$work/q1/shifted"
  [[ -e $work/q1/prepared ]] || ln -s "$work/q0/prepared" "$work/q1/prepared"
  [[ -e $work/q1/shifted/prepared ]] || ln -s "$work/q0/shifted/prepared" "$work/q1/shifted/prepared"
  for seed in 0 1; do
    # shellcheck disable=SC2086  # QUALITY_ARGS: extra arguments, split on spaces
    python3 benchmarks/quality.py --device cuda --seed "$seed" --work "$work/q$seed" \
      --budget-minutes "$budget" --threads 4 ${QUALITY_ARGS:-} > "$OUT/quality_seed$seed.log" 2>&1 &
    pids+=($!)
  done
  for seed in 0 1; do
    wait "${pids[$seed]}" || { rc=1; echo "quality seed $seed failed:"; tail -5 "$OUT/quality_seed$seed.log"; }
  done
  return "$rc"
}

main() {
  echo "gpu_session: $(date -u +%FT%TZ), limit ${limit}s, work $work, OUT $OUT"
  step env 60 show_env
  step rasterio 90 ensure_rasterio
  [[ -d $work/pylibs ]] && export PYTHONPATH=$PYTHONPATH:$work/pylibs  # unpacked in step's own shell
  step tiny-data 90 tiny_data

  # quality.py's data in the background while the GPU node checks run (CPU only, ~2 min).
  echo "== quality-data started in the background: $work/quality_data.log"
  mkdir -p "$work/q0"
  local qdata_start=$SECONDS
  timeout -k 10 $(($(left) - 120)) bash -c "$(declare -f quality_data); "'quality_data "$1"' _ "$work/q0" \
    > "$work/quality_data.log" 2>&1 &
  local qdata=$!

  if [[ -n $data_only ]]; then
    wait "$qdata"; local rc=$?
    cat "$work/quality_data.log"
    summary+=("$(printf '%-14s %-8s %4ds  exit %s' quality-data "$([[ $rc == 0 ]] && echo ok || echo FAILED)" \
      $((SECONDS - qdata_start)) "$rc")")
    ((rc != 0)) && failed=1
  else
    # gpu_node.sh: ~3 min expected; whatever it leaves goes to quality.py.
    local node_timeout=$(( $(left) - 240 < 270 ? $(left) - 240 : 270 ))
    step gpu_node "$node_timeout" bash benchmarks/gpu_node.sh "$work/tiny" "$OUT"

    wait "$qdata"; local rc=$?
    echo "== quality-data (background) output:"
    cat "$work/quality_data.log"
    summary+=("$(printf '%-14s %-8s %4ds  exit %s (background, from %ds)' quality-data \
      "$([[ $rc == 0 ]] && echo ok || echo FAILED)" $((SECONDS - qdata_start)) "$rc" "$qdata_start")")
    ((rc != 0)) && failed=1

    # Budget: the time left less ~55 s for start-up (imports, CUDA) and the scoring past the
    # budget, at most 5 minutes; the timeout is the session's end.
    local budget
    budget=$(python3 -c "import sys; print(round(min(5.0, (int(sys.argv[1]) - 55) / 60), 2))" "$(left)")
    echo "quality.py budget: $budget min, $(left)s left in the session"
    step quality "$(($(left) - 10))" quality_runs "$budget"
    for seed in 0 1; do
      [[ -f $OUT/quality_seed$seed.log ]] || continue
      echo "-- quality seed $seed: $(grep -c . "$OUT/quality_seed$seed.log") lines; the table and the JSON:"
      grep -E '^(baseline|shifted|stage|method|\{)' "$OUT/quality_seed$seed.log" | tail -40
    done
  fi

  # What comes back: at most 8 files of at most 16 MiB.
  local f
  for f in "$OUT"/*; do
    [[ -f $f && $f != "$OUT/session.log" ]] || continue
    if (($(stat -c %s "$f") > 16 * 1024 * 1024)); then
      if [[ $f == *.tar.gz ]]; then
        echo "$f: $(stat -c %s "$f") bytes, over 16 MiB: dropped"; rm -f "$f"
      else
        echo "$f: over 16 MiB: its last 15 MiB kept"; tail -c 15M "$f" > "$f.tmp" && mv "$f.tmp" "$f"
      fi
    fi
  done
  echo "== $OUT:"
  ls -l "$OUT"
  local count
  count=$(find "$OUT" -type f | wc -l)
  ((count > 8)) && echo "WARNING: $count files under $OUT, only 8 come back"

  echo "== summary (${SECONDS}s in all)"
  printf '%s\n' "${summary[@]}"
  echo "gpu_session: exit $failed"
  return "$failed"
}

main 2>&1 | tee "$OUT/session.log"
exit "${PIPESTATUS[0]}"
