"""The plan's caps line, shared by the tray, the status page and `failsoft status`."""

from __future__ import annotations

from tray_app.view.budget_split import caps_text

MIB = 1024 * 1024
PLAN = {"n_ctx": 2048, "n_parallel": 1, "n_gpu_layers": 9, "n_layers": 9}


def test_a_dense_plan_names_its_layers_only() -> None:
    assert caps_text(PLAN, {}) == "Context 2,048 per request · 1 parallel · 9/9 layers on GPU"


def test_an_expert_split_names_the_experts_kept_in_ram() -> None:
    whole = {**PLAN, "n_cpu_moe": 3, "cpu_expert_bytes": 18 * MIB}
    assert caps_text(whole, {}).endswith("9/9 layers on GPU · experts of 3/8 layers in RAM (18.00 MiB)")
    finer = {**whole, "cpu_expert_tensors": ["ffn_down_exps"], "cpu_expert_bytes": 20 * MIB}
    assert caps_text(finer, {}).endswith("experts of 3/8 layers + 1 tensor in RAM (20.00 MiB)")
    only_tensors = {**PLAN, "cpu_expert_tensors": ["ffn_gate_exps", "ffn_up_exps"], "cpu_expert_bytes": MIB}
    assert caps_text(only_tensors, {}).endswith("experts of 0/8 layers + 2 tensors in RAM (1.00 MiB)")
