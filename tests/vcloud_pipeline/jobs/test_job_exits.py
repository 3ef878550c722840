"""The pipeline's exit codes: one number per meaning on both sides (job scripts and trainer), each
explained in a plain sentence."""

from __future__ import annotations

from slurm_provider.exit_codes import explain_exit
from vcloud import exitcodes
from vcloud_pipeline.jobs import exits as job_exits, render


def test_the_trainer_and_the_job_scripts_use_the_same_numbers() -> None:
    assert job_exits.EXIT_REQUEUE == exitcodes.REQUEUE
    assert job_exits.EXIT_ERROR == exitcodes.ERROR
    assert job_exits.EXIT_BAD_CONFIG == exitcodes.BAD_CONFIG
    assert render.EXIT_REQUEUE is job_exits.EXIT_REQUEUE and render.EXIT_CODE_MISMATCH is job_exits.EXIT_CODE_MISMATCH
    codes = [v for k, v in vars(exitcodes).items() if k.isupper() and isinstance(v, int) and v != 0]
    assert set(codes) <= set(job_exits.MEANINGS), "every non-zero trainer exit code has a sentence"


def test_every_code_the_scripts_and_trainer_define_gets_a_sentence() -> None:
    for code, meaning in job_exits.MEANINGS.items():
        sentence = explain_exit(code, 0, job_exits.MEANINGS)
        assert sentence == f"Exit code {code}: {meaning}"
    assert "latest.pt" in explain_exit(85, 0, job_exits.MEANINGS)
    assert "sync_code" in explain_exit(86, 0, job_exits.MEANINGS)
