"""Reconstruction quality of stages 0-3 against the no-training baselines, on one held-out split.

Generates the ``small`` synthetic dataset (split by location, so test locations are never seen in
training), trains every stage with the ``small`` model config for a bounded CPU time each through
the stage registry (the same build / loss / predict code the trainer runs; stage 3 trains on its
``train_dataset``: labeled plus pseudo-labelled series), keeps each stage's last weights as its
``best.pt`` for the next stage, and scores baselines and stages 1-3 on the same test series.

    .venv/bin/python benchmarks/quality.py --minutes-per-stage 5 [--work DIR] [--test-limit 64]

Last line: JSON with best_baseline_psnr, stage1_psnr, stage2_psnr, stage3_psnr (and SSIM/SAM).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "trainer" / "src"))

import torch  # noqa: E402
from torch.utils.data import DataLoader, Subset, default_collate  # noqa: E402

from vcloud.baselines import score_baselines  # noqa: E402
from vcloud.checkpoint import save_checkpoint  # noqa: E402
from vcloud.config import load_config  # noqa: E402
from vcloud.data.dataset import SeriesDataset  # noqa: E402
from vcloud.data.prepare import prepare_dataset  # noqa: E402
from vcloud.data.synthetic import generate_raw  # noqa: E402
from vcloud.metrics import MetricTotals  # noqa: E402
from vcloud.stages import BuildContext, get_stage  # noqa: E402


def train_bounded(stage: int, ctx: BuildContext, data: Path, seconds: float, batch_size: int, lr: float) -> dict:
    spec = get_stage(stage)
    model = spec.build_model(spec.parse_model_config(ctx.config.model.section(stage)), ctx).train()
    train: torch.utils.data.Dataset = SeriesDataset(data, "train")
    hook = getattr(spec, "train_dataset", None)
    if hook is not None:
        train = hook(train, ctx)
    loader = DataLoader(train, batch_size=batch_size, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(stage))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    start, steps, epochs, last = time.monotonic(), 0, 0, float("nan")
    while time.monotonic() - start < seconds:
        for batch in loader:
            loss = spec.loss(model, batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            steps, last = steps + 1, loss.item()
            if time.monotonic() - start >= seconds:
                break
        epochs += 1
    save_checkpoint(ctx.run_dir / f"stage{stage}" / "best.pt",
                    {"stage": stage, "model": model.state_dict(), "model_config": ctx.config.model.section(stage)})
    return {"steps": steps, "epochs": epochs, "last_loss": round(last, 5), "train_series": len(train)}


@torch.no_grad()
def score(stage: int, ctx: BuildContext, test: torch.utils.data.Dataset) -> dict[str, float]:
    spec = get_stage(stage)
    from vcloud.stages import load_stage_model

    model, _ = load_stage_model(stage, ctx.run_dir / f"stage{stage}" / "best.pt", ctx)
    model.eval()
    totals = MetricTotals()
    for start in range(0, len(test), 4):
        batch = default_collate([test[i] for i in range(start, min(start + 4, len(test)))])
        totals.update(spec.predict(model, batch), batch["target"])
    return totals.means()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes-per-stage", type=float, default=5.0)
    parser.add_argument("--work", type=Path, default=None, help="working directory (default: a temp dir)")
    parser.add_argument("--test-limit", type=int, default=64, help="test series scored")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    work = args.work or Path(tempfile.mkdtemp(prefix="vcloud_quality_"))
    cfg = load_config(ROOT / "trainer" / "configs" / "model_small.yaml")
    raw = work / "raw"
    data = work / "prepared"
    if not (data / "index.json").exists():
        generate_raw(raw, preset="small", seed=0)
        prepare_dataset(raw, data)
    test_full = SeriesDataset(data, "test")
    test = Subset(test_full, range(min(args.test_limit, len(test_full))))
    print(f"data {data}: train {len(SeriesDataset(data, 'train'))}, test {len(test_full)} series "
          f"(scoring {len(test)}); {args.minutes_per_stage} CPU minutes per stage", flush=True)

    baselines = score_baselines(test_full, limit=len(test))
    for name, s in baselines.items():
        print(f"baseline {name:<15} PSNR {s['psnr']:6.2f} dB  SSIM {s['ssim']:.4f}  SAM {s['sam']:5.2f} deg")
    best_baseline = max(s["psnr"] for s in baselines.values())

    ctx = BuildContext(config=cfg, run_dir=work / "run", device=torch.device("cpu"))
    results: dict[str, float] = {"best_baseline_psnr": round(best_baseline, 3)}
    for stage in (0, 1, 2, 3):
        stage_cfg = cfg.train.for_stage(stage)
        info = train_bounded(stage, ctx, data, args.minutes_per_stage * 60, stage_cfg.batch_size, stage_cfg.lr)
        line = f"stage {stage}: {info['steps']} steps ({info['epochs']} epochs over {info['train_series']} series), " \
               f"last loss {info['last_loss']}"
        if stage == 3:
            summary = json.loads((ctx.run_dir / "stage3" / "pseudo_labels.json").read_text())
            line += f"; pseudo-labels kept {summary['pseudo_labels_kept']} of {summary['pseudo_labels_considered']}"
            results["stage3_pseudo_labels_kept"] = summary["pseudo_labels_kept"]
        if stage >= 1:
            s = score(stage, ctx, test)
            line += f"; test PSNR {s['psnr']:.2f} dB, SSIM {s['ssim']:.4f}, SAM {s['sam']:.2f} deg"
            results.update({f"stage{stage}_psnr": round(s["psnr"], 3), f"stage{stage}_ssim": round(s["ssim"], 4),
                            f"stage{stage}_sam": round(s["sam"], 3)})
        print(line, flush=True)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
