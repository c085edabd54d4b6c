"""The GPU check's MoE phase: the tiny Mixture-of-Experts model (tests/support/tiny_moe.py) planned for
budgets on the real card and started with Failsoft's command line on `CUDA0`; what llama.cpp printed per
device must equal the plan (weights and KV cache exactly, compute within 5 %, the experts kept in RAM as
planned), and for the expert-split budget llama.cpp's own `--fit on` placement is weighed against
Failsoft's by the planner's tokens/s estimate.

The same comparisons as `make moe-check` on Mesa's software Vulkan device (packaging/moe_check.py,
packaging/moe_compare.py); here each load takes seconds, so the phase fits in about a minute. The verdict
(`judge_moe`) is pure and tested without a GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import moe_check
from check_report import Report, say

DEVICE = "CUDA0"
# MiB: an expert split (on Vulkan0: experts of 3 of 8 blocks and one tensor of a fourth in RAM, `-ot`),
# weighed against --fit; and the whole model.
BUDGETS = (48, 96)
FIT_BUDGET = 48
LOAD_TIMEOUT = 20.0  # seconds per llama-server load of a 51 MiB model on a real card


def judge_moe(results: list[dict[str, Any]]) -> list[str]:
    """Every budget's problems, named by budget; none checked is a problem too."""
    if not results:
        return ["moe: no budget was checked"]
    return [
        f"moe {result['budget_mib']} MiB: {problem}" for result in results for problem in result["problems"]
    ]


def phase_moe(report: Report, state: Path) -> None:
    with report.phase("moe") as entry:
        from tray_app.engine import binary

        server = binary.find("").path
        work = state / "moe"
        model = moe_check.write_model(work)
        tensors = moe_check.tensor_table(model)
        free = moe_check.device_free_bytes(server, DEVICE, {})
        results = [
            moe_check.check_budget(
                server,
                model,
                tensors,
                budget,
                DEVICE,
                {},
                work / "logs",
                free if budget == FIT_BUDGET else None,
                LOAD_TIMEOUT,
            )
            for budget in BUDGETS
        ]
        entry["device_free_mib"] = round(free / moe_check.MIB)
        entry["budgets"] = results
        entry["table"] = moe_check.table(results, DEVICE).splitlines()
        entry["problems"] = judge_moe(results)
        for problem in entry["problems"]:
            report.problem(problem)
        for line in entry["table"]:
            say(f"moe: {line}")
