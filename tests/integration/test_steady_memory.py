#!/usr/bin/env python3
"""test_steady_memory: once a pipeline runs, a step touches no page it has
not touched before, on any rank.

Real pipewright-worker processes on 127.0.0.1 driven by driver.py, which
samples each worker's minor page faults, VmRSS and VmData from /proc as each
step report arrives. A GPT (d 128, 8 layers, T 64, 16 sequences in 8
microbatches: ~0.1 s steps, so heartbeats come in mid-run) at pp 2 under
1f1b, zb-h1, interleaved-1f1b and dualpipev (V 2) and at pp 4 under
dualpipev, 12 steps each, in-memory
snapshots on (the default: every rank copies and sends its state each step)
and every step traced: from the report of the third step to that of the
eleventh (steps count from 0: 2 to 10; the twelfth also writes the
checkpoint and ends the run) every rank's fault count and VmRSS and VmData
are unchanged. What this caught: a heartbeat in mid-run read /proc/self/fd
through opendir's malloc'd buffer, from a heap the run's arenas had grown
(fresh pages), and a step report printing a double smaller than any before
took a new page of the loop thread's stack (worker/ctl.c, worker/main.c).

Under AddressSanitizer the allocator keeps freed memory in quarantine and
its shadow grows with what is touched: the figures are printed, not
asserted. Usage: test_steady_memory.py BUILD_DIR SOURCE_DIR"""
import os, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_pipeline import Suite, job  # noqa: E402

STEPS, FROM, TO = 12, 2, 10  # steps (from 0) whose reports bound the steady part


def main():
    build, src = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    sanitized = os.environ.get("PW_SANITIZE", "OFF") == "ON"
    with tempfile.TemporaryDirectory(prefix="pw-steady-") as tmp:
        t = Suite(build, src, tmp)
        for name, pp, V in (("1f1b", 2, 1), ("zb-h1", 2, 1), ("interleaved-1f1b", 2, 2), ("dualpipev", 2, 2),
                            ("dualpipev", 4, 2)):
            label = f"{name}-pp{pp}"
            spec = job(name, pp, V, 8, steps=STEPS, layers=8)
            # steps of ~0.1 s: the run outlasts a few of the workers' 0.5 s heartbeats
            spec["model"].update(d_model=128, seq_len=64, n_heads=4)
            spec["train"]["batch_size"] = 16
            p, res, _ = t.drive(label, spec)
            if not t.check(f"{label}: run completes", p.returncode == 0 and res is not None and
                           len(res["done"]) == pp, (p.stdout + p.stderr)[-400:]):
                continue
            rows, ok = [], True
            for r in range(pp):
                mem = res.get("mem", {}).get(str(r), {})
                a, b = mem.get(str(FROM)), mem.get(str(TO))
                if not a or not b:
                    ok = False
                    rows.append(f"rank {r}: no samples at steps {FROM} and {TO}")
                    continue
                d = [y - x for x, y in zip(a, b)]
                ok &= d == [0, 0, 0]
                rows.append(f"rank {r}: {d[0]} faults, VmRSS {d[1]:+d} B, VmData {d[2]:+d} B")
            line = f"steps {FROM}-{TO}: " + "; ".join(rows)
            print(f"note {label}: {line}", flush=True)
            if not sanitized:
                t.check(f"{label}: no page faults, no VmRSS or VmData growth in steps {FROM}-{TO} on any rank", ok,
                        line)
        print(f"{t.passed} passed, {t.failed} failed")
        return 1 if t.failed else 0


if __name__ == "__main__":
    sys.exit(main())
