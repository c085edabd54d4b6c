"""Scenarios h and i: the model library's ladder under GPU pressure, against the real service.

h pushes a library model off the GPU with simulated pressure and expects its stand-in there; i asks the same
with `X-Failsoft-Stand-In: no` and expects the model's own CPU worker.
"""

from __future__ import annotations

import time

from tray_app.contract.sizes import format_size
from tray_app.drill.bodies import ask
from tray_app.drill.context import DrillContext, finish
from tray_app.drill.expected import EXPECTED, TITLES
from tray_app.drill.ladder_checks import record_problems
from tray_app.drill.ladder_plan import (
    LadderModels,
    find_models,
    ladder_why,
    model_named,
    on_device,
    pressure_bytes,
    share_free,
    share_target,
)
from tray_app.drill.records import ScenarioRecord

LABEL = "drill-ladder"
REFUSE_STAND_IN = {"X-Failsoft-Stand-In": "no"}


async def stand_in_under_pressure(ctx: DrillContext) -> ScenarioRecord:
    record = ScenarioRecord("h", TITLES["h"], False)
    return await _under_pressure(ctx, record, refuse_stand_in=False)


async def cpu_under_pressure(ctx: DrillContext) -> ScenarioRecord:
    record = ScenarioRecord("i", TITLES["i"], False)
    return await _under_pressure(ctx, record, refuse_stand_in=True)


async def _under_pressure(
    ctx: DrillContext, record: ScenarioRecord, *, refuse_stand_in: bool
) -> ScenarioRecord:
    setup = _ladder_setup(ctx, record)
    if setup is None:
        return record
    models, size = setup
    if refuse_stand_in and "cpu" not in models.big["devices"]:
        record.skipped = f"{models.big['name']} may not use the CPU: no rung below its stand-in"
        return record
    if not refuse_stand_in and not ctx.stand_in_enabled:
        record.skipped = "library.stand_in is off in this service's config: no stand-in may answer"
        return record
    await ctx.client.wait_ready()
    if not size:
        record.notes.append(f"{models.big['name']} has no GPU plan on this device even without pressure")
    try:
        if size:
            await _take_the_gpu_away(ctx, record, models, size)
        await _ladder_request(ctx, record, models, refuse_stand_in=refuse_stand_in)
    finally:
        if size:
            await _give_back(ctx, record)
    if refuse_stand_in:
        header = ", ".join(f"{name}: {value}" for name, value in REFUSE_STAND_IN.items())
        record.notes.append(f"the request refused a stand-in ({header})")
    return record


def _ladder_setup(ctx: DrillContext, record: ScenarioRecord) -> tuple[LadderModels, int] | None:
    """The models and the pressure for h and i; None (the record says why it is skipped) when they cannot
    run against this service."""
    models = find_models(ctx.status)
    if isinstance(models, str):
        record.skipped = models
        return None
    size = pressure_bytes(ctx.status, models)
    if isinstance(size, str):
        record.skipped = size
        return None
    if size and not (ctx.status.get("device") or {}).get("simulated"):
        record.skipped = (
            f"{models.big['name']} fits on this GPU; pushing it off needs simulated VRAM pressure "
            "(POST /failsoft/debug/pressure), which a real GPU does not take: run with --simulate-vram SIZE"
        )
        return None
    return models, size


async def _take_the_gpu_away(
    ctx: DrillContext, record: ScenarioRecord, models: LadderModels, size: int
) -> None:
    """Take `size` of simulated VRAM (labelled LABEL) and check the big model lost its GPU plan while the
    main model kept its own. The service re-plans on each take (its figures may have moved since the status
    the size came from: measured buffers replace estimates), so the take is corrected until the share left
    is below the big model's weights."""
    before = share_free(ctx.status)
    weights = int((models.big["plan"] or {}).get("weights_bytes") or 0)
    target = share_target(models)
    for _ in range(3):
        await ctx.client.pressure({"take": str(size), "label": LABEL})  # replaces what LABEL held
        await ctx.refresh()
        left = share_free(ctx.status)
        if left < weights or isinstance(target, str):
            break
        size += left - target
    big = model_named(ctx.status, models.big["name"])
    record.notes.append(
        f"took {format_size(size)} of simulated VRAM: the library's share went from {format_size(before)} to "
        f"{format_size(share_free(ctx.status))}, below {big['name']}'s weights ({format_size(weights)})"
    )
    if share_free(ctx.status) >= weights:
        record.failed_checks.append(
            f"the library's share ({format_size(share_free(ctx.status))}) is not below {big['name']}'s "
            f"weights ({format_size(weights)}) under the pressure"
        )
    if "gpu" in big["workers"]:
        record.failed_checks.append(f"{big['name']} still has a GPU worker after the pressure")
    if not ctx.status["plan"].get("fits"):
        record.failed_checks.append("the main model's plan no longer fits under the pressure")


async def _give_back(ctx: DrillContext, record: ScenarioRecord) -> None:
    released = await ctx.client.pressure({"release": LABEL})
    await ctx.refresh()
    record.notes.append(f"released {format_size(int(released.get('released') or 0))} of simulated VRAM")


async def _ladder_request(
    ctx: DrillContext, record: ScenarioRecord, models: LadderModels, *, refuse_stand_in: bool
) -> None:
    """The request for the big model: h expects its stand-in on the GPU, i (stand-in refused) its CPU."""
    big = model_named(ctx.status, models.big["name"])
    if refuse_stand_in:
        expectation, record.expected_answerer = EXPECTED["i"], on_device(big["name"], "cpu")
    else:
        stand_in = models.stand_in["name"]
        expectation, record.expected_answerer = EXPECTED["h"], on_device(stand_in, "gpu", big["name"])
    start = time.time()
    headers = REFUSE_STAND_IN if refuse_stand_in else None
    answer = await ctx.client.chat(ask(big["name"]), headers=headers)
    trace = await finish(ctx, record, answer, expectation, start)
    if trace is not None:
        route, reason = trace.decision()
        record.decision_why = ladder_why(route, reason, big["name"])
        record.failed_checks += record_problems(answer.failsoft, trace.record)
