"""A Mixture-of-Experts model served through real processes: `failsoft serve --simulate-vram` with the tiny
MoE GGUF as the main model, a budget too small for all of it. The plan is an expert split (whole blocks'
experts and single tensors of one more in RAM); the GPU worker is a real llama-server started with
`--n-cpu-moe` and `--override-tensor`, passes the simulated device's load check (the experts in RAM are not
the device's), answers through the router, and the split is shown where the user reads the plan."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.helpers import client_for, failsoft_of, failsoft_status, gpu_worker_starts
from tests.support.moe_service import tiny_moe_service
from tests.support.service import ServiceHandle

pytestmark = pytest.mark.integration

# The tiny model takes 3.27 MiB; with one 1,024-token slot its dense part, KV cache and compute need about
# 5.2 MiB, so 6 MiB to plan leaves room for the experts of some blocks only. The reserve of 512 KiB covers
# what this CPU build's compute buffer takes beyond the plan's estimate (3.01 MiB printed, 2.89 planned).
VRAM = "6656KiB"
RESERVE = "512KiB"


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceHandle]:
    with tiny_moe_service(tmp_path_factory.mktemp("moe-service"), vram=VRAM, reserve_min=RESERVE) as handle:
        yield handle


def test_the_gpu_worker_runs_the_expert_split_and_answers(svc: ServiceHandle) -> None:
    status = svc.status()
    plan = status["plan"]
    assert plan["verdict"] == "split" and plan["n_gpu_layers"] == plan["n_layers"], plan["reason"]
    assert plan["n_cpu_moe"] > 0 and plan["cpu_expert_tensors"], plan["reason"]
    assert status["workers"]["gpu"]["state"] == "ready"
    started = gpu_worker_starts(svc)[0]
    block = plan["n_cpu_moe"]
    single = ",".join(rf"blk\.{block}\.{stem}=CPU" for stem in plan["cpu_expert_tensors"])
    assert f"--n-cpu-moe {block} --override-tensor {single}" in started, started
    answer = client_for(svc).chat.completions.create(
        model="tiny-moe", messages=[{"role": "user", "content": "hello"}], max_tokens=4
    )
    assert failsoft_of(answer)["worker"] == "gpu"
    assert answer.usage is not None and answer.usage.completion_tokens >= 1


def test_failsoft_status_and_plan_show_the_split(svc: ServiceHandle) -> None:
    plan = svc.status()["plan"]
    shown = failsoft_status(svc)
    assert shown.returncode == 0, shown.stderr
    single = len(plan["cpu_expert_tensors"])
    tensors = f" + {single} tensor{'s' if single > 1 else ''}"
    assert f"experts of {plan['n_cpu_moe']}/8 layers{tensors} in RAM" in shown.stdout, shown.stdout
