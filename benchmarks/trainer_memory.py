"""Peak memory and step time of one stage-1 (CFDT) training step under the memory switches.

Each variant runs in a fresh subprocess so allocator state from one cannot leak into the next:
all switches off, each switch alone, all on. On CPU the peak is the process's peak resident set
size (``ru_maxrss``) minus its resident set size after the model, optimizer and batch were created
(so imports, weights and inputs are excluded and only what the training step adds is counted);
on GPU it is ``torch.cuda.max_memory_allocated`` after resetting the counter at the same point.
bf16 autocast is only applied on GPU (the trainer trains in fp32 on CPU), so on CPU the other four
switches carry the reduction.

Step time is the median of the timed steps after one warm-up step (the warm-up step is the one
whose peak is measured: it is the first to allocate optimizer state and autograd buffers).

Without ``--config`` the model is a scaled-down draft (``MODEL``) that fits a CPU. With
``--config full`` (or a config file) it is that config's ``model.stage1`` at its ``max_dates`` and
256x256, and each switch takes the config's own value (``gate_downsample: 64``,
``pair_chunk_size: 64``): the production measurement, for a GPU. A variant that runs out of GPU
memory is reported as such (``"oom": true``) instead of ending the benchmark.

    .venv/bin/python benchmarks/trainer_memory.py [--size 128] [--dates 8] [--steps 3]
    python3 benchmarks/trainer_memory.py --config full --device cuda

Last line: one JSON object with peak_off_mb, peak_on_mb, reduction (1 - on/off) and
step_time_ratio (on/off), plus every variant's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "trainer" / "src"))

SWITCHES = ("bf16", "grad_checkpointing", "gate_downsample", "target_only_pyramid", "pair_chunk_size")
VARIANTS: dict[str, tuple[str, ...]] = {
    "off": (), **{name: (name,) for name in SWITCHES}, "on": SWITCHES,
    **{f"no_{name}": tuple(s for s in SWITCHES if s != name) for name in SWITCHES},
}
"""Which switches each variant turns on (the rest are off): none, each alone, all, and all but one
(what each switch saves where the full model only fits with the others on)."""
DEFAULT_VARIANTS = ("off", *SWITCHES, "on")

MODEL = {
    "use_s1": True,
    "encoder_channels": [32, 64, 96, 128],
    "encoder_blocks": 1,
    "decoder_blocks": 1,
    "gate_channels": 32,
    "gate_blocks": 2,
    "tmt_dim": 128,
    "tmt_layers": 2,
    "tmt_heads": 4,
    "norm_groups": 8,
}
"""A scaled-down draft model whose memory is dominated, as in production, by the O(T^2) change
gate and the per-date encoder."""


def model_and_switches(config: str | None, size: int, dates: int) -> tuple[dict, dict[str, Any]]:
    """The stage-1 model section and each switch's "on" value: ``MODEL`` and values scaled to
    ``size``/``dates`` without a config, else the config's own."""
    if not config:
        return {**MODEL, "max_dates": dates}, {
            "bf16": True, "grad_checkpointing": True, "gate_downsample": size // 4,  # production: 256 -> 64
            "target_only_pyramid": True, "pair_chunk_size": max(1, dates * (dates - 1) // 4)}  # 64 of 240
    from vcloud.config import load_config

    path = Path(config) if Path(config).suffix else ROOT / "trainer" / "configs" / f"model_{config}.yaml"
    loaded = load_config(path)
    memory = loaded.memory
    return loaded.model.section(1), {
        "bf16": True, "grad_checkpointing": True, "gate_downsample": memory.gate_downsample or size // 4,
        "target_only_pyramid": True,
        "pair_chunk_size": memory.pair_chunk_size or max(1, dates * (dates - 1) // 4)}


def _rss_kb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def run_child(variant: str, size: int, dates: int, steps: int, device_name: str, config: str | None) -> dict:
    import torch

    try:
        return _measure(variant, size, dates, steps, device_name, config)
    except torch.OutOfMemoryError as exc:
        return {"variant": variant, "oom": True, "peak_mb": None, "step_s": None, "first_step_s": None,
                "error": str(exc).splitlines()[0]}


def _measure(variant: str, size: int, dates: int, steps: int, device_name: str, config: str | None) -> dict:
    import torch
    import torch.nn.functional as F

    from vcloud.models.cfdt import CFDT, CFDTConfig
    from vcloud.models.memory import MemoryOptions

    torch.manual_seed(0)
    torch.set_num_threads(1)
    device = torch.device(device_name)
    section, on_values = model_and_switches(config, size, dates)
    switches = {name: on_values[name] for name in VARIANTS[variant]}
    memory = MemoryOptions(**{**MemoryOptions.all_off().__dict__, **switches})
    cfg = CFDTConfig.from_dict({**section, "max_dates": dates})
    model = CFDT(cfg, memory).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    batch = {
        "inputs": torch.rand(1, dates, 13, size, size, generator=g),
        "masks": (torch.rand(1, dates, 1, size, size, generator=g) > 0.6).float(),
        "target_index": torch.tensor([dates // 2]),
        "s1": torch.rand(1, dates, 2, size, size, generator=g),
        "target": torch.rand(1, 13, size, size, generator=g),
    }
    batch = {k: v.to(device) for k, v in batch.items()}
    use_bf16 = memory.bf16 and device.type == "cuda"

    def step() -> float:
        start = time.perf_counter()
        ctx = torch.autocast("cuda", dtype=torch.bfloat16) if use_bf16 else torch.autocast("cpu", enabled=False)
        with ctx:
            out = model(batch["inputs"], batch["masks"], batch["target_index"], batch["s1"])
            loss = F.l1_loss(out.float(), batch["target"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base_kb = _rss_kb()
    first = step()
    if device.type == "cuda":
        peak_mb = (torch.cuda.max_memory_allocated() - base) / 2**20
    else:
        peak_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base_kb) / 1024
    times = [step() for _ in range(steps)] or [first]
    return {"variant": variant, "oom": False, "peak_mb": round(peak_mb, 1),
            "step_s": round(statistics.median(times), 3), "first_step_s": round(first, 3),
            "bf16_applied": use_bf16,
            "params": sum(p.numel() for p in model.parameters()), "switches": switches}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="tiny|small|full or a config file: its model.stage1 and memory "
                                         "values (default: the scaled-down MODEL)")
    parser.add_argument("--size", type=int, default=None,
                        help="patch side in pixels (default 128, 256 with --config)")
    parser.add_argument("--dates", type=int, default=None,
                        help="dates per series, T (default 8, the config's max_dates with --config)")
    parser.add_argument("--steps", type=int, default=2, help="timed steps after the measured one")
    parser.add_argument("--device", default="cuda" if os.environ.get("CUDA_VISIBLE_DEVICES") else "cpu")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                        help=f"comma-separated, of: {', '.join(VARIANTS)}")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.size is None:
        args.size = 256 if args.config else 128
    if args.dates is None:
        section = model_and_switches(args.config, args.size, 8)[0] if args.config else {}
        args.dates = int(section.get("max_dates", 8))
    if args.child:
        print(json.dumps(run_child(args.child, args.size, args.dates, args.steps, args.device, args.config)))
        return 0

    print(f"stage-1 CFDT ({args.config or 'scaled-down MODEL'}), T={args.dates}, {args.size}x{args.size}, "
          f"batch 1, device {describe_device(args.device)}; one fresh process per variant", flush=True)
    results: dict[str, dict] = {}
    for variant in args.variants.split(","):
        cmd = [sys.executable, __file__, "--child", variant, "--size", str(args.size), "--dates", str(args.dates),
               "--steps", str(args.steps), "--device", args.device]
        cmd += ["--config", args.config] if args.config else []
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"{variant}: failed\n{proc.stderr}", file=sys.stderr)
            return 1
        results[variant] = json.loads(proc.stdout.strip().splitlines()[-1])
        r = results[variant]
        if r["oom"]:
            print(f"{variant:<22} out of memory: {r['error']}", flush=True)
            continue
        print(f"{variant:<22} peak {r['peak_mb']:>9.1f} MB   step {r['step_s']:>7.3f} s   "
              f"(first step {r['first_step_s']:.3f} s)   {r['switches']}", flush=True)
    missing = {"variant": None, "oom": True, "peak_mb": None, "step_s": None}
    off, on = results.get("off", missing), results.get("on", missing)
    measured = not off["oom"] and not on["oom"]
    summary = {
        "peak_off_mb": off["peak_mb"],
        "peak_on_mb": on["peak_mb"],
        "reduction": round(1 - on["peak_mb"] / off["peak_mb"], 3) if measured else None,
        "step_time_ratio": round(on["step_s"] / off["step_s"], 3) if measured else None,
        "device": describe_device(args.device),
        "config": args.config,
        "size": args.size,
        "dates": args.dates,
        "params": on.get("params") or off.get("params"),
        "variants": {k: {"peak_mb": v["peak_mb"], "step_s": v["step_s"], "oom": v["oom"]}
                     for k, v in results.items()},
    }
    print(json.dumps(summary))
    return 0


def describe_device(name: str) -> str:
    """``cpu``, or the GPU's name and the torch build, so that figures say what measured them."""
    if name == "cpu":
        return "cpu"
    import torch

    return f"{name} ({torch.cuda.get_device_name(0)}, torch {torch.__version__})"


if __name__ == "__main__":
    sys.exit(main())
