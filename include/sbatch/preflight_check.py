import importlib
import sys

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
if "torch" not in failed:
    import torch
    print("preflight: torch accelerator available=%s devices=%d hip=%s cuda=%s" % (
        torch.cuda.is_available(), torch.cuda.device_count(), torch.version.hip, torch.version.cuda), flush=True)
print("preflight: python", sys.version.split()[0], "at", sys.executable, flush=True)
if failed:
    print("preflight: FAILED imports:", ", ".join(failed) + ";",
          "check PYTHONPATH, the synced code and the extra packages directory", flush=True)
    sys.exit(1)
print("preflight: OK", flush=True)
