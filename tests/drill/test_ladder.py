"""Scenarios h to j without a service: which models they use, how much simulated VRAM h and i take, what
they expect of a request down the ladder, what an eviction must look like, when a scenario is skipped, the
library models the drill's own service gets, and how the report names who answered."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

from tray_app.config import from_dict
from tray_app.contract.status import ModelStatus, ServiceStatus
from tray_app.drill import ladder_checks, ladder_plan
from tray_app.drill.client import Answer, Event, EventLog, ServiceClient
from tray_app.drill.context import DrillContext
from tray_app.drill.expected import EXPECTED, TITLES
from tray_app.drill.launcher import DRILL_MAX_LOADED, DRILL_MODEL_CTX, drill_config
from tray_app.drill.records import Expectation, JobTrace, ScenarioRecord, answerer, verdict
from tray_app.drill.registry import SCENARIOS
from tray_app.drill.report import DrillReport, markdown, text
from tray_app.host.launch import free_port

MiB = 1 << 20
MAIN = "SmolLM2-135M-Instruct.Q4_1.gguf"


def plan(weights: int, kv: int = 10 * MiB, compute: int = 20 * MiB, per_seq: int = 1024) -> dict[str, Any]:
    return {"weights_bytes": weights, "kv_bytes": kv, "compute_bytes": compute, "n_ctx_per_seq": per_seq}


def model(
    name: str,
    *,
    main: bool = False,
    stand_in: str | None = None,
    gpu_plan: dict[str, Any] | None = None,
    where: str = "not loaded",
    vram: int = 0,
    in_flight: int = 0,
    aliases: tuple[str, ...] = (),
    devices: tuple[str, ...] = ("gpu", "cpu"),
) -> ModelStatus:
    workers = {"gpu": "gpu", "cpu": "cpu"} if main else {}
    if not main:
        if gpu_plan is not None:
            workers["gpu"] = f"gpu@{name}"
        if "cpu" in devices:
            workers["cpu"] = f"cpu@{name}"
    return {
        "name": name,
        "aliases": list(aliases),
        "path": f"/models/{name}",
        "main": main,
        "devices": list(devices),
        "stand_in": stand_in,
        "where": where,
        "workers": workers,
        "vram_bytes": vram,
        "plan": gpu_plan,
        "keep_alive": -1.0,
        "idle_seconds": None,
        "unload_in": None,
        "in_flight": in_flight,
    }


def status(
    *models: ModelStatus,
    free: int = 1000 * MiB,
    embeddings_free: int | None = None,
    simulated: bool = True,
    gpu_state: str = "ready",
) -> ServiceStatus:
    return cast(
        ServiceStatus,
        {
            "models": list(models),
            "plan": {"free_bytes": free, "fits": True},
            "embeddings_plan": None if embeddings_free is None else {"free_bytes": embeddings_free},
            "device": {"simulated": simulated},
            "caps": {"n_ctx_per_seq": 512, "cpu_n_ctx": 2048},
            "workers": {"gpu": {"state": gpu_state, "pid": 10}, "cpu": {"state": "ready", "pid": 11}},
            "library_workers": {
                f"cpu@{m['name']}": {
                    "state": "stopped",
                    "pid": None,
                    "profile": {"n_ctx": 2048, "n_parallel": 2},
                }
                for m in models
                if not m["main"]
            },
            "policy": {
                "fallback": "auto",
                "stream_after_content": "resume",
                "auto_approve_seconds": 0.0,
                "cpu_tokens_per_second": 50.0,
            },
        },
    )


def library(**changes: Any) -> ServiceStatus:
    """The drill's own service: the main model, drill-big (its stand-in the main model), drill-other."""
    big = model("drill-big", stand_in=MAIN, gpu_plan=plan(100 * MiB))
    other = model("drill-other", gpu_plan=plan(100 * MiB))
    return status(model(MAIN, main=True), big, other, **changes)


def with_context(
    current: ServiceStatus, run: Callable[[DrillContext], Awaitable[Any]], **options: Any
) -> Any:
    """Run `run(ctx)` with a context on `current`, against a port where nothing listens."""

    async def go() -> Any:
        client = ServiceClient(f"http://127.0.0.1:{free_port()}")
        try:
            return await run(DrillContext(client, EventLog(client), current, **options))
        finally:
            await client.aclose()

    return asyncio.run(go())


def found(current: ServiceStatus) -> ladder_plan.LadderModels:
    models = ladder_plan.find_models(current)
    assert isinstance(models, ladder_plan.LadderModels), models
    return models


# ------------------------------------------------------------------------------------ which models
def test_the_big_model_its_stand_in_and_another_are_found() -> None:
    models = found(library())
    assert (models.big["name"], models.stand_in["name"]) == ("drill-big", MAIN)
    assert models.other is not None and models.other["name"] == "drill-other"


def test_a_stand_in_named_by_alias_is_found_and_never_taken_as_the_other_model() -> None:
    small = model("small", aliases=("tiny",), gpu_plan=plan(20 * MiB))
    big = model("big", stand_in="tiny", gpu_plan=plan(100 * MiB))
    models = found(status(model(MAIN, main=True), small, big))
    assert models.stand_in["name"] == "small" and models.other is None


def test_a_big_model_with_a_gpu_plan_comes_first() -> None:
    no_room = model("huge", stand_in=MAIN)
    fits = model("big", stand_in=MAIN, gpu_plan=plan(100 * MiB))
    assert found(status(model(MAIN, main=True), no_room, fits)).big["name"] == "big"


def test_no_model_with_a_stand_in_is_a_reason() -> None:
    reason = ladder_plan.find_models(status(model(MAIN, main=True), model("other", gpu_plan=plan(MiB))))
    assert isinstance(reason, str) and "no library model with a stand-in" in reason
    cpu_only = model("big", stand_in=MAIN, devices=("cpu",))
    assert isinstance(ladder_plan.find_models(status(model(MAIN, main=True), cpu_only)), str)


# ------------------------------------------------------------------------------------ pressure
def test_pressure_leaves_half_the_big_weights_when_the_main_model_stands_in() -> None:
    current = library(free=1000 * MiB)
    assert ladder_plan.share_target(found(current)) == 50 * MiB
    assert ladder_plan.pressure_bytes(current, found(current)) == 950 * MiB


def test_pressure_counts_the_share_the_embeddings_plan_leaves() -> None:
    current = library(free=1000 * MiB, embeddings_free=800 * MiB)
    assert ladder_plan.share_free(current) == 800 * MiB
    assert ladder_plan.pressure_bytes(current, found(current)) == 750 * MiB


def test_pressure_leaves_room_for_a_library_stand_in() -> None:
    small = model("small", gpu_plan=plan(40 * MiB, kv=5 * MiB, compute=5 * MiB))  # needs 50 MiB
    big = model("big", stand_in="small", gpu_plan=plan(150 * MiB))
    current = status(model(MAIN, main=True), small, big, free=1000 * MiB)
    # Between the 50 MiB "small" needs and big's 150 MiB of weights.
    assert ladder_plan.share_target(found(current)) == 100 * MiB
    assert ladder_plan.pressure_bytes(current, found(current)) == 900 * MiB


def test_no_pressure_separates_a_stand_in_as_big_as_the_weights() -> None:
    small = model("small", gpu_plan=plan(100 * MiB))
    big = model("big", stand_in="small", gpu_plan=plan(100 * MiB))
    reason = ladder_plan.pressure_bytes(status(model(MAIN, main=True), small, big), found(status(small, big)))
    assert isinstance(reason, str) and "no pressure leaves room" in reason


def test_a_big_model_off_the_gpu_already_needs_no_pressure() -> None:
    big = model("big", stand_in=MAIN)
    current = status(model(MAIN, main=True), big)
    assert ladder_plan.pressure_bytes(current, found(current)) == 0


# ------------------------------------------------------------------------------------ contexts
def test_contexts_per_request() -> None:
    current = library()
    big = ladder_plan.model_named(current, "drill-big")
    assert ladder_plan.cpu_context(current, big) == 1024  # its CPU profile: 2048 over 2 slots
    assert ladder_plan.model_context(current, big) == 1024  # its GPU plan's
    main = ladder_plan.model_named(current, MAIN)
    assert (ladder_plan.cpu_context(current, main), ladder_plan.model_context(current, main)) == (2048, 512)
    off = model("off", stand_in=MAIN)
    assert ladder_plan.model_context(status(off), off) == 1024  # no GPU plan: the CPU's


# ------------------------------------------------------------------------------------ expectations
def test_the_ladder_expects_what_the_docs_tables_say() -> None:
    assert EXPECTED["h"].describe() == "gpu (stand_in) -> completed"
    assert EXPECTED["i"].describe() == "cpu (gpu_unavailable) -> completed"
    for key in "ab":
        assert EXPECTED[key].describe() == "cpu (exceeds_gpu_profile) -> completed"
    assert EXPECTED["c"].describe() == "cpu (crash_abort|exited|killed) -> cancelled"
    assert EXPECTED["g"].describe() == "cpu (hung) -> completed"
    assert EXPECTED["c"].attempts == ("gpu failed", "cpu cancelled")
    assert EXPECTED["f"].attempts == ("gpu failed", "cpu completed")


def test_while_the_other_model_is_busy_the_main_stand_in_answers() -> None:
    expectation, by = cast(tuple[Expectation, str], ladder_plan.while_busy(found(library()), True, 1))
    assert expectation == Expectation("gpu", ("stand_in",), "completed")
    assert by == f"{MAIN} on GPU, stand-in for drill-big"


def test_while_the_other_model_is_busy_without_a_stand_in_the_big_model_uses_its_cpu() -> None:
    off = ladder_plan.while_busy(found(library()), False, 1)
    assert off == (Expectation("cpu", ("gpu_unavailable",), "completed"), "drill-big on CPU")
    small = model("small", gpu_plan=plan(40 * MiB))
    big = model("big", stand_in="small", gpu_plan=plan(100 * MiB))
    other = model("other", gpu_plan=plan(100 * MiB))
    models = found(status(model(MAIN, main=True), small, big, other))
    assert ladder_plan.while_busy(models, True, 1) == (EXPECTED["i"], "big on CPU")  # no place for "small"
    open_case = ladder_plan.while_busy(models, True, None)
    assert isinstance(open_case, str) and "depends on their sizes" in open_case
    gpu_only = model("big", stand_in=MAIN, gpu_plan=plan(100 * MiB), devices=("gpu",))
    no_rung = ladder_plan.while_busy(found(status(model(MAIN, main=True), gpu_only, other)), False, 1)
    assert isinstance(no_rung, str) and "may not use the CPU" in no_rung


def test_the_drill_asks_no_policy_what_to_expect() -> None:
    root = Path(__file__).resolve().parents[2] / "tray_app" / "drill"
    for module in root.glob("*.py"):
        text = module.read_text(encoding="utf-8")
        assert "jobs import policy" not in text and "jobs.policy" not in text, module.name
        assert "make_room" not in text, module.name


# ------------------------------------------------------------------------------------ skips
def test_eviction_is_forced_by_max_loaded_one_or_by_bytes() -> None:
    assert ladder_plan.eviction_skip(library(), found(library()), 1) == ""
    tight = library(free=200 * MiB)  # 130 MiB each: both do not fit
    assert ladder_plan.eviction_skip(tight, found(tight), None) == ""
    reason = ladder_plan.eviction_skip(library(), found(library()), None)
    assert "fit on the GPU together" in reason and "max_loaded is unknown" in reason
    assert "max_loaded is 3" in ladder_plan.eviction_skip(library(), found(library()), 3)


def test_eviction_needs_a_second_library_model_and_a_gpu_plan() -> None:
    lonely = status(model(MAIN, main=True), model("big", stand_in=MAIN, gpu_plan=plan(MiB)))
    assert "no second library model" in ladder_plan.eviction_skip(lonely, found(lonely), 1)
    off = status(model(MAIN, main=True), model("big", stand_in=MAIN), model("o", gpu_plan=plan(MiB)))
    assert "has no GPU plan" in ladder_plan.eviction_skip(off, found(off), 1)
    assert "no library model" in ladder_plan.eviction_skip(status(), ladder_plan.find_models(status()), 1)


def play(key: str, current: ServiceStatus, **options: Any) -> ScenarioRecord:
    record: ScenarioRecord = with_context(current, SCENARIOS[key], **options)
    return record


def test_scenarios_skip_without_what_they_need_and_touch_no_service() -> None:
    bare = status(model(MAIN, main=True))
    for key in "hij":
        record = play(key, bare, max_loaded=1)
        assert "no library model with a stand-in" in record.skipped and verdict(record) == []
    real_gpu = play("h", library(simulated=False))
    assert "simulated VRAM pressure" in real_gpu.skipped and "--simulate-vram" in real_gpu.skipped
    assert "max_loaded is unknown" in play("j", library()).skipped
    cpu_only_rung = status(model(MAIN, main=True), model("big", stand_in=MAIN, devices=("gpu",)))
    assert "may not use the CPU" in play("i", cpu_only_rung).skipped
    assert "library.stand_in is off" in play("h", library(), stand_in_enabled=False).skipped


def test_scenarios_skip_where_this_service_leaves_the_outcome_open() -> None:
    small = model("small", gpu_plan=plan(40 * MiB))
    big = model("big", stand_in="small", gpu_plan=plan(100 * MiB))
    other = model("other", gpu_plan=plan(100 * MiB))
    tight = status(model(MAIN, main=True), small, big, other, free=200 * MiB)  # the bytes force an eviction
    assert "depends on their sizes" in play("j", tight, max_loaded=None).skipped
    erroring = library()
    erroring["policy"]["stream_after_content"] = "error"
    assert "stream_after_content is 'error'" in play("g", erroring).skipped


# ------------------------------------------------------------------------------------ eviction facts
def job(state: str, *workers: str) -> JobTrace:
    attempts = [
        {"worker": worker, "outcome": "completed" if state == "completed" else "failed"} for worker in workers
    ]
    event = Event("route_decided", {"job_id": "job-1", "route": "gpu", "reason": ""})
    return JobTrace({"id": "job-1", "state": state, "attempt_log": attempts}, (event,))


def test_an_evicted_model_has_no_worker_process_left() -> None:
    assert ladder_checks.gone_problems("a", 42, {"state": "stopped", "pid": None}, alive=False) == []
    assert ladder_checks.gone_problems("a", 42, None, alive=False) == []
    running = ladder_checks.gone_problems("a", 42, {"state": "ready", "pid": 42}, alive=True)
    assert running == [
        "a's GPU worker is ready (pid 42), not unloaded",
        "a's GPU worker process 42 is still running",
    ]
    assert ladder_checks.gone_problems("a", None, None, alive=False) == [
        "a's GPU worker had no pid after loading"
    ]


def test_a_kept_model_finished_its_stream_in_one_attempt_on_the_same_process() -> None:
    ready = {"state": "ready", "pid": 7}
    assert ladder_checks.kept_problems("b", 7, ready, job("completed", "gpu@b"), "gpu@b") == []
    replayed = ladder_checks.kept_problems("b", 7, ready, job("completed", "gpu@b", "cpu@b"), "gpu@b")
    assert replayed == [
        "b's stream: completed, attempts gpu@b completed, cpu@b completed (expected one, on gpu@b)"
    ]
    restarted = ladder_checks.kept_problems(
        "b", 7, {"state": "ready", "pid": 8}, job("completed", "gpu@b"), "gpu@b"
    )
    assert restarted == ["b's gpu@b worker: pid 7 before, 8 (ready) after"]
    assert ladder_checks.kept_problems("b", 7, ready, None, "gpu@b") == ["b's stream has no job record"]


def test_a_stream_that_ended_before_the_other_answer_did_not_test_anything() -> None:
    stream = Answer(started_at=1.0, ended_at=10.0)
    assert ladder_checks.overlap_problem("the stream", stream, Answer(started_at=2.0, ended_at=5.0)) == []
    early = ladder_checks.overlap_problem("the stream", stream, Answer(started_at=2.0, ended_at=12.0))
    assert len(early) == 1 and early[0].startswith("the stream ended 2.00s before")


def test_the_job_record_names_the_same_models_as_the_answer() -> None:
    answer = {"model": MAIN, "stand_in_for": "drill-big"}
    assert ladder_checks.record_problems(answer, {"id": "job-1", **answer}) == []
    silent = ladder_checks.record_problems(
        answer, {"id": "job-1", "model": "drill-big", "stand_in_for": None}
    )
    assert silent == [
        f"job job-1: model 'drill-big' in its record, '{MAIN}' in the answer",
        "job job-1: stand_in_for None in its record, 'drill-big' in the answer",
    ]
    assert ladder_checks.record_problems(None, {"id": "job-1"}) == []


# ------------------------------------------------------------------------------------ verdict, report
def test_who_answered_in_words() -> None:
    assert answerer({"model": "m", "device": "gpu", "stand_in_for": "big"}) == "m on GPU, stand-in for big"
    assert answerer({"model": "big", "worker": "cpu@big", "stand_in_for": None}) == "big on CPU"
    assert answerer(None) == ""


def ladder_record() -> ScenarioRecord:
    record = ScenarioRecord("h", TITLES["h"], False, expected="gpu (stand_in) -> completed")
    record.actual, record.decision_ok = "gpu (stand_in) -> completed", True
    record.answered_by = record.expected_answerer = f"{MAIN} on GPU, stand-in for drill-big"
    record.set_output("The sea is a vast and mysterious realm.")
    return record


def test_the_wrong_answerer_and_a_failed_check_are_problems() -> None:
    record = ladder_record()
    assert verdict(record) == []
    record.answered_by = "drill-big on CPU"
    record.failed_checks.append("drill-big still has a GPU worker after the pressure")
    assert verdict(record) == [
        f"answered by drill-big on CPU, expected {MAIN} on GPU, stand-in for drill-big",
        "drill-big still has a GPU worker after the pressure",
    ]


def test_the_report_names_who_answered() -> None:
    report = DrillReport(1_800_000_000.0, {"url": "http://127.0.0.1:1", "launched": True, "caps": {}})
    report.scenarios = [ladder_record()]
    report.judge()
    table = text(report)
    assert "answered by" in table.splitlines()[2]
    assert f"{MAIN} on GPU, stand-in for drill-big" in table
    assert f"   answered by {MAIN} on GPU, stand-in for drill-big (expected " in table
    assert f"| {MAIN} on GPU, stand-in for drill-big |" in markdown(report)


def test_every_scenario_has_a_title() -> None:
    assert list(SCENARIOS) == list(TITLES) == list("abcdefghijklmno")


# ------------------------------------------------------------------------------------ drill config
def config(model_path: Path, models: list[dict[str, Any]] | None = None) -> Any:
    return from_dict({"model": {"path": str(model_path)}, "models": models or []}, source="test")


def test_the_drills_own_service_gets_the_main_weights_under_two_names(model_path: Path) -> None:
    settings = drill_config(config(model_path), "4GiB")
    assert settings["library"]["max_loaded"] == DRILL_MAX_LOADED == 1
    assert settings["library"]["stand_in"] == "auto"
    big, other = settings["models"]
    assert (big["name"], big["stand_in"], other["name"], other["stand_in"]) == (
        "drill-big",
        model_path.name,
        "drill-other",
        "",
    )
    for added in (big, other):
        assert added["path"] == str(model_path) and added["n_ctx"] == DRILL_MODEL_CTX
        assert added["devices"] == ["gpu", "cpu"] and added["keep_alive"] == "-1"


def test_a_config_with_a_stand_in_keeps_its_models(model_path: Path) -> None:
    mine = [
        {"name": "big", "path": str(model_path), "stand_in": model_path.name},
        {"name": "second", "path": str(model_path)},
    ]
    settings = drill_config(config(model_path, mine), None)
    assert [m["name"] for m in settings["models"]] == ["big", "second"]
    only_big = drill_config(config(model_path, mine[:1]), None)
    assert [m["name"] for m in only_big["models"]] == ["drill-other", "big"]


def test_drill_model_names_never_clash(model_path: Path) -> None:
    mine = [{"name": "drill-big", "path": str(model_path)}]
    settings = drill_config(config(model_path, mine), None)
    assert [m["name"] for m in settings["models"]] == ["drill-big-2", "drill-other", "drill-big"]
    assert settings["models"][0]["stand_in"] == model_path.name
