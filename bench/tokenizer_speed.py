#!/usr/bin/env python3
"""tokenizer_speed.py: `pipewright tokenize` against Hugging Face `tokenizers` on
one thread, on the example corpus repeated, for every kind of tokenizer
tests/ref/test_tokenizers.py trains (the same training, the same files).

  .venv/bin/python bench/tokenizer_speed.py [--build DIR] [--repeat 8] [--rounds 5] [--out STEM]

Each round times both sides on the same text, interleaved (A B B A: ours
first on even rounds, theirs first on odd ones):
  ours    the wall time of `pipewright tokenize --tokenizer FILE --in TEXT
          --out TOKENS`: the process, reading the tokenizer.json and the
          text, encoding, writing and renaming the token file;
  theirs  Tokenizer.encode(text) in this process with RAYON_NUM_THREADS=1
          and TOKENIZERS_PARALLELISM=false: the encoding alone, the file
          and the text already in memory.
So the comparison counts everything on our side and only the encoding on
theirs. Both give the same ids (checked on the first round). The ratio of
a round is theirs / ours (above 1: we are faster); printed: the median over
rounds and the range of the rounds' ratios, with the load average. Needs
the test venv (deploy/venv.sh: tokenizers) and a Release build (default
build-release; it is made when missing). Writes results/tokenize/STEM.{json,md}
(default STEM: latest)."""
import argparse, json, os, statistics, subprocess, sys, tempfile, time

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers starts its pool
os.environ["TOKENIZERS_PARALLELISM"] = "false"
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
import test_tokenizers as tt  # noqa: E402  (the trained tokenizers)


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build-release"))
    ap.add_argument("--repeat", type=int, default=8, help="copies of the corpus in the text")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="latest")
    a = ap.parse_args()
    pw = os.path.join(a.build, "pipewright")
    if not os.path.exists(pw):
        subprocess.run(["cmake", "-S", ROOT, "-B", a.build, "-DCMAKE_BUILD_TYPE=Release", "-DPW_TESTS=OFF"], check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run(["cmake", "--build", a.build, "-j2", "--target", "pipewright"], check=True, stdout=subprocess.DEVNULL)
    tmp = tempfile.mkdtemp(prefix="pw-tokbench-")
    text = tt.TEXT * a.repeat
    path = os.path.join(tmp, "text.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    toks = tt.build()
    rows = []
    for name, tok in toks.items():
        tj = os.path.join(tmp, name + ".json")
        tok.save(tj)
        out = os.path.join(tmp, name + ".tok")
        ours, theirs, ratios, loads = [], [], [], []
        for r in range(a.rounds):
            for side in (("ours", "theirs") if r % 2 == 0 else ("theirs", "ours")):
                t0 = time.perf_counter()
                if side == "ours":
                    subprocess.run([pw, "tokenize", "--tokenizer", tj, "--in", path, "--out", out], check=True, env=env,
                                   stdout=subprocess.DEVNULL)
                    ours.append(time.perf_counter() - t0)
                else:
                    ids = tok.encode(text).ids
                    theirs.append(time.perf_counter() - t0)
            if r == 0:  # the same ids, or the timing means nothing
                raw = open(out, "rb").read()
                w = int.from_bytes(raw[12:16], "little")
                if [int.from_bytes(raw[i:i + w], "little") for i in range(32, len(raw), w)] != ids:
                    raise SystemExit(f"{name}: the ids differ from tokenizers'")
            ratios.append(theirs[-1] / ours[-1])
            loads.append(loadavg())
        mb = len(text.encode()) / 1e6
        row = {"tokenizer": name, "text_mb": round(mb, 2), "tokens": len(ids),
               "ours_s": [round(x, 4) for x in ours], "theirs_s": [round(x, 4) for x in theirs],
               "ours_mb_s": round(mb / statistics.median(ours), 2), "theirs_mb_s": round(mb / statistics.median(theirs), 2),
               "ratio_median": round(statistics.median(ratios), 2), "ratio_min": round(min(ratios), 2),
               "ratio_max": round(max(ratios), 2), "loadavg": [round(x, 2) for x in loads]}
        rows.append(row)
        print(f"{name:8s} ours {row['ours_mb_s']:6.2f} MB/s, tokenizers {row['theirs_mb_s']:6.2f} MB/s: "
              f"{row['ratio_median']:.2f}x ({row['ratio_min']:.2f}-{row['ratio_max']:.2f}), load {max(loads):.2f}",
              flush=True)
    import tokenizers
    meta = {"date": time.strftime("%Y-%m-%d"), "tokenizers": tokenizers.__version__, "repeat": a.repeat,
            "rounds": a.rounds, "cpu": open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(" \t:"),
            "nproc": os.cpu_count()}
    md = ["# pipewright tokenize against tokenizers %s, one thread" % tokenizers.__version__, "",
          "%s, %s (%d cores); the example corpus x %d, %d interleaved rounds. Ours: the whole command (process, "
          "load, read, encode, write the token file); theirs: `Tokenizer.encode` alone with RAYON_NUM_THREADS=1. "
          "Ratio = theirs / ours, median (range of rounds)." % (meta["date"], meta["cpu"], meta["nproc"], a.repeat,
                                                                a.rounds), "",
          "| tokenizer | MB | tokens | ours MB/s | tokenizers MB/s | ratio | range | max load |",
          "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append("| %s | %.1f | %d | %.2f | %.2f | %.2f | %.2f-%.2f | %.2f |" % (
            r["tokenizer"], r["text_mb"], r["tokens"], r["ours_mb_s"], r["theirs_mb_s"], r["ratio_median"], r["ratio_min"],
            r["ratio_max"], max(r["loadavg"])))
    d = os.path.join(HERE, "results", "tokenize")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, a.out + ".json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    with open(os.path.join(d, a.out + ".md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    subprocess.run(["rm", "-rf", tmp])


if __name__ == "__main__":
    main()
