"""Benchmark of the Sinkhorn solver: time, peak memory and accuracy, against ott-jax.

The benchmarked problem is the soft-rank transport of `softsort_tf.solvers.sinkhorn`:
inputs x `[B, n]` uniform on [0, 1] (no squashing), uniform weights, m targets
y = linspace(0, 1, m) with uniform weights, squared cost, regularisation ε (absolute,
in units of the cost) and the stopping threshold on the L1 marginal error. Soft ranks
are read out as in ott-jax's `soft_sort.ranks`: r = (P t) / a with
t_j = j (n − 1) / (m − 1), so with ott-jax installed (`pip install -e ".[benchmark]"`)
both libraries solve the *identical* problem, and the script reports the time ratio
and the accuracy of both against a float64 reference.

Sections (`--sections`):

- compare: forward and forward+backward time at the target configurations
  (`--compare_configs`), for the implicit and the unrolled gradient, with XLA and in
  graph mode; ott-jax's `ranks` jitted (`jax.value_and_grad`) in the same run; the
  max abs error of the ranks and the relative error of the gradient.
- scaling: time against n and m at a fixed batch.
- ablation: the effect of each iteration-cutting device (warm start, ε annealing,
  the error-check period) on the iteration count, time and accuracy.
- memory: peak memory of forward+backward against a forced iteration count (tiny
  threshold, cold start), each in a fresh subprocess: the implicit backward stays
  flat while the unrolled one grows.

Each ott-jax variant runs in its own subprocess, bounded by `--ott_timeout_s`: its
default float32 implicit gradient fails (NaN in the linear solve), and at n = 1000 only
after ~15 minutes of conjugate-gradient steps on 2 cores; the row then records the
failure, or what finished before the bound.

The defaults (`make bench`) are a quick run (a few minutes on 2 cores); the tables of
docs/benchmarks.md come from the full comparison (about 25 minutes on 2 cores)

    python scripts/bench_sinkhorn.py --sections=compare --compare_configs=32x300,8x1000 \
        --repeats=5 --ott_float64 --ott_timeout_s=1800 --markdown=bench.md

and `--sections=ablation,scaling,memory --repeats=3 --memory_graph_mode`.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

_SECTIONS = flags.DEFINE_list(
    "sections", ["compare", "ablation", "scaling", "memory"],
    "Which sections to run: compare, ablation, scaling, memory.")
_COMPARE_CONFIGS = flags.DEFINE_list(
    "compare_configs", ["32x300"],
    "BATCHxN problems of the ott-jax comparison (the full run adds 8x1000).")
_EPSILON = flags.DEFINE_float("epsilon", 1e-2, "Regularisation ε (absolute, cost units).")
_THRESHOLD = flags.DEFINE_float("threshold", 1e-3, "L1 marginal error at which rows stop.")
_MAX_ITERATIONS = flags.DEFINE_integer(
    "max_iterations", 2000, "Iteration bound (ott-jax's default, used by both).")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repeats; the median is reported.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the random inputs.")
_OTT = flags.DEFINE_bool("ott", True, "Also time ott-jax when it is installed.")
_OTT_FLOAT64 = flags.DEFINE_bool(
    "ott_float64", False, "Also time ott-jax's implicit gradient in float64 (slow; it works "
    "there, while its float32 implicit gradient fails).")
_GRAPH_MODE = flags.DEFINE_bool(
    "graph_mode", True, "In `compare`, also time tf.function without XLA.")
_ABLATION_CONFIG = flags.DEFINE_string("ablation_config", "32x300", "BATCHxN of the ablation.")
_SCALING_BATCH = flags.DEFINE_integer("scaling_batch", 8, "Batch size of the scaling section.")
_SCALING_SIZES = flags.DEFINE_list(
    "scaling_sizes", ["100x100", "300x300", "1000x1000", "1000x100"],
    "NxM problems of the scaling section.")
_MEMORY_GRAPH_MODE = flags.DEFINE_bool(
    "memory_graph_mode", False, "In `memory`, also measure graph mode without XLA.")
_MEMORY_CONFIG = flags.DEFINE_string("memory_config", "4x128", "BATCHxN of the memory section.")
_MEMORY_ITERATIONS = flags.DEFINE_list(
    "memory_iterations", ["50", "200", "800"], "Forced iteration counts of the memory section.")
_MARKDOWN = flags.DEFINE_string("markdown", None, "Write the tables to this markdown file.")
_CSV = flags.DEFINE_string("csv", None, "Write all rows to this CSV file.")
_OTT_TIMEOUT = flags.DEFINE_integer(
    "ott_timeout_s", 1800, "Wall-clock bound, in seconds, of each ott-jax variant (its "
    "process is killed after it; the row then says what had finished).")
_WORKER = flags.DEFINE_string(
    "worker", None, "Internal: run one memory measurement (JSON spec) and print JSON.")
_OTT_WORKER = flags.DEFINE_string(
    "ott_worker", None, "Internal: time one ott-jax variant (JSON spec), print JSON lines.")


# ---------------------------------------------------------------------------------
# Problems and references.
# ---------------------------------------------------------------------------------
def parse_pair(text: str) -> tuple[int, int]:
    """'32x300' -> (32, 300)."""
    left, right = text.lower().split("x")
    return int(left), int(right)


def make_problem(batch: int, n: int, seed: int):
    """Inputs uniform on [0, 1] and a random cotangent for the ranks, float32."""
    rng = np.random.RandomState(seed)
    x = rng.rand(batch, n).astype(np.float32)
    cotangent = rng.randn(batch, n).astype(np.float32)
    return x, cotangent


def rank_readout_vector(n: int, m: int) -> np.ndarray:
    """t_j = j (n − 1) / (m − 1): ott-jax's rank readout (0-based ranks in [0, n − 1])."""
    return np.arange(m) * ((n - 1.0) / max(m - 1.0, 1.0))


def numpy_reference_ranks(x: np.ndarray, m: int, epsilon: float, tol: float = 1e-10,
                          max_iterations: int = 100000) -> np.ndarray:
    """Independent float64 log-domain Sinkhorn (numpy, cold start), until the error < tol.

    Used to cross-check the float64 reference of `reference_solution` on a few rows.
    """
    from scipy.special import logsumexp

    x = x.astype(np.float64)
    batch, n = x.shape
    y = np.linspace(0.0, 1.0, m)
    cost = (x[:, :, None] - y[None, None, :]) ** 2
    log_a, log_b = -np.log(n), -np.log(m)
    f = np.zeros((batch, n))
    g = np.zeros((batch, m))
    for _ in range(max_iterations):
        f = epsilon * log_a - epsilon * logsumexp((g[:, None, :] - cost) / epsilon, axis=2)
        g = epsilon * log_b - epsilon * logsumexp((f[:, :, None] - cost) / epsilon, axis=1)
        plan = np.exp((f[:, :, None] + g[:, None, :] - cost) / epsilon)
        if np.abs(plan.sum(axis=2) - 1.0 / n).sum(axis=1).max() < tol:
            break
    return plan @ rank_readout_vector(n, m) * n


# ---------------------------------------------------------------------------------
# softsort_tf.
# ---------------------------------------------------------------------------------
def tf_functions(n: int, m: int, *, epsilon: float, threshold: float, max_iterations: int,
                 implicit: bool, jit_compile: bool | None, dtype="float32", **options):
    """(forward, forward_backward) tf.functions of the soft-rank problem.

    forward(x) -> (ranks, iterations); forward_backward(x, v) -> (loss, grad, iterations)
    with loss = Σ ranks · v.
    """
    import tensorflow as tf

    from softsort_tf.solvers import sinkhorn as sinkhorn_solver

    y = tf.constant(np.linspace(0.0, 1.0, m), dtype)
    t = tf.constant(rank_readout_vector(n, m), dtype)
    # Ranks are read out through a⁻¹ P: return the plan whose rows are exact, as
    # ott-jax does (its last update is the f update).
    options.setdefault("exact_marginal", "input")

    def ranks(x):
        res = sinkhorn_solver.solve(x, y, epsilon=epsilon, threshold=threshold,
                                    max_iterations=max_iterations, implicit=implicit, **options)
        return tf.linalg.matvec(res.plan(), t) * n, res.num_iterations

    def forward(x):
        return ranks(x)

    def forward_backward(x, v):
        with tf.GradientTape() as tape:
            tape.watch(x)
            r, iterations = ranks(x)
            loss = tf.reduce_sum(r * v)
        return loss, tape.gradient(loss, x), r, iterations

    kw = dict(jit_compile=jit_compile, reduce_retracing=True)
    return tf.function(forward, **kw), tf.function(forward_backward, **kw)


WARMUP_CALLS = 2  # untimed calls after the compiling one (thread pools, caches)


def time_tf(fn, args, repeats: int):
    """Median wall time of fn(*args) in seconds (first call, with compilation, and
    `WARMUP_CALLS` more excluded: the first calls after compiling are up to 3x slower)."""
    for _ in range(1 + WARMUP_CALLS):
        out = fn(*args)
        _ = [o.numpy() for o in out]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn(*args)
        _ = [o.numpy() for o in out]
        times.append(time.perf_counter() - start)
    return float(np.median(times)), [o.numpy() for o in out]


def reference_solution(x: np.ndarray, v: np.ndarray, m: int, epsilon: float):
    """float64 ranks and gradient of Σ ranks · v, converged to an error below 1e-10.

    Computed by our solver in float64 (threshold 1e-10, dense implicit solve) and
    cross-checked on 2 rows against an independent numpy Sinkhorn; returns
    (ranks, grad, cross-check max abs rank difference).
    """
    import tensorflow as tf

    _, fb = tf_functions(x.shape[1], m, epsilon=epsilon, threshold=1e-10, max_iterations=100000,
                         implicit=True, jit_compile=False, dtype="float64",
                         implicit_solver="dense")
    _, grad, ranks, _ = fb(tf.constant(x, tf.float64), tf.constant(v, tf.float64))
    rows = min(2, x.shape[0])
    check = numpy_reference_ranks(x[:rows], m, epsilon)
    return ranks.numpy(), grad.numpy(), float(np.abs(check - ranks.numpy()[:rows]).max())


# ---------------------------------------------------------------------------------
# ott-jax.
# ---------------------------------------------------------------------------------
def ott_available() -> bool:
    try:
        import jax  # noqa: F401
        from ott.tools import soft_sort  # noqa: F401
    except ImportError:
        return False
    return True


def ott_version() -> str:
    import jax
    import ott

    return f"ott-jax {ott.__version__}, jax {jax.__version__}"


def ott_functions(m: int, *, epsilon: float, threshold: float, max_iterations: int,
                  implicit: bool, **options):
    """Jitted (forward, forward_backward) of ott-jax's soft ranks on the same problem."""
    import jax
    import jax.numpy as jnp
    from ott.tools import soft_sort

    extra = dict(options)
    if not implicit:
        extra["implicit_diff"] = None

    def ranks(x):
        return soft_sort.ranks(x, axis=-1, num_targets=m, squashing_fun=lambda z: z,
                               epsilon=epsilon, threshold=threshold,
                               max_iterations=max_iterations, **extra)

    def loss(x, v):
        r = ranks(x)
        return jnp.sum(r * v), r

    return jax.jit(ranks), jax.jit(jax.value_and_grad(loss, has_aux=True))


def time_jax(fn, args, repeats: int):
    """(first-call seconds, median seconds of the repeats, output as numpy)."""
    import jax

    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    first = time.perf_counter() - start
    for _ in range(WARMUP_CALLS):
        out = jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return first, float(np.median(times)), jax.tree_util.tree_map(np.asarray, out)


def ott_iterations(x, m: int, *, epsilon: float, threshold: float,
                   max_iterations: int) -> int:
    """Iterations ott-jax's solver uses on the rows of x (max over rows)."""
    import jax
    import jax.numpy as jnp
    from ott.tools import soft_sort

    n = x.shape[1]

    def iters(row):
        out = soft_sort.transport_for_sort(row, jnp.ones(n) / n, jnp.ones(m) / m,
                                           squashing_fun=lambda z: z, epsilon=epsilon,
                                           threshold=threshold, max_iterations=max_iterations)
        return out.n_iters

    return int(np.max(np.asarray(jax.jit(jax.vmap(iters))(jnp.asarray(x)))))


def ott_worker(spec: dict) -> None:
    """Times one ott-jax variant; prints one JSON line per finished stage.

    Runs in its own process (float64 through JAX_ENABLE_X64, set by the parent), so
    that the parent can bound it by a timeout and still read the stages that finished.
    Arrays (ranks, gradient) go to `spec["npz"]`.
    """
    import jax.numpy as jnp

    batch, n, m = spec["batch"], spec["n"], spec["m"]
    x, v = make_problem(batch, n, spec["seed"])
    dt = np.float64 if spec["x64"] else np.float32
    xj, vj = jnp.asarray(x.astype(dt)), jnp.asarray(v.astype(dt))
    opts = dict(epsilon=spec["epsilon"], threshold=spec["threshold"],
                max_iterations=spec["max_iterations"])

    def emit(**fields):
        print(json.dumps(fields), flush=True)

    emit(stage="iterations", iterations=ott_iterations(xj, m, **opts))
    fw, fb = ott_functions(m, implicit=spec["implicit"], **opts)
    first, t_fw, ranks = time_jax(fw, (xj,), spec["repeats"])
    np.savez(spec["npz"], ranks=ranks)
    emit(stage="forward", first_s=first, forward_s=t_fw)
    try:
        first, t_fb, ((_, _), grad) = time_jax(fb, (xj, vj), spec["repeats"])
    except Exception as e:  # noqa: BLE001  (lineax raises when its solve fails)
        emit(stage="backward_failed", error=f"{type(e).__name__}: {str(e)[-1500:]}")
        return
    np.savez(spec["npz"], ranks=ranks, grad=grad)
    emit(stage="backward", first_s=first, forward_backward_s=t_fb,
         finite=bool(np.all(np.isfinite(grad))))


def run_ott_variant(spec: dict, timeout_s: int, log) -> dict:
    """Runs `ott_worker` in a subprocess bounded by `timeout_s`; returns its stages.

    The result maps each finished stage to its JSON fields, plus "timed_out" and the
    arrays written by the worker ("ranks", "grad") when present.
    """
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        spec = dict(spec, npz=os.path.join(tmp, "ott.npz"))
        env = dict(os.environ, JAX_ENABLE_X64="1" if spec["x64"] else "0")
        cmd = [sys.executable, os.path.abspath(__file__), f"--ott_worker={json.dumps(spec)}"]
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                                  timeout=timeout_s, check=False)
            stdout, timed_out = proc.stdout, False
            if proc.returncode != 0:
                log(f"  ott-jax worker exited with {proc.returncode}: {proc.stderr[-1500:]}")
        except subprocess.TimeoutExpired as e:
            out = e.stdout or ""
            stdout = out.decode() if isinstance(out, bytes) else out
            timed_out = True
        result: dict = {"timed_out": timed_out, "wall_s": time.perf_counter() - start}
        for line in stdout.splitlines():
            if line.startswith("{"):
                fields = json.loads(line)
                result[fields.pop("stage")] = fields
        if os.path.exists(spec["npz"]):
            with np.load(spec["npz"]) as arrays:
                result.update({k: arrays[k] for k in arrays.files})
    return result


# ---------------------------------------------------------------------------------
# Rows and tables.
# ---------------------------------------------------------------------------------
@dataclasses.dataclass
class Row:
    section: str
    method: str
    batch: int
    n: int
    m: int
    iterations: str = ""
    forward_ms: float | None = None
    forward_backward_ms: float | None = None
    rank_error: float | None = None
    grad_error: float | None = None
    peak_memory_mb: float | None = None
    note: str = ""


def fmt(value, spec: str) -> str:
    return "" if value is None else format(value, spec)


def markdown_table(rows: list[Row], columns: list[str]) -> str:
    headers = {
        "method": "method", "batch": "B", "n": "n", "m": "m", "iterations": "iterations",
        "forward_ms": "forward ms", "forward_backward_ms": "fwd+bwd ms",
        "rank_error": "rank max abs err", "grad_error": "grad rel err",
        "peak_memory_mb": "peak MB", "note": "note"}
    specs = {"forward_ms": ".1f", "forward_backward_ms": ".1f", "rank_error": ".2e",
             "grad_error": ".2e", "peak_memory_mb": ".0f"}
    lines = ["| " + " | ".join(headers[c] for c in columns) + " |",
             "|" + "|".join("---" for _ in columns) + "|"]
    for r in rows:
        cells = [fmt(getattr(r, c), specs[c]) if c in specs else str(getattr(r, c))
                 for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def iteration_summary(iterations) -> str:
    it = np.asarray(iterations).ravel()
    return f"{int(np.median(it))} / {int(it.max())}"


# ---------------------------------------------------------------------------------
# Sections.
# ---------------------------------------------------------------------------------
def summarise_error(error: str) -> str:
    """One phrase for a failed ott-jax backward pass (lineax's runtime errors)."""
    for marker in ("returned non-finite", "maximum number of", "max_steps", "singular"):
        for line in error.splitlines():
            if marker in line:
                return line.split("Error: ", 1)[-1].split(". ")[0].strip().rstrip(".")
    return error.split(":", 1)[0]


def ott_row(name: str, batch: int, n: int, m: int, res: dict, ref_ranks: np.ndarray,
            ref_grad: np.ndarray, timeout_s: int) -> Row:
    """Table row of one ott-jax variant from `run_ott_variant`'s result."""
    iters = res.get("iterations", {}).get("iterations")
    row = Row("compare", name, batch, n, m, "- / " + ("?" if iters is None else str(iters)))
    if "forward" in res:
        row.forward_ms = 1e3 * res["forward"]["forward_s"]
        row.rank_error = float(np.abs(res["ranks"] - ref_ranks).max())
    if "backward" in res:
        row.forward_backward_ms = 1e3 * res["backward"]["forward_backward_s"]
        if res["backward"]["finite"]:
            row.grad_error = float(np.abs(res["grad"] - ref_grad).max() /
                                   np.abs(ref_grad).max())
        else:
            row.note = "NaN gradient"
    elif "backward_failed" in res:
        row.note = "backward failed: " + summarise_error(res["backward_failed"]["error"])
    if res["timed_out"]:
        stage = "backward" if "forward" in res else "forward"
        row.note = f"{stage} did not finish within {timeout_s} s (killed)"
    return row


def run_compare(out: list[Row], log) -> list[str]:
    import tensorflow as tf

    eps, thr, max_it, reps = (_EPSILON.value, _THRESHOLD.value, _MAX_ITERATIONS.value,
                              _REPEATS.value)
    with_ott = _OTT.value and ott_available()
    ratios = []
    for config in _COMPARE_CONFIGS.value:
        batch, n = parse_pair(config)
        m = n
        x, v = make_problem(batch, n, _SEED.value)
        log(f"[compare] B={batch} n={n}: float64 references ...")
        ref_ranks, ref_grad, cross = reference_solution(x, v, m, eps)
        log(f"  float64 reference vs independent numpy Sinkhorn: max abs rank diff {cross:.1e}")
        gscale = np.abs(ref_grad).max()
        rows = []

        # Unrolled under XLA preallocates its backward stacks for `max_iterations` (static
        # shapes): 43 GB at B = 32, n = 300; it is measured in the memory section instead.
        variants = [("softsort_tf XLA, implicit", True, True),
                    ("softsort_tf graph (no XLA), unrolled", False, False)]
        if _GRAPH_MODE.value:
            variants += [("softsort_tf graph (no XLA), implicit", True, False)]
        ours_fb = None
        for name, implicit, xla in variants:
            fw, fb = tf_functions(n, m, epsilon=eps, threshold=thr, max_iterations=max_it,
                                  implicit=implicit, jit_compile=xla)
            xt, vt = tf.constant(x), tf.constant(v)
            t_fw, (r, iters) = time_tf(fw, (xt,), reps)
            t_fb, (_, grad, _, _) = time_tf(fb, (xt, vt), reps)
            row = Row("compare", name, batch, n, m, iteration_summary(iters), 1e3 * t_fw,
                      1e3 * t_fb, float(np.abs(r - ref_ranks).max()),
                      float(np.abs(grad - ref_grad).max() / gscale))
            rows.append(row)
            if name == "softsort_tf XLA, implicit":
                ours_fb = t_fb
            log(f"  {name}: fwd {row.forward_ms:.1f} ms, fwd+bwd {row.forward_backward_ms:.1f}"
                f" ms, iterations {row.iterations}, rank err {row.rank_error:.2e}, "
                f"grad err {row.grad_error:.2e}")

        if with_ott:
            ott_variants = [("ott-jax jit, implicit (default), float32", True, False),
                            ("ott-jax jit, unrolled, float32", False, False)]
            if _OTT_FLOAT64.value:
                ott_variants.append(("ott-jax jit, implicit, float64", True, True))
            for name, implicit, x64 in ott_variants:
                spec = dict(batch=batch, n=n, m=m, seed=_SEED.value, epsilon=eps,
                            threshold=thr, max_iterations=max_it, implicit=implicit, x64=x64,
                            repeats=reps)
                res = run_ott_variant(spec, _OTT_TIMEOUT.value, log)
                row = ott_row(name, batch, n, m, res, ref_ranks, ref_grad,
                              _OTT_TIMEOUT.value)
                rows.append(row)
                head = f"B={batch}, n={n}: {name} fwd+bwd / softsort_tf XLA implicit fwd+bwd"
                if row.forward_backward_ms is not None and "NaN" not in row.note:
                    ratios.append(f"{head} = {row.forward_backward_ms / 1e3 / ours_fb:.1f}x")
                elif "did not finish" in row.note:
                    ratios.append(f"{head} > {_OTT_TIMEOUT.value / ours_fb:.0f}x "
                                  f"(no result within {_OTT_TIMEOUT.value} s)")
                log(f"  {name}: fwd {fmt(row.forward_ms, '.1f')} ms, fwd+bwd "
                    f"{fmt(row.forward_backward_ms, '.1f')} ms, rank err "
                    f"{fmt(row.rank_error, '.2e')}, grad err {fmt(row.grad_error, '.2e')} "
                    f"{row.note} (wall {res['wall_s']:.0f} s)")
        out.extend(rows)
    return ratios


def run_ablation(out: list[Row], log) -> None:
    import tensorflow as tf

    eps, thr, max_it, reps = (_EPSILON.value, _THRESHOLD.value, _MAX_ITERATIONS.value,
                              _REPEATS.value)
    batch, n = parse_pair(_ABLATION_CONFIG.value)
    m = n
    x, v = make_problem(batch, n, _SEED.value + 1)
    ref_ranks, _, _ = reference_solution(x, v, m, eps)
    variants = [
        ("default: warm start, check every iteration", {}),
        ("check every 5", dict(check_every=5)),
        ("check every 10", dict(check_every=10)),
        ("no warm start", dict(warm_start=False)),
        ("no warm start, check every 5", dict(warm_start=False, check_every=5)),
        ("annealing 1.0 -> eps (x0.8), no warm start",
         dict(warm_start=False, epsilon_start=1.0, epsilon_decay=0.8)),
        ("annealing 1.0 -> eps (x0.8) + warm start",
         dict(epsilon_start=1.0, epsilon_decay=0.8)),
        ("annealing 0.1 -> eps (x0.5) + warm start",
         dict(epsilon_start=0.1, epsilon_decay=0.5)),
        ("column-exact plan (exact_marginal='target')", dict(exact_marginal="target")),
    ]
    xt, vt = tf.constant(x), tf.constant(v)
    for name, options in variants:
        fw, fb = tf_functions(n, m, epsilon=eps, threshold=thr, max_iterations=max_it,
                              implicit=True, jit_compile=True, **options)
        t_fw, (r, iters) = time_tf(fw, (xt,), reps)
        t_fb, _ = time_tf(fb, (xt, vt), reps)
        row = Row("ablation", name, batch, n, m, iteration_summary(iters), 1e3 * t_fw,
                  1e3 * t_fb, float(np.abs(r - ref_ranks).max()))
        out.append(row)
        log(f"[ablation] {name}: iterations {row.iterations}, fwd {row.forward_ms:.1f} ms, "
            f"fwd+bwd {row.forward_backward_ms:.1f} ms, rank err {row.rank_error:.2e}")


def run_scaling(out: list[Row], log) -> None:
    import tensorflow as tf

    eps, thr, max_it, reps = (_EPSILON.value, _THRESHOLD.value, _MAX_ITERATIONS.value,
                              _REPEATS.value)
    batch = _SCALING_BATCH.value
    for size in _SCALING_SIZES.value:
        n, m = parse_pair(size)
        x, v = make_problem(batch, n, _SEED.value + 2)
        xt, vt = tf.constant(x), tf.constant(v)
        for implicit in (True, False):
            # Unrolled runs in graph mode: under XLA its stacks are sized by max_iterations.
            fw, fb = tf_functions(n, m, epsilon=eps, threshold=thr, max_iterations=max_it,
                                  implicit=implicit, jit_compile=implicit)
            t_fw, (_, iters) = time_tf(fw, (xt,), reps)
            t_fb, _ = time_tf(fb, (xt, vt), reps)
            name = "implicit, XLA" if implicit else "unrolled, graph (no XLA)"
            row = Row("scaling", name, batch, n, m, iteration_summary(iters), 1e3 * t_fw,
                      1e3 * t_fb)
            out.append(row)
            log(f"[scaling] n={n} m={m} {name}: iterations {row.iterations}, "
                f"fwd {row.forward_ms:.1f} ms, fwd+bwd {row.forward_backward_ms:.1f} ms")


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    """Resets the kernel's peak-RSS counter (VmHWM) of this process (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def memory_worker(spec: dict) -> dict:
    """Peak RSS growth of one forward+backward call, measured in a fresh process.

    Baseline: the resident set size after importing TensorFlow, creating the inputs,
    tracing the function and running a small unrelated op, with the kernel's peak-RSS
    counter reset there (/proc/self/clear_refs). Peak: VmHWM after the first
    forward+backward call, which includes XLA compilation (the same program for every
    iteration count, so differences between iteration counts are the solver's).
    Without /proc, falls back to ru_maxrss (then the import peak may mask small runs).
    """
    import tensorflow as tf

    batch, n, k = spec["batch"], spec["n"], spec["iterations"]
    x, v = make_problem(batch, n, 0)
    xt, vt = tf.constant(x), tf.constant(v)
    _ = tf.reduce_sum(tf.matmul(tf.ones([64, 64]), tf.ones([64, 64]))).numpy()
    _, fb = tf_functions(n, n, epsilon=spec["epsilon"], threshold=1e-30, max_iterations=k,
                         implicit=spec["implicit"], jit_compile=spec["xla"], warm_start=False,
                         check_every=1)
    use_proc = _reset_peak_rss() and _status_kb("VmHWM") is not None
    base = _status_kb("VmRSS") if use_proc else resource.getrusage(
        resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    _, grad, _, iters = fb(xt, vt)
    grad.numpy()
    elapsed = time.perf_counter() - start
    peak = _status_kb("VmHWM") if use_proc else resource.getrusage(
        resource.RUSAGE_SELF).ru_maxrss
    return dict(peak_mb=(peak - base) / 1024.0, iterations=int(np.max(iters.numpy())),
                first_call_s=elapsed, method="VmHWM" if use_proc else "ru_maxrss")


def run_memory(out: list[Row], log) -> None:
    batch, n = parse_pair(_MEMORY_CONFIG.value)
    for xla in (True, False) if _MEMORY_GRAPH_MODE.value else (True,):
        for implicit in (True, False):
            for k in _MEMORY_ITERATIONS.value:
                spec = dict(batch=batch, n=n, iterations=int(k), implicit=implicit, xla=xla,
                            epsilon=_EPSILON.value)
                cmd = [sys.executable, os.path.abspath(__file__), f"--worker={json.dumps(spec)}"]
                proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
                lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
                if proc.returncode != 0 or not lines:
                    log(f"[memory] worker failed: {proc.stderr[-2000:]}")
                    continue
                res = json.loads(lines[-1])
                name = (("implicit" if implicit else "unrolled") +
                        (", XLA" if xla else ", graph (no XLA)"))
                row = Row("memory", name, batch, n, n, str(res["iterations"]),
                          peak_memory_mb=res["peak_mb"])
                out.append(row)
                log(f"[memory] {name}, {res['iterations']} iterations: peak +"
                    f"{res['peak_mb']:.0f} MB")


def machine_description() -> str:
    model = "unknown CPU"
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in text.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores"


def main(argv):
    del argv
    if _WORKER.value:
        print(json.dumps(memory_worker(json.loads(_WORKER.value))))
        return
    if _OTT_WORKER.value:
        ott_worker(json.loads(_OTT_WORKER.value))
        return

    import tensorflow as tf

    def log(msg):
        print(msg, flush=True)

    versions = f"tensorflow {tf.__version__}, numpy {np.__version__}"
    if ott_available():
        versions += ", " + ott_version()
    log(f"machine: {machine_description()}; {versions}")
    log(f"problem: eps={_EPSILON.value}, threshold={_THRESHOLD.value}, squared cost, "
        f"uniform weights, x ~ U[0, 1], y = linspace(0, 1, m); median of {_REPEATS.value}")
    rows: list[Row] = []
    ratios: list[str] = []
    sections = set(_SECTIONS.value)
    if "compare" in sections:
        ratios = run_compare(rows, log)
    if "ablation" in sections:
        run_ablation(rows, log)
    if "scaling" in sections:
        run_scaling(rows, log)
    if "memory" in sections:
        run_memory(rows, log)

    columns = {
        "compare": ["method", "batch", "n", "iterations", "forward_ms", "forward_backward_ms",
                    "rank_error", "grad_error", "note"],
        "ablation": ["method", "batch", "n", "iterations", "forward_ms",
                     "forward_backward_ms", "rank_error"],
        "scaling": ["method", "batch", "n", "m", "iterations", "forward_ms",
                    "forward_backward_ms"],
        "memory": ["method", "batch", "n", "iterations", "peak_memory_mb"],
    }
    text = [f"machine: {machine_description()}; {versions}", ""]
    for section in ("compare", "ablation", "scaling", "memory"):
        section_rows = [r for r in rows if r.section == section]
        if section_rows:
            text += [f"### {section}", "", markdown_table(section_rows, columns[section]), ""]
    if ratios:
        text += ["Ratios (> 1: softsort_tf faster):", ""] + [f"- {r}" for r in ratios] + [""]
    report = "\n".join(text)
    print("\n" + report)
    if _MARKDOWN.value:
        with open(_MARKDOWN.value, "w") as fh:
            fh.write(report)
    if _CSV.value:
        with open(_CSV.value, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=[f.name for f in dataclasses.fields(Row)])
            writer.writeheader()
            for r in rows:
                writer.writerow(dataclasses.asdict(r))


if __name__ == "__main__":
    app.run(main)
