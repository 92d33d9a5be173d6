"""Per-stage activation recomputation as a CP-SAT integer program.

Given a pipeline whose rank ("stage" below) r holds L_r decoder layers over its vpp model chunks
(plus the embedding on stage 0 and the head on the last), choose how many of each stage's layers
run with full recompute, selective recompute (core attention, Korthikanti et al. 2022 §4) or
none, so that every stage fits and the pipeline's step time is minimal.

Variables (integers, per stage r)
    f_r, s_r, n_r ∈ [0, L_r]  layers with full / selective / no recompute
    u_r, v_r ∈ {0, 1}         stage r recomputes some layer fully / selectively
    w_r ≥ 0                   transient bytes of recomputing one layer
    M ≥ 0                     the slowest stage's forward + backward time per microbatch

Constraints (one method each below)
    count:   f_r + s_r + n_r = L_r
    memory:  vpp·(state_r + w_r) + inflight_r · (fixed_saved_r + f_r·a_full + s_r·a_sel + n_r·a_none)
                 ≤ vpp · usable
             w_r ≥ u_r · work_full, w_r ≥ v_r · work_sel, f_r ≤ L_r · u_r, s_r ≤ L_r · v_r
             (1F1B: stage r holds inflight_r = pp − r microbatches, Narayanan et al. SC'21;
             interleaved: inflight_r model chunks of Megatron's warm-up, each 1/vpp of the stage's
             activations on average — autopar.cost.memory; multiplied through by vpp)
    time:    t_r = base_r + f_r · c_full + s_r · c_sel ≤ M

Objective
    minimize (vpp·m − 1) · M + Σ_r t_r, vpp times the closed form m·max_r t_r + (Σ_r t_r − max_r t_r)/vpp
    of autopar.cost.step, without its plan-independent terms.

Solving: the objective is non-decreasing in every t_r (M = max_r t_r at the optimum) and no
constraint couples two stages, so the optimum is each stage at its own least feasible t_r.
`solve_recompute` therefore minimizes stage by stage over the (f_r, s_r) grid, exactly and
without OR-Tools (whose import alone costs the CLI about 0.8 s: issue 15); the CP-SAT model
below (`solve_recompute(problem, method="cp-sat")`) states the same program and is kept as the
cross-check the tests run against it and brute force. Ties go to the least full, then the least
selective recompute.

Costs are scaled to integers (nanoseconds, bytes; memory rounded up so a fitting solution fits).
Per-layer values are the mean over the stage's decoder layers, exact when they are alike (every
dense model; DeepSeek's first dense layers make stage 0 an approximation). The solver runs with
one worker and a fixed seed, so the same input gives the same answer.

The cost model prices one recompute setting per plan (Recompute.mode, and for full the first K
layers of every virtual stage), so `to_recompute` maps the solution onto it: no recompute → none;
selective only → selective on every layer; any full → full(K) with K = max_r ⌈(f_r + s_r)/vpp⌉
(layers the solver left selective become full, which only saves more memory; with unequal chunks
K per chunk may cover slightly fewer layers). The driver then checks the mapped plan with
`estimate` and raises K until it fits.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from itertools import product

from autopar.errors import NoFeasiblePlanError
from autopar.schema.plan import Recompute, RecomputeMode
from autopar.search.summation import pairwise_sum
from autopar.units import GiB

TIME_UNITS_PER_S = 1e9  # the solver's time unit: 1 ns
SOLVER_SEED = 0
SOLVER_TIME_LIMIT_S = 10.0


@dataclass(frozen=True)
class RecomputeProblem:
    """Integer data of one instance (see the module docstring for the symbols)."""

    layers: tuple[int, ...]  # L_r
    base_ns: tuple[int, ...]
    full_ns: tuple[int, ...]  # c_full per layer
    sel_ns: tuple[int, ...]
    state_bytes: tuple[int, ...]  # incl. the tied-embedding copy on the last stage
    fixed_saved_bytes: tuple[int, ...]  # non-decoder items
    none_bytes: tuple[int, ...]  # a_none per layer
    sel_bytes: tuple[int, ...]
    full_bytes: tuple[int, ...]
    work_full_bytes: tuple[int, ...]
    work_sel_bytes: tuple[int, ...]
    inflight: tuple[int, ...]
    usable_bytes: int
    num_microbatches: int
    vpp: int = 1

    @property
    def stages(self) -> int:
        return len(self.layers)


@dataclass(frozen=True)
class RecomputeSolution:
    full: tuple[int, ...]
    selective: tuple[int, ...]
    objective_ns: int
    status: str  # OPTIMAL | FEASIBLE
    vpp: int = 1

    def to_recompute(self) -> Recompute:
        """The cost model's uniform setting for this solution (see the module docstring)."""
        if any(self.full):
            return Recompute.trusted(RecomputeMode.FULL, num_layers=max(-(-(f + s) // self.vpp)
                                                                        for f, s in zip(self.full, self.selective)))
        if any(self.selective):
            return Recompute.trusted(RecomputeMode.SELECTIVE, ("core_attn",))
        return Recompute.trusted(RecomputeMode.NONE)


class RecomputeModel:
    """Builds and solves the CP-SAT model of one RecomputeProblem."""

    def __init__(self, problem: RecomputeProblem) -> None:
        from ortools.sat.python import cp_model  # heavy (≈0.8 s): only when this model is asked for

        self.cp = cp_model
        self.pb = problem
        self.model = cp_model.CpModel()
        self._add_variables()
        self._add_count_constraints()
        self._add_memory_constraints()
        self._add_time_constraints()
        self._set_objective()

    def _add_variables(self) -> None:
        pb, md = self.pb, self.model
        self.f = [md.new_int_var(0, n, f"full_{r}") for r, n in enumerate(pb.layers)]
        self.s = [md.new_int_var(0, n, f"selective_{r}") for r, n in enumerate(pb.layers)]
        self.n = [md.new_int_var(0, n, f"none_{r}") for r, n in enumerate(pb.layers)]
        self.u = [md.new_bool_var(f"any_full_{r}") for r in range(pb.stages)]
        self.v = [md.new_bool_var(f"any_selective_{r}") for r in range(pb.stages)]
        work_max = max(max(pb.work_full_bytes), max(pb.work_sel_bytes), 0)
        self.w = [md.new_int_var(0, work_max, f"work_{r}") for r in range(pb.stages)]
        t_max = max(b + n * max(cf, cs) for b, n, cf, cs in zip(pb.base_ns, pb.layers, pb.full_ns, pb.sel_ns))
        self.t = [md.new_int_var(0, t_max, f"time_{r}") for r in range(pb.stages)]
        self.makespan = md.new_int_var(0, t_max, "makespan")

    def _add_count_constraints(self) -> None:
        for r, layers in enumerate(self.pb.layers):
            self.model.add(self.f[r] + self.s[r] + self.n[r] == layers)

    def _add_memory_constraints(self) -> None:
        pb, md = self.pb, self.model
        for r in range(pb.stages):
            md.add(self.f[r] <= pb.layers[r] * self.u[r])
            md.add(self.s[r] <= pb.layers[r] * self.v[r])
            md.add(self.w[r] >= pb.work_full_bytes[r] * self.u[r])
            md.add(self.w[r] >= pb.work_sel_bytes[r] * self.v[r])
            k, v = pb.inflight[r], pb.vpp
            md.add(v * pb.state_bytes[r] + k * pb.fixed_saved_bytes[r] + k * pb.full_bytes[r] * self.f[r]
                   + k * pb.sel_bytes[r] * self.s[r] + k * pb.none_bytes[r] * self.n[r] + v * self.w[r]
                   <= v * pb.usable_bytes)

    def _add_time_constraints(self) -> None:
        pb, md = self.pb, self.model
        for r in range(pb.stages):
            md.add(self.t[r] == pb.base_ns[r] + pb.full_ns[r] * self.f[r] + pb.sel_ns[r] * self.s[r])
            md.add(self.t[r] <= self.makespan)

    def _set_objective(self) -> None:
        self.model.minimize((self.pb.vpp * self.pb.num_microbatches - 1) * self.makespan + sum(self.t))

    def solve(self) -> RecomputeSolution:
        cp_model = self.cp
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = 1
        solver.parameters.random_seed = SOLVER_SEED
        solver.parameters.max_time_in_seconds = SOLVER_TIME_LIMIT_S
        status = solver.solve(self.model)
        if status == cp_model.INFEASIBLE:
            raise NoFeasiblePlanError(_infeasible_message(self.pb))
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            raise NoFeasiblePlanError(f"the recompute solver stopped without a solution "
                                      f"({solver.status_name(status)}); fix recompute=full or use more GPUs")
        name = "OPTIMAL" if status == cp_model.OPTIMAL else "FEASIBLE"
        if name == "FEASIBLE":
            warnings.warn(f"recompute solver hit its {SOLVER_TIME_LIMIT_S:g} s limit; the per-stage recompute "
                          "is feasible but may not be optimal", RuntimeWarning, stacklevel=2)
        return RecomputeSolution(full=tuple(solver.value(x) for x in self.f),
                                 selective=tuple(solver.value(x) for x in self.s),
                                 objective_ns=int(round(solver.objective_value)), status=name, vpp=self.pb.vpp)


def solve_recompute(problem: RecomputeProblem, method: str = "stagewise") -> RecomputeSolution:
    """The optimum of `problem`: stage by stage (default; see the module docstring for why that is
    exact) or by the CP-SAT model (method="cp-sat"). Raises NoFeasiblePlanError when some stage
    does not fit even with full recompute of every layer."""
    if method == "cp-sat":
        return RecomputeModel(problem).solve()
    if method != "stagewise":
        raise ValueError(f"unknown recompute solver {method!r}; use 'stagewise' or 'cp-sat'")
    full, selective = [], []
    for r in range(problem.stages):
        best = _best_stage_choice(problem, r)
        if best is None:
            raise NoFeasiblePlanError(_infeasible_message(problem))
        full.append(best[0])
        selective.append(best[1])
    value = objective_ns(problem, tuple(full), tuple(selective))
    return RecomputeSolution(full=tuple(full), selective=tuple(selective), objective_ns=value, status="OPTIMAL",
                             vpp=problem.vpp)


def _best_stage_choice(pb: RecomputeProblem, r: int) -> tuple[int, int] | None:
    """(f_r, s_r) with the least t_r among those that fit stage r (ties: least f, then least s);
    None when none fits. Integer arithmetic, as objective_ns does: for each f, the best s by
    _best_selective (O(L_r) in all, the same answer as scanning the grid f + s ≤ L_r; tested)."""
    best = None  # (t_r, f_r, s_r)
    for f in range(pb.layers[r] + 1):
        s = _best_selective(pb, r, f)
        if s is not None:
            key = (_stage_time_ns(pb, r, f, s), f, s)
            if best is None or key < best:
                best = key
    return None if best is None else best[1:]


def _best_selective(pb: RecomputeProblem, r: int, f: int) -> int | None:
    """The s with the least (t_r, s) among those that fit stage r beside f fully recomputed layers.
    For s ≥ 1 the working bytes no longer change, so the memory is linear in s, slope
    inflight · (a_sel − a_none): the fitting s ≥ 1 form an interval, whose end nearer the least
    t_r (t_r moves by c_sel per layer) is the candidate; s = 0 is checked apart."""
    cap, top = pb.vpp * pb.usable_bytes, pb.layers[r] - f
    zero_fits = stage_memory_scaled(pb, r, f, 0) <= cap
    if top < 1 or (zero_fits and pb.sel_ns[r] >= 0):  # s ≥ 1 cannot be faster than s = 0
        return 0 if zero_fits else None
    first = stage_memory_scaled(pb, r, f, 1)  # memory at s = 1; at s: first + (s − 1) · slope
    slope = pb.inflight[r] * (pb.sel_bytes[r] - pb.none_bytes[r])
    if slope < 0:
        lo, hi = 1 + max(0, -((cap - first) // -slope)), top  # ⌈(first − cap) / −slope⌉ more layers
    elif slope > 0:
        lo, hi = 1, min(top, 1 + (cap - first) // slope) if first <= cap else 0
    else:
        lo, hi = 1, top if first <= cap else 0
    if lo > hi:
        return 0 if zero_fits else None
    return hi if pb.sel_ns[r] < 0 else lo  # c_sel < 0: the most layers; else the fewest (ties: least s)


def _stage_time_ns(pb: RecomputeProblem, r: int, full: int, selective: int) -> int:
    """t_r = base_r + f_r · c_full + s_r · c_sel."""
    return pb.base_ns[r] + full * pb.full_ns[r] + selective * pb.sel_ns[r]


def _infeasible_message(pb: RecomputeProblem) -> str:
    worst, over = 0, -math.inf
    for r in range(pb.stages):
        need = (pb.state_bytes[r] + pb.work_full_bytes[r]
                + pb.inflight[r] * (pb.fixed_saved_bytes[r] + pb.layers[r] * pb.full_bytes[r]) / pb.vpp)
        if need - pb.usable_bytes > over:
            worst, over = r, need - pb.usable_bytes
    return (f"even full recompute of every layer leaves pipeline stage {worst} {over / GiB:.1f} GiB over its memory; "
            "use more GPUs (higher pp or tp), a smaller micro batch or global batch, or a higher ZeRO stage")


def stage_memory_scaled(pb: RecomputeProblem, r: int, full: int, selective: int) -> int:
    """vpp × the allocated bytes of stage r with `full` and `selective` recomputed layers, exactly as
    the memory constraint counts them: vpp·(state + work) + inflight · saved (integers, no rounding)."""
    n = pb.layers[r] - full - selective
    work = max(pb.work_full_bytes[r] if full else 0, pb.work_sel_bytes[r] if selective else 0)
    saved = pb.fixed_saved_bytes[r] + full * pb.full_bytes[r] + selective * pb.sel_bytes[r] + n * pb.none_bytes[r]
    return pb.vpp * (pb.state_bytes[r] + work) + pb.inflight[r] * saved


def objective_ns(pb: RecomputeProblem, full: tuple[int, ...], selective: tuple[int, ...]) -> int | None:
    """The objective of a choice, or None when some stage does not fit (for brute force)."""
    times = []
    for r in range(pb.stages):
        f, s = full[r], selective[r]
        if pb.layers[r] - f - s < 0:
            return None
        mem = stage_memory_scaled(pb, r, f, s)
        if mem > pb.vpp * pb.usable_bytes:
            return None
        times.append(_stage_time_ns(pb, r, f, s))
    return (pb.vpp * pb.num_microbatches - 1) * max(times) + sum(times)


def brute_force_recompute(pb: RecomputeProblem) -> int | None:
    """Minimum objective over every per-stage (full, selective) count (small instances only)."""
    per_stage = [[(f, s) for f in range(n + 1) for s in range(n + 1 - f)] for n in pb.layers]
    best = None
    for choice in product(*per_stage):
        val = objective_ns(pb, tuple(c[0] for c in choice), tuple(c[1] for c in choice))
        if val is not None and (best is None or val < best):
            best = val
    return best


def recompute_problem(table, mem, counts: tuple[int, ...], pp: int, vpp: int,
                      num_microbatches: int) -> RecomputeProblem:
    """The instance of a plan from its layer table (autopar.search.costs.LayerTable), its stage
    memory model (StageMemoryModel) and decoder layers per virtual stage (pp·vpp entries)."""
    from autopar.search.costs import stage_bounds, state_bytes_per_layer

    bounds = stage_bounds(len(table.fb_s), counts, table.first_decoder)
    state = state_bytes_per_layer(table, mem)
    rows = []
    for r in range(pp):
        idx = [i for c in range(vpp) for i in range(*bounds[c * pp + r])]  # rank r's chunks in order
        dec = [i for i in idx if table.is_decoder[i]]
        other = [i for i in idx if not table.is_decoder[i]]

        def total(column, items):
            return pairwise_sum([column[i] for i in items])

        def mean(column):
            return total(column, dec) / len(dec)

        extra = mem.extra_last_bytes if r == pp - 1 else 0.0
        rows.append((
            len(dec), _ns(total(table.fb_s, idx)), _ns(mean(table.recompute_s["full"])),
            _ns(mean(table.recompute_s["selective"])), _bytes(total(state, idx) + extra),
            _bytes(total(table.saved_bytes["none"], other)), _bytes(mean(table.saved_bytes["none"])),
            _bytes(mean(table.saved_bytes["selective"])), _bytes(mean(table.saved_bytes["full"])),
            _bytes(max(table.work_bytes["full"][i] for i in dec)),
            _bytes(max(table.work_bytes["selective"][i] for i in dec)),
        ))
    cols = list(zip(*rows))
    return RecomputeProblem(*[tuple(c) for c in cols], inflight=tuple(mem.inflight), usable_bytes=int(mem.usable_bytes),
                            num_microbatches=num_microbatches, vpp=vpp)


def _ns(seconds: float) -> int:
    return int(round(float(seconds) * TIME_UNITS_PER_S))


def _bytes(b: float) -> int:
    return int(math.ceil(float(b)))
