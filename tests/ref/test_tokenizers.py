#!/usr/bin/env python3
"""test_tokenizers: `pipewright tokenize` against Hugging Face `tokenizers`
(from .venv/, pinned in deploy/requirements-test.txt).

Tokenizers of each kind issue 34 names are trained here with `tokenizers`
itself on the example corpus, in each family's configuration:
  gpt2     byte-level BPE, GPT-2's pattern (ByteLevel with use_regex), plus
           a non-special added token and a special [MASK] with lstrip
  llama3   Split(Llama-3's pattern) + ByteLevel, ignore_merges, a template
           adding <|begin_of_text|>
  qwen2    NFC + Split(Qwen2's pattern) + ByteLevel, chat specials
  llama2   SentencePiece-style BPE with byte fallback (<0xNN> at ids 3..258),
           Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer, Llama-2's
           decoder (Replace, ByteFallback, Fuse, Strip), <s> template
  mistral  the same vocabulary as Mistral's newer files give it: Metaspace
           (prepend_scheme first, split false) and the Metaspace decoder
  gemma    Replace(" ", "▁") without Prepend, trained without a
           pre-tokenizer (so its tokens cross words and a text is one
           word), <pad> <eos> <bos> <unk> <mask>, the <bos> template
Each one: the ids of the whole corpus (a token file written with --out)
equal `tokenizers`' and decode back to the corpus; a set of tricky strings
(emoji, CJK, combining marks, numbers, runs of whitespace, special tokens
inline, the empty text) gives the same ids, with and without the
template, and decodes as `tokenizers` decodes them, with and without
skip_special_tokens. Files of kinds we do not read (WordPiece, Unigram, a
Lowercase normalizer) and text that is not UTF-8 are refused, naming the
field or the byte, and no output file is written. In a sanitized build
(PW_SANITIZE=ON) the corpus check takes its first 200 kB: there the point is
our memory, and the plain build holds the whole corpus."""
import json, os, shutil, subprocess, sys, tempfile, time

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

SRC = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
PW = None  # main() sets it from BUILD_DIR; bench/tokenizer_speed.py imports build() only
TEXT = open(os.path.join(SRC, "examples/data/corpus.txt"), encoding="utf-8").read()
LINES = TEXT.splitlines(keepends=True)
TMP = None
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
TRICKY = [
    "",
    "Hello, world! It's 2024 and I'll pay $1,234.56 - or 12345678 yen.",
    "emoji \U0001F600\U0001F389\U0001F44D\U0001F3FD family \U0001F468\u200d\U0001F469\u200d\U0001F467 flag \U0001F1EB\U0001F1F7",
    "CJK \u6f22\u5b57\u304b\u306a\u30ab\u30ca \ud55c\uad6d\uc5b4 \u4e2d\u6587\u6d4b\u8bd5",
    "combining: e\u0301 a\u0300 o\u0308 vs \u00e9 \u00e0 \u00f6, n\u0303, A\u030a \u212b",
    "numbers 1 12 123 1234 12345 3.14159 1e-9 \u0663\u0664\u0665 \u2460\u2461 \uff11\uff12",
    "whitespace  two   three    four\t\ttabs\n\nnewlines \n \r\n end   ",
    "   leading spaces and trailing   ",
    "\n\nstarts with newlines",
    " one leading space",
    "special inline: <|endoftext|>text<|im_start|>user\nhi<|im_end|> <s>x</s> a [MASK] b <mask> <bos><eos>",
    "<|begin_of_text|>Hello<|eot_id|> <unk> <pad>",
    "CAPS'S don'T I'M WE'LL THEY'VE it'd",
    "punctuation!!! ... ??? --- ((( ))) [[[ ]]] {{{ }}} \"quotes\" 'single'",
    "mixed: caf\u00e9 na\u00efve Stra\u00dfe \u0391\u0392\u0393 \u03a9\u03bc\u03ad\u03b3\u03b1 \u041f\u0440\u0438\u0432\u0435\u0442 "
    "\u05e2\u05d1\u05e8\u05d9\u05ea \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u0939\u093f\u0928\u094d\u0926\u0940",
    "\u2581 already metaspace \u2581\u2581 chars",
    "zero\u200bwidth\u200djoiner\ufeffbom \u00a0nbsp",
    "Mr. Darcy and Mr. Darcy's friend, Mr.  Darcy",
]
failures = []


def check(what, ok, detail=""):
    if not ok:
        failures.append(what)
        print("FAIL %s %s" % (what, detail[:600]))


def train(tok, lines, vocab, specials, alphabet=()):
    tr = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, initial_alphabet=list(alphabet),
                             show_progress=False)
    tok.train_from_iterator(lines, tr)


def with_bytes(tok, specials):
    """Llama-2's layout: the specials, then <0x00>..<0xFF>, then the learned tokens."""
    j = json.loads(tok.to_str())
    old = sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1])
    names = list(specials) + ["<0x%02X>" % b for b in range(256)]
    names += [t for t, _ in old if t not in names]
    j["model"]["vocab"] = {t: i for i, t in enumerate(names)}
    for a in j["added_tokens"]:
        a["id"] = j["model"]["vocab"][a["content"]]
    return Tokenizer.from_str(json.dumps(j))


def build():
    """Every kind of tokenizer, trained on the corpus: {name: Tokenizer}."""
    toks = {}
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.post_processor = processors.ByteLevel(trim_offsets=False)
    train(t, LINES, 1500, ["<|endoftext|>"], pre_tokenizers.ByteLevel.alphabet())
    t.add_tokens([AddedToken("Mr. Darcy", normalized=True)])
    t.add_special_tokens([AddedToken("[MASK]", lstrip=True, special=True)])
    toks["gpt2"] = t

    t = Tokenizer(models.BPE(ignore_merges=True))
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    train(t, LINES, 1500, ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"], pre_tokenizers.ByteLevel.alphabet())
    t.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      special_tokens=[("<|begin_of_text|>", t.token_to_id("<|begin_of_text|>"))])])
    toks["llama3"] = t

    t = Tokenizer(models.BPE())
    t.normalizer = normalizers.NFC()
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    t.post_processor = processors.ByteLevel(trim_offsets=False)
    train(t, LINES, 1500, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], pre_tokenizers.ByteLevel.alphabet())
    toks["qwen2"] = t

    # SentencePiece-style: trained on words as SentencePiece sees them (▁ first)
    sp = ["<unk>", "<s>", "</s>"]
    t = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    train(t, LINES, 1500, sp)
    t = with_bytes(t, sp)
    bos = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    l2 = Tokenizer.from_str(t.to_str())
    l2.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    l2.pre_tokenizer = None
    l2.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Strip(" ", 1, 0)])
    l2.post_processor = bos
    toks["llama2"] = l2
    mi = Tokenizer.from_str(t.to_str())
    mi.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    mi.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    mi.post_processor = bos
    toks["mistral"] = mi

    gs = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    t = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    t.normalizer = normalizers.Replace(" ", "\u2581")
    train(t, LINES[:4000], 1000, gs)
    t = with_bytes(t, gs)
    t.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    t.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    toks["gemma"] = t
    return toks


def pw(*args, stdin=None):
    return subprocess.run([PW, "tokenize", *args], input=stdin, capture_output=True)


def main():
    global PW, TMP
    PW = os.path.join(sys.argv[1], "pipewright")
    TMP = tempfile.mkdtemp(prefix="pw-tok-")
    t0 = time.time()
    toks = build()
    print("trained %d tokenizers in %.1f s" % (len(toks), time.time() - t0))
    corpus, text = os.path.join(SRC, "examples/data/corpus.txt"), TEXT
    if os.environ.get("PW_SANITIZE", "").upper() in ("ON", "1", "TRUE", "YES"):
        # under the sanitizers the point is our memory, not tokenizers' ids
        # again: the first 200 kB (the plain build holds the whole corpus)
        text = TEXT[:200000]
        corpus = os.path.join(TMP, "corpus-part.txt")
        with open(corpus, "w", encoding="utf-8") as f:
            f.write(text)
    for name, tok in toks.items():
        path = os.path.join(TMP, name + ".json")
        tok.save(path)
        # the whole corpus, through a token file
        out = os.path.join(TMP, name + ".tok")
        r = pw("--tokenizer", path, "--in", corpus, "--out", out)
        check(name + " corpus encode ran", r.returncode == 0, r.stderr.decode())
        t1 = time.time()
        want = tok.encode(text).ids
        t_hf = time.time() - t1
        raw = open(out, "rb").read() if r.returncode == 0 else b""
        width = int.from_bytes(raw[12:16], "little") if raw else 2
        got = [int.from_bytes(raw[i:i + width], "little") for i in range(32, len(raw), width)]
        if got != want:
            i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            check(name + " corpus ids", False, "%d ids against %d; first difference at %d: ours %s, tokenizers %s" %
                  (len(got), len(want), i, got[i:i + 8], want[i:i + 8]))
        check(name + " vocab_size", raw[16:20] == tok.get_vocab_size().to_bytes(4, "little"))
        back = os.path.join(TMP, name + ".txt")
        r = pw("--tokenizer", path, "--decode", "--skip-special", "--in", out, "--out", back)
        check(name + " corpus decode ran", r.returncode == 0, r.stderr.decode())
        text_back = open(back, encoding="utf-8").read() if r.returncode == 0 else None
        check(name + " corpus decodes back", text_back == text)
        r = pw("--tokenizer", path, "--decode", "--in", out)
        check(name + " corpus decodes as tokenizers does", r.stdout.decode() == tok.decode(want, skip_special_tokens=False))
        print("%-8s corpus: %d ids equal (tokenizers %.2f s), decoded back: %s" %
              (name, len(want), t_hf, text_back == text))
        tricky(name, tok, path)
    refusals(toks)
    print("test_tokenizers: %d tokenizers, %.1f s" % (len(toks), time.time() - t0))
    shutil.rmtree(TMP, ignore_errors=True)
    if failures:
        print("test_tokenizers: %d failures" % len(failures))
        sys.exit(1)
    print("test_tokenizers: ok")


def tricky(name, tok, path):
    """Each tricky string a document of --jsonl: ids with and without the
    template, then tokenizers' ids decoded with and without specials."""
    docs = "".join(json.dumps(t) + "\n" for t in TRICKY).encode()
    for add in (True, False):
        want = [tok.encode(t, add_special_tokens=add).ids for t in TRICKY]
        r = pw("--tokenizer", path, "--jsonl", *(() if add else ("--no-add-special",)), stdin=docs)
        got = [json.loads(l) for l in r.stdout.decode().splitlines()]
        check("%s tricky ran (add_special=%s)" % (name, add), r.returncode == 0 and len(got) == len(TRICKY), r.stderr.decode())
        for k, (g, w) in enumerate(zip(got, want)):
            check("%s tricky[%d] add_special=%s" % (name, k, add), g == w, "%r: ours %s, tokenizers %s" % (TRICKY[k], g, w))
    ids = [tok.encode(t).ids for t in TRICKY]
    for skip in (False, True):
        want = [tok.decode(i, skip_special_tokens=skip) for i in ids]
        r = pw("--tokenizer", path, "--decode", "--jsonl", *(("--skip-special",) if skip else ()),
               stdin="".join(json.dumps(i) + "\n" for i in ids).encode())
        got = [json.loads(l) for l in r.stdout.decode().splitlines()]
        check("%s tricky decode ran (skip=%s)" % (name, skip), r.returncode == 0 and len(got) == len(TRICKY), r.stderr.decode())
        for k, (g, w) in enumerate(zip(got, want)):
            check("%s tricky[%d] decode skip=%s" % (name, k, skip), g == w, "%r: ours %r, tokenizers %r" % (TRICKY[k], g, w))
    # one without --jsonl: the ids printed on a line
    r = pw("--tokenizer", path, stdin=TRICKY[10].encode())
    check("%s ids printed" % name, r.returncode == 0 and [int(x) for x in r.stdout.split()] == ids[10], r.stderr.decode())


def refusals(toks):
    out = os.path.join(TMP, "refused.tok")
    cases = []
    wp = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wp.train_from_iterator(LINES[:200], trainers.WordPieceTrainer(vocab_size=200, special_tokens=["[UNK]"],
                                                                  show_progress=False))
    cases.append(("WordPiece", wp, "model.type: WordPiece is not supported"))
    ug = Tokenizer(models.Unigram())
    ug.train_from_iterator(LINES[:200], trainers.UnigramTrainer(vocab_size=100, show_progress=False))
    cases.append(("Unigram", ug, "model.type: Unigram is not supported"))
    lc = Tokenizer.from_str(toks["gpt2"].to_str())
    lc.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()])
    cases.append(("Lowercase", lc, "normalizer.normalizers[1].type: Lowercase is not supported"))
    for what, tok, want in cases:
        path = os.path.join(TMP, "refused-%s.json" % what)
        tok.save(path)
        r = pw("--tokenizer", path, "--out", out, stdin=b"some text")
        err = r.stderr.decode()
        check("refuses %s" % what, r.returncode == 1 and want in err and not os.path.exists(out),
              "exit %d, stderr %r" % (r.returncode, err))
    r = pw("--tokenizer", os.path.join(TMP, "gpt2.json"), "--out", out, stdin=b"caf\xc3\xa9 \xff bad")
    err = r.stderr.decode()
    check("refuses bytes that are not UTF-8", r.returncode == 1 and "byte 6" in err and not os.path.exists(out), err)
    for args, words in ((("--in", "x"), "missing --tokenizer FILE"),
                        (("--tokenizer", "t.json", "--skip-special"), "--skip-special is for --decode"),
                        (("--tokenizer", "t.json", "--tokens"), "unknown option")):
        r = pw(*args)
        check("usage %s" % " ".join(args), r.returncode == 2 and words in r.stderr.decode(), r.stderr.decode())
    print("refused: %s, and text that is not UTF-8; bad usage exits 2" % ", ".join(c[0] for c in cases))


if __name__ == "__main__":
    main()
