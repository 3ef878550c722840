"""Train one stage: ``python -m vcloud.train --stage N --config CFG --data PREPARED --out RUN_DIR``.

Resumes automatically from ``RUN_DIR/stage{N}/latest.pt``; ``--restart`` moves the old outputs
aside and starts over. ``--set section.key=value`` (repeatable) overrides the YAML for this run (the
checkpoint records the resolved configuration); ``--print-config`` prints that configuration as YAML
and exits without training. Under ``torchrun --nproc_per_node=K`` it trains with DDP. Exit codes are in
:mod:`vcloud.exitcodes`: 0 complete, 85 stopped on a signal after checkpointing, 87 GPUs required
(``VCLOUD_GPUS_REQUIRED``) but not visible to PyTorch, 88 ``latest.pt`` written by other code that
cannot be resumed as asked (``train.on_code_change``), 1 error, 2 bad arguments or configuration.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import NoReturn

from vcloud import exitcodes
from vcloud.config import STAGES, ConfigError, VCloudConfig, config_yaml, load_config
from vcloud.contract import DATA_INDEX
from vcloud.exit_record import write_exit_record
from vcloud.training.signals import STOP_SIGNALS, RequeuePolicy, StopRequest, install_stop_handlers

# Everything that imports torch is imported inside the functions below: importing it takes seconds
# (tens of seconds on a loaded node), and a stop signal must find its handler installed by then.

log = logging.getLogger("vcloud.train")


class _LogFormat(logging.Formatter):
    """``2026-02-16 12:00:01 stage 0 | epoch 3/50 | ...``; level shown only when it is not INFO."""

    def __init__(self, rank: int, world_size: int) -> None:
        super().__init__(datefmt="%Y-%m-%d %H:%M:%S")
        self.prefix = f"[rank {rank}] " if world_size > 1 else ""

    def format(self, record: logging.LogRecord) -> str:
        level = "" if record.levelno == logging.INFO else f"{record.levelname}: "
        text = f"{self.formatTime(record, self.datefmt)} {self.prefix}{level}{record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def configure_logging(rank: int = 0, world_size: int = 1) -> None:
    """One line per event on stdout; ranks other than 0 only report warnings and errors.

    Leaves logging alone when something else configured it already (pytest, an embedding tool)."""
    root = logging.getLogger()
    ours = [h for h in root.handlers if isinstance(h.formatter, _LogFormat)]
    if root.handlers and not ours:
        return
    for handler in ours:
        root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(_LogFormat(rank, world_size))
    root.addHandler(handler)
    root.setLevel(logging.INFO if rank == 0 else logging.WARNING)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m vcloud.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--stage", type=int, choices=STAGES, help="stage to train")
    parser.add_argument("--config", type=Path, required=True, help="trainer/configs/model_{tiny,small,full}.yaml")
    parser.add_argument("--data", type=Path, help="prepared dataset root (vcloud.data.prepare)")
    parser.add_argument("--out", type=Path, help="run output directory (stage{N}/ inside)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one config value, parsed as YAML (repeatable), e.g. "
                             "--set train.log_every_steps=10 --set train.stage1.lr=5e-5")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved config (the file with every --set applied) as YAML and exit")
    parser.add_argument("--restart", action="store_true",
                        help="move this stage's outputs aside (best.pt included) and start over")
    parser.add_argument("--max-epochs", type=int, default=None,
                        help="override train.stage{N}.epochs (total epochs of the stage)")
    parser.add_argument("--requeue", action=argparse.BooleanOptionalAction, default=None,
                        help="after USR2, ask Slurm to requeue the job (default: env SLURM_REQUEUE=1)")
    return parser


def _validate(args: argparse.Namespace) -> VCloudConfig:
    """Everything checkable before touching a GPU; raises ConfigError/StageError/ValueError."""
    from vcloud.stage_registry import get_stage

    config = load_config(args.config, args.overrides)
    spec = get_stage(args.stage)
    spec.parse_model_config(config.model.section(args.stage))
    if args.max_epochs is not None and args.max_epochs < 1:
        raise ConfigError(f"--max-epochs={args.max_epochs} is invalid (allowed: an integer >= 1)")
    index = args.data / DATA_INDEX
    if not args.data.is_dir() or not index.exists():
        raise ConfigError(f"--data {args.data} is not a prepared dataset (no {index}); "
                          "run python -m vcloud.data.prepare --raw RAW --out DIR first")
    return config


def _print_config(args: argparse.Namespace) -> int:
    """``--print-config``: the configuration a run would train with, on stdout as YAML."""
    try:
        config = load_config(args.config, args.overrides)
    except ConfigError as exc:
        log.error("%s", exc)
        return exitcodes.BAD_CONFIG
    sys.stdout.write(config_yaml(config))
    sys.stdout.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Train in this process (tests, embedding tools); the previous signal handlers are put back."""
    stop = install_stop_handlers()  # first: a signal during start-up must not kill the process
    try:
        return _main(argv, stop)
    finally:
        stop.restore_handlers()


def _main(argv: list[str] | None, stop: StopRequest) -> int:
    configure_logging()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.print_config:
        return _print_config(args)
    missing = [f"--{name}" for name in ("stage", "data", "out") if getattr(args, name) is None]
    if missing:
        parser.error(f"the following arguments are required to train: {', '.join(missing)}")
    from vcloud.checkpoint import CheckpointError
    from vcloud.stage_registry import StageError

    try:
        config = _validate(args)
    except (ConfigError, StageError, ValueError) as exc:
        log.error("%s", exc)
        return exitcodes.BAD_CONFIG

    from vcloud.training.distributed import GpusMissing, describe_device, init_distributed, shutdown

    try:
        ctx = init_distributed()  # first after the arguments: a job without its GPUs stops in seconds
    except GpusMissing as exc:
        log.error("%s", exc)
        if exc.hint:  # not at ERROR level: the log-signature hints would read "error ... libfabric" in it
            log.info("what to do: %s", exc.hint)
        log.info("exit %d: %s", exitcodes.GPUS_MISSING, exitcodes.describe(exitcodes.GPUS_MISSING))
        return exitcodes.GPUS_MISSING
    from vcloud.training.loop import ResumeRefused, StageRun, TrainingError, train_stage

    configure_logging(ctx.rank, ctx.world_size)
    log.info("%s", describe_device(ctx))
    log.info("config %s (%s), data %s, output %s", args.config, config.name, args.data, args.out)
    run = StageRun(stage=args.stage, config=config, data_root=args.data, run_dir=args.out, restart=args.restart,
                   max_epochs=args.max_epochs, requeue=RequeuePolicy.from_env(flag=args.requeue))
    code = exitcodes.ERROR
    try:
        code = train_stage(run, ctx, stop)
    except ResumeRefused as exc:
        log.error("%s", exc)
        code = exitcodes.RESUME_REFUSED
    except (TrainingError, StageError, CheckpointError) as exc:
        log.error("stage %d failed: %s", args.stage, exc)
        code = exitcodes.ERROR
    except Exception:
        log.exception("stage %d failed with an unexpected error", args.stage)
        code = exitcodes.ERROR
    finally:
        shutdown(ctx, together=code in (exitcodes.STAGE_COMPLETE, exitcodes.REQUEUE))
    log.info("exit %d: %s", code, exitcodes.describe(code))
    return code


def _run_as_process() -> int:
    """The job's entry point: a stop signal after the stage has its exit code is ignored.

    Python puts the default action back for signals with Python handlers while it shuts down (and
    tearing torch down takes a while), so a USR2 arriving then would turn a finished stage's exit
    0, or a checkpointed stop's 85, into death by signal.

    One of several ranks (``WORLD_SIZE`` > 1, set by torchrun) then ends at once, without the
    interpreter's teardown: by then the stage has its exit code, its files are closed and the
    process group is left, but the teardown still destroys the communication backend's C++ objects,
    and gloo's sometimes abort there ("terminate called without an active exception", about one
    run in 40 on the local cluster). torchrun reports a rank killed by SIGABRT as the whole launch
    failing, so a stage that had written COMPLETE would fail its job.

    Under torchrun, which reports any failed rank as its own exit 1, an exit code that says what
    the job did (stopped after a checkpoint, GPUs missing, resume refused) is first recorded where
    the launch reads it (:mod:`vcloud.exit_record`, :mod:`vcloud.launch`)."""
    code = _main(None, install_stop_handlers())
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    write_exit_record(code, os.environ)
    if one_of_several_ranks(os.environ):
        end_process_now(code)
    return code


def one_of_several_ranks(env: Mapping[str, str]) -> bool:
    """Whether this process is one rank of a torchrun launch of more than one process."""
    try:
        return int(env.get("WORLD_SIZE") or 1) > 1
    except ValueError:
        return False


def end_process_now(code: int) -> NoReturn:
    """Flush what was logged and printed, then exit with ``code`` without the interpreter's teardown
    (no atexit handlers, no finalizers, no C++ static destructors)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing left to save
            pass
    os._exit(code)


if __name__ == "__main__":
    sys.exit(_run_as_process())
