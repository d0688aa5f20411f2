"""hf_common: what the transformers references share (hf_ref.py, hf_ref_v5.py):
the ok/FAIL lines, running pipewright, both sides' logits and the comparisons.

    import hf_common as hc
    hc.setup(PW, SRC)           # pipewright's path and the directory it runs in
    hc.check(ok, "what")        # prints the line; a failure lands in hc.failures
"""
import subprocess

import torch
from safetensors.torch import load_file

failures = []
_pw, _src = None, None


def setup(pw_path, src):
    global _pw, _src
    _pw, _src = pw_path, src


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def pw(*args, ok=True):
    """pipewright ARGS in the source directory; a failure ends the run unless ok=False."""
    r = subprocess.run([_pw, *args], capture_output=True, text=True, cwd=_src)
    if ok and r.returncode != 0:
        print(r.stdout + r.stderr)
        raise SystemExit(f"FAILED: pipewright {' '.join(args)}")
    return r


def hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def pw_logits(job, ckpt, ids, out):
    pw("generate", "--job", job, "--checkpoint", ckpt, "--prompt-tokens", ",".join(map(str, ids)),
       "--max-tokens", "1", "--logits", out)
    return load_file(out)["logits"]


def rel(a, b):
    """max |a - b| over max |b|."""
    return float((a - b).abs().max() / b.abs().max())


def same_tensors(a, b):
    """Two safetensors files hold the same names, dtypes and bits."""
    ta, tb = load_file(a), load_file(b)
    return sorted(ta) == sorted(tb) and all(
        ta[k].dtype == tb[k].dtype and torch.equal(ta[k].view(torch.int32), tb[k].view(torch.int32)) for k in ta)
