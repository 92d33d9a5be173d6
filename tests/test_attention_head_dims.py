"""The attention kernel Transformer Engine picks by head dim (autopar.frameworks.megatron
TE_CUDNN_HEAD_DIM_LIMITS, from TE v2.16 fused_attn.cpp nvte_get_fused_attn_backend): cuDNN trains
head dims up to 256 on Hopper, up to 128 and MLA's 192/128 on Blackwell; other heads on Blackwell
run flash-attn 2."""

from __future__ import annotations

import pytest

from autopar.api import load_model
from autopar.cost.params import load_cost_model
from autopar.cost.step import setup
from autopar.frameworks import framework_profile
from autopar.hardware import load_cluster
from autopar.schema.plan import ParallelPlan
from autopar.validate.dataset import load_runs
from autopar.validate.runner import _graph_for

MEGATRON = framework_profile("megatron", None)


@pytest.mark.parametrize("arch,dims,kernel", [
    ("blackwell", ((128, 128),), "cudnn"), ("blackwell", ((192, 128),), "cudnn"),  # MLA: cuDNN 9.11+
    ("blackwell", ((192, 192),), "fa2"), ("blackwell", ((256, 256),), "fa2"),
    ("hopper", ((192, 192),), "cudnn"), ("hopper", ((256, 256),), "cudnn"), ("ampere", ((128, 128),), "fa2"),
    ("blackwell", (), "cudnn"),  # a model without softmax attention keeps the arch's kernel
])
def test_megatron_kernel_by_head_dim(arch, dims, kernel):
    assert MEGATRON.attention_kernel(arch, dims) == kernel


def test_other_frameworks_keep_their_kernel():
    for name in ("torchtitan", "deepspeed"):
        fw = framework_profile(name, None)
        assert fw.attention_kernel("blackwell", ((256, 256),)) == fw.attention_kernel("blackwell") == "fa2"


def test_plans_take_the_kernel_of_their_model_s_heads():
    _, b200 = load_cost_model("b200")
    cluster = load_cluster("dgx-b200", 8)
    plan = ParallelPlan(tp=8, global_batch=8, seq_len=4096)
    qwen_next, llama = load_model("qwen3-next-80b-a3b"), load_model("llama3-8b")
    assert qwen_next.attention_head_dims == ((256, 256),) and llama.attention_head_dims == ((128, 128),)
    assert setup(qwen_next, cluster, plan, b200).split.attention_kernel == "fa2"
    assert setup(llama, cluster, plan, b200).split.attention_kernel == "cudnn"
    fused = plan.model_copy(update={"attention_backend": "fused"})  # the plan's own backend wins
    assert setup(qwen_next, cluster, fused, b200).split.attention_kernel == "cudnn"


def test_nemotron4_340b_on_gb200_ran_flash_attention_2():
    """Nemotron-4 340B: 96 heads of 192 (hidden 18,432). Its dgxc-nemo25 GB200 rows are priced with
    flash-attn 2, its H100 rows with cuDNN."""
    _, gb200 = load_cost_model("gb200")
    _, h100 = load_cost_model("h100")
    runs = [r for r in load_runs({"dgxc-nemo25"}) if "nemotron4_340b" in r.run_id]
    assert runs
    for r in runs:
        graph = _graph_for(r)
        assert graph.attention_head_dims == ((192, 192),)
        plan = ParallelPlan(tp=r.tp, pp=r.pp, global_batch=r.global_batch, seq_len=r.seq_len)
        gpu, p = ("gb200", gb200) if r.cluster == "gb200-nvl72" else ("h100", h100)
        kernel = setup(graph, load_cluster(r.cluster, r.num_gpus), plan, p).split.attention_kernel
        assert kernel == ("fa2" if gpu == "gb200" else "cudnn")
