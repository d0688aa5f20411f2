#!/usr/bin/env python3
"""test_tp_matrix: issue 17's tensor-parallel matrix on real
pipewright-worker processes on 127.0.0.1 (driver.py plays the coordinator),
each job against `pipewright train` of the same job at tp = 1.

  - pp x dp x tp in 1x1x2, 2x1x2, 1x2x2, 2x2x2, 4x1x2 x interleaved-1f1b,
    zb-h1, dualpipev x gpt untied, gpt tied, llama: all 45 jobs, SGD with
    momentum, 3 steps. V = 2 for interleaved-1f1b and DualPipeV, also at
    pp 1 (the planner runs both there); at pp 4 the model has 8 layers and 8
    microbatches: with 4 layers the planner refuses interleaved pp 4 (4
    blocks cannot fill 8 stages) and with 4 microbatches DualPipeV (it needs
    2·pp): both refusals are checked to name their rule;
  - per job: every worker's tp all-reduce bytes per step equal the plan's;
    every step's loss equals the tp = 1 run's to 1e-5 relative; every final
    tensor (the checkpoint the tp groups gather, in tp = 1 names and shapes)
    to 1e-4 elementwise scaled by the tensor's largest value (max|a-b| /
    max|b|), and its relative norm difference ||a-b|| / ||b|| to 1e-6.
    Measured: losses <= 2.3e-8, scaled <= 4.1e-7, norm <= 2.7e-7 (tp's
    partial sums round differently; nothing is amplified);
  - AdamW, one job per mesh (schedule and model rotating). AdamW divides each
    gradient element by its own running size, so an element whose exact
    gradient is ~0 (the keys' bias: softmax ignores a shift of a query's
    scores) moves by ~lr per step on rounding noise alone, and any change of
    summation order changes that noise: per tensor, rel norms reach 1.1e-4
    (the keys' bias, an MLP projection), and the same tp = 1 job run with
    another OpenBLAS kernel (OPENBLAS_CORETYPE Sandybridge, or Haswell where
    Sandybridge is the kernel in use; run here) moves them as far: 9e-5.
    So AdamW asserts what noise cannot reach and a wrong sum would: the
    losses to 1e-5; the whole model's relative norm difference (every
    tensor's elements together) to 1e-5 and to at most 10x the kernel
    change's of the same job; every element to 1e-4 (absolute). Measured:
    whole model <= 3.8e-6, 0.5-3.3x the kernel change's; elements <= 6.1e-5;
  - one tp 4 job (1x1x4, gpt with 4 heads) under zb-h1, as the SGD jobs;
    a tp 4 job on a 2-head model is refused naming mesh.tp and the rule.
Prints each job's figures (losses' largest relative difference; weights'
largest absolute, scaled and per-tensor relative norm difference and the
whole model's; for AdamW the kernel change's) and the largest of each at
the end. Usage: BUILD_DIR SOURCE_DIR [--only LABEL-PART]"""
import ctypes, json, os, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
import numpy as np  # noqa: E402
import st  # noqa: E402
import test_tensor_parallel as tpt  # noqa: E402

MESHES = ((1, 1, 2), (2, 1, 2), (1, 2, 2), (2, 2, 2), (4, 1, 2))
SCHEDULES = ("interleaved-1f1b", "zb-h1", "dualpipev")
MODELS = (("gpt", False), ("gpt", True), ("llama", False))
SGD = {"name": "sgd", "lr": 0.05, "momentum": 0.9, "warmup_steps": 2, "weight_decay": 0.01}
ADAMW = {"name": "adamw", "lr": 3e-3, "warmup_steps": 2, "weight_decay": 0.1}
LOSS_TOL, SCALED_TOL, NORM_TOL_SGD = 1e-5, 1e-4, 1e-6             # SGD (and every job's losses)
NORM_TOL_ADAMW, ABS_TOL_ADAMW, NOISE_FACTOR = 1e-5, 1e-4, 10.0      # AdamW: see the docstring


def spec(sched, pp, dp, tp, model="gpt", tied=False, opt=SGD, heads=2, layers=None, m=None):
    layers = layers or (8 if pp == 4 else 4)
    m = m or max(2, 2 * pp)
    mdl = {"template": model, "vocab_size": 256, "seq_len": 16, "d_model": 32, "n_layers": layers, "n_heads": heads}
    if model == "gpt":
        mdl["tie_embeddings"] = tied
    V = 1 if sched == "zb-h1" else 2
    return {"name": f"tpm-{sched}", "model": mdl, "mesh": {"pp": pp, "dp": dp, "tp": tp, "virtual_stages": V},
            "schedule": {"name": sched, "microbatches": m},
            "train": {"steps": 3, "batch_size": m * dp * 2, "seed": 3, "grad_clip": 1.0, "snapshot_every": 0,
                      "optimizer": opt},
            "data": {"kind": "text", "path": "examples/data/corpus.txt", "sampler": "sequential"}}


def blas_core(env):
    """The OpenBLAS kernel a process started with env gets (OPENBLAS_CORETYPE, else the CPU's)."""
    code = ("import ctypes; l = ctypes.CDLL('libopenblas.so.0'); l.openblas_get_corename.restype = ctypes.c_char_p; "
            "print(l.openblas_get_corename().decode())")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env).stdout.strip()


def other_kernel():
    """(an OPENBLAS_CORETYPE, the kernel it gives, the kernel this environment gives), the first two differing
    from the third: every x86-64 OpenBLAS built with DYNAMIC_ARCH has Sandybridge and Haswell kernels; Nones
    when neither changes the kernel."""
    ctypes.CDLL("libopenblas.so.0")  # fail loudly here if the library is missing
    mine = blas_core(os.environ)
    for want in ("SandyBridge", "Haswell"):
        got = blas_core(dict(os.environ, OPENBLAS_CORETYPE=want))
        if got and got != mine:
            return want, got, mine
    return None, None, mine


def diffs(got, ref):
    """{max_abs, scaled (largest per-tensor max|a-b| / max|b|), norm (largest per-tensor ||a-b|| / ||b||),
    model (||a-b|| / ||b|| over every tensor), where} or None when names or shapes differ."""
    if sorted((k, np.shape(v)) for k, v in got.items()) != sorted((k, np.shape(v)) for k, v in ref.items()):
        return None
    out = {"max_abs": 0.0, "scaled": 0.0, "norm": 0.0, "where": {}}
    dd = ww = 0.0
    for k in sorted(ref):
        x, y = np.asarray(got[k], np.float64), np.asarray(ref[k], np.float64)
        d = np.abs(x - y)
        dd, ww = dd + float(np.sum(d * d)), ww + float(np.sum(y * y))
        for key, v in (("max_abs", float(d.max())), ("scaled", float(d.max() / (np.abs(y).max() + 1e-30))),
                       ("norm", float(np.linalg.norm(d) / (np.linalg.norm(y) + 1e-30)))):
            if v > out[key]:
                out[key], out["where"][key] = v, k
    out["model"] = (dd / ww) ** 0.5
    return out


class Matrix(tpt.Run):
    def __init__(self, build, src, tmp):
        super().__init__(build, src, tmp)
        self.refs = {}
        zero = {"max_abs": 0.0, "scaled": 0.0, "norm": 0.0, "model": 0.0}
        self.worst = {"loss": 0.0, "sgd": dict(zero), "adamw": dict(zero), "noise": dict(zero), "ratio": 0.0}
        self.alt, self.alt_core, self.core = other_kernel()
        self.only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None  # while debugging

    def reference(self, sp, env=None):
        """`pipewright train` of sp at tp 1 ((losses by step, final tensors)); the pipeline shape and
        schedule do not change its arithmetic, so jobs differing only in those share one."""
        s = json.loads(json.dumps(sp))
        s["mesh"]["tp"] = 1
        key = json.dumps([s["model"], s["mesh"]["dp"], s["schedule"]["microbatches"], s["train"], env])
        if key not in self.refs:
            d = os.path.join(self.tmp, f"ref{len(self.refs)}")
            os.makedirs(d)
            path = os.path.join(d, "job.json")
            json.dump(s, open(path, "w"))
            subprocess.run([os.path.join(self.build, "pipewright"), "train", "--job", path, "--quiet", "--log-json",
                            os.path.join(d, "ref.jsonl"), "--out", os.path.join(d, "ref.safetensors")],
                           check=True, cwd=self.src, env=dict(os.environ, **env) if env else None)
            log = {e["step"]: e["loss"] for e in map(json.loads, open(os.path.join(d, "ref.jsonl")))}
            self.refs[key] = (log, st.load(os.path.join(d, "ref.safetensors"))[0])
        return self.refs[key]

    def case(self, label, sp):
        if self.only and self.only not in label:
            return
        t0 = time.monotonic()
        res, out = self.drive(label, sp)
        if not res or not self.t.check(f"{label}: the tp groups gathered a final checkpoint", bool(res.get("merged"))):
            return
        self.check_bytes(label, res, out, sp)
        log, ref_w = self.reference(sp)
        loss = max(abs(res["losses"].get(str(k), float("inf")) - v) / abs(v) for k, v in log.items())
        d = diffs(st.load(res["merged"])[0], ref_w)
        if not self.t.check(f"{label}: the gathered checkpoint has the tp = 1 names and shapes", d is not None):
            return
        adam = sp["train"]["optimizer"]["name"] == "adamw"
        w = self.worst["adamw" if adam else "sgd"]
        self.worst["loss"] = max(self.worst["loss"], loss)
        for k in w:
            w[k] = max(w[k], d[k])
        figures = (f"losses {loss:.2e}; weights max abs {d['max_abs']:.2e} ({d['where'].get('max_abs', '-')}), "
                   f"scaled {d['scaled']:.2e}, rel norm {d['norm']:.2e} ({d['where'].get('norm', '-')}), "
                   f"whole model {d['model']:.2e}")
        if not adam:
            self.t.check(f"{label}: losses (1e-5), every tensor scaled (1e-4) and rel norm (1e-6) equal tp = 1's",
                         loss <= LOSS_TOL and d["scaled"] <= SCALED_TOL and d["norm"] <= NORM_TOL_SGD,
                         figures + f" [{time.monotonic() - t0:.1f} s]")
            return
        if not self.t.check(f"{label}: another OpenBLAS kernel to measure tp = 1's noise with", self.alt is not None,
                            "" if self.alt else f"only {self.core}"):
            return
        _, alt_w = self.reference(sp, {"OPENBLAS_CORETYPE": self.alt})
        noise = diffs(alt_w, ref_w)
        for k in ("max_abs", "model"):
            self.worst["noise"][k] = max(self.worst["noise"][k], noise[k])
        self.worst["ratio"] = max(self.worst["ratio"], d["model"] / noise["model"])
        self.t.check(f"{label}: losses (1e-5), whole model rel norm (1e-5, and <= {NOISE_FACTOR:g}x the kernel "
                     f"change's) and elementwise (1e-4) equal tp = 1's",
                     loss <= LOSS_TOL and d["model"] <= NORM_TOL_ADAMW and d["max_abs"] <= ABS_TOL_ADAMW and
                     d["model"] <= NOISE_FACTOR * noise["model"],
                     figures + f"; kernel {self.alt_core} vs {self.core} at tp 1: max abs {noise['max_abs']:.2e}, rel "
                     f"norm {noise['norm']:.2e} ({noise['where'].get('norm', '-')}), whole model {noise['model']:.2e} "
                     f"[{time.monotonic() - t0:.1f} s]")

    def refused(self, label, sp, want):
        path = os.path.join(self.tmp, f"refuse-{label}.json")
        json.dump(sp, open(path, "w"))
        p = subprocess.run([os.path.join(self.build, "pipewright"), "plan", "--job", path, "--json"],
                           capture_output=True, text=True, cwd=self.src)
        self.t.check(f"{label}: the plan is refused naming the rule", p.returncode != 0 and want in p.stderr,
                     p.stderr.strip()[-300:])


def main():
    build, src = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pw-tpm-") as tmp:
        r = Matrix(build, src, tmp)
        for pp, dp, tp in MESHES:
            for sched in SCHEDULES:
                for model, tied in MODELS:
                    r.case(f"{pp}x{dp}x{tp}-{sched}-{model}{'-tied' if tied else ''}",
                           spec(sched, pp, dp, tp, model, tied))
        for i, (pp, dp, tp) in enumerate(MESHES):
            sched, (model, tied) = SCHEDULES[i % 3], MODELS[(i + 1) % 3]
            r.case(f"adamw-{pp}x{dp}x{tp}-{sched}-{model}{'-tied' if tied else ''}",
                   spec(sched, pp, dp, tp, model, tied, opt=ADAMW))
        r.case("1x1x4-zb-h1-gpt", spec("zb-h1", 1, 1, 4, heads=4))
        r.refused("4x1x2-interleaved-1f1b-4-layers", spec("interleaved-1f1b", 4, 1, 2, layers=4),
                  "mesh.pp: even partition: 4 blocks cannot fill 8 stages")
        r.refused("4x1x2-dualpipev-m4", spec("dualpipev", 4, 1, 2, m=4),
                  "schedule.microbatches: dualpipev needs microbatches >= 2*pp")
        r.refused("1x1x4-2-heads", spec("zb-h1", 1, 1, 4), "mesh.tp: must divide model.n_heads")
        w = r.worst
        fig = lambda x: ", ".join(f"{k} {x[k]:.2e}" for k in ("max_abs", "scaled", "norm", "model"))  # noqa: E731
        print(f"largest differences from tp = 1: losses {w['loss']:.2e} relative; weights, SGD: {fig(w['sgd'])}; "
              f"AdamW: {fig(w['adamw'])}; the kernel change at tp 1 (AdamW jobs): max_abs "
              f"{w['noise']['max_abs']:.2e}, model {w['noise']['model']:.2e}; tp / kernel change whole-model ratio "
              f"up to {w['ratio']:.2f}; {time.monotonic() - t0:.0f} s")
        print(f"{r.t.passed} passed, {r.t.failed} failed")
        return 1 if r.t.failed else 0


if __name__ == "__main__":
    sys.exit(main())
