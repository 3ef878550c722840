import importlib
import os
import sys

# Filled in by vcloud_pipeline.jobs.render: the names and the exit code the trainer shares.
GPUS_REQUIRED_ENV = "{{ GPUS_REQUIRED_ENV }}"
GPU_HINT_ENV = "{{ GPU_HINT_ENV }}"
EXIT_GPUS_MISSING = int("{{ EXIT_GPUS_MISSING }}")

failed = []
for name in ("vcloud", "vcloud.data", "tifffile", "rasterio", "torch"):
    try:
        module = importlib.import_module(name)
    except Exception as exc:
        failed.append(name)
        print("preflight: import", name, "FAILED:", type(exc).__name__, exc, flush=True)
        continue
    version = getattr(module, "__version__", "n/a")
    where = getattr(module, "__file__", "?")
    print("preflight:", name, version, "from", where, flush=True)
gpus_missing = False
if "torch" not in failed:
    import torch
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    print("preflight: torch accelerator available=%s devices=%d hip=%s cuda=%s" % (
        torch.cuda.is_available(), visible, torch.version.hip, torch.version.cuda), flush=True)
    # Set by the job script when the profile requires GPUs: how many Slurm gave this node.
    required = int(os.environ.get(GPUS_REQUIRED_ENV, "").strip() or 0)
    if visible < required:
        gpus_missing = True
        build = ("a ROCm build (HIP %s)" % torch.version.hip if torch.version.hip
                 else "a CUDA %s build" % torch.version.cuda if torch.version.cuda else "a CPU-only build")
        print("preflight: FAILED: GPUs required: this node of the job was given %d %s, but PyTorch sees %d "
              "(torch %s, %s); the training jobs would run on the CPU" % (
                  required, "GPU" if required == 1 else "GPUs", visible, torch.__version__, build), flush=True)
        hint = os.environ.get(GPU_HINT_ENV, "").strip()
        if hint:
            print("preflight: what to do:", hint, flush=True)
print("preflight: python", sys.version.split()[0], "at", sys.executable, flush=True)
if failed:
    print("preflight: FAILED imports:", ", ".join(failed) + ";",
          "check PYTHONPATH, the synced code and the extra packages directory", flush=True)
if gpus_missing:
    sys.exit(EXIT_GPUS_MISSING)
if failed:
    sys.exit(1)
print("preflight: OK", flush=True)
