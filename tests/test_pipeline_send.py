"""The stage-boundary send of one microbatch (autopar.cost.step.pipeline_send_s), by hand: Megatron-Core
sends the sp-split tensor or the whole one; Megatron-LM before Megatron-Core and Megatron-DeepSpeed
split it over tp and all-gather it on receipt (Narayanan et al. SC'21 §4.1)."""

import pytest

from autopar.cost import comm
from autopar.frameworks import framework_profile
from autopar.cost.params import load_cost_model
from autopar.cost.step import pipeline_send_s, setup
from autopar.hardware import load_cluster
from autopar.model import load_model
from autopar.schema.plan import ParallelPlan

GPT = load_model("gpt3-175b")  # hidden 12288
CLUSTER = load_cluster("dgx-a100-80gb", 64)
_, P = load_cost_model("a100")


def _plan(**kw) -> ParallelPlan:
    return ParallelPlan(**{"tp": 8, "pp": 8, "mbs": 1, "global_batch": 8, "seq_len": 2048, **kw})


def test_releases_that_scatter_and_gather():
    assert not framework_profile("megatron").pipeline_scatter_gather
    assert framework_profile("megatron", "pre-core").pipeline_scatter_gather
    assert framework_profile("deepspeed", "megatron-deepspeed").pipeline_scatter_gather
    assert framework_profile("deepspeed", "0.3").pipeline_scatter_gather
    assert not framework_profile("deepspeed").pipeline_scatter_gather


@pytest.mark.parametrize("crosses", [False, True])
def test_send_bytes_by_release_and_sp(crosses):
    full = 2048 * 12288 * 2  # tokens x hidden x bf16 = 50,331,648 bytes
    core_sp = _plan(sp=True)
    core = _plan(sp=False)
    legacy = _plan(sp=False, framework_release="pre-core")
    legacy_sp = _plan(sp=True, framework_release="pre-core")
    st = setup(GPT, CLUSTER, core, P)
    one_eighth = comm.send_recv_s(full / 8, crosses, CLUSTER, P)
    whole = comm.send_recv_s(full, crosses, CLUSTER, P)
    gather = comm.all_gather_s(full, st.spans.tp, CLUSTER, P)
    assert gather > 0 and whole > one_eighth
    assert pipeline_send_s(12288, setup(GPT, CLUSTER, core_sp, P), core_sp, CLUSTER, P, crosses) == one_eighth
    assert pipeline_send_s(12288, st, core, CLUSTER, P, crosses) == whole
    assert pipeline_send_s(12288, setup(GPT, CLUSTER, legacy, P), legacy, CLUSTER, P, crosses) == \
        pytest.approx(one_eighth + gather)
    # Under sequence parallelism the tensor is already split: no gather on receipt.
    assert pipeline_send_s(12288, setup(GPT, CLUSTER, legacy_sp, P), legacy_sp, CLUSTER, P, crosses) == one_eighth


def test_tp1_sends_the_whole_tensor_in_every_release():
    full = 2048 * 12288 * 2
    for release in (None, "pre-core"):
        plan = _plan(tp=1, sp=None, framework_release=release)
        st = setup(GPT, CLUSTER, plan, P)
        assert pipeline_send_s(12288, st, plan, CLUSTER, P, True) == comm.send_recv_s(full, True, CLUSTER, P)
