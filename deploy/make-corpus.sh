#!/usr/bin/env bash
# make-corpus: rebuild examples/data/corpus.txt from Debian's r-cran-janeaustenr.
#
# The package ships Jane Austen's novels (public domain; packaging MIT) as an
# R lazy-load database. This script fetches the .deb with `apt-get download`
# (no R needed), unpacks it, and decodes the two novels we use with a small
# reader of R's XDR serialization format written against the Python standard
# library. Output: "Pride and Prejudice", a blank line, then "Persuasion",
# lines joined with "\n" (R's NA lines become empty lines).
#
# Usage: deploy/make-corpus.sh [OUT]   (default examples/data/corpus.txt)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$here/examples/data/corpus.txt}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# apt-get warns that it downloads "unsandboxed as root" into a private folder: harmless.
(cd "$tmp" && apt-get download r-cran-janeaustenr 2>&1 >/dev/null | grep -v unsandboxed >&2 || true)
ls "$tmp"/r-cran-janeaustenr_*.deb >/dev/null
dpkg-deb -x "$tmp"/r-cran-janeaustenr_*.deb "$tmp/x"
data="$tmp/x/usr/lib/R/site-library/janeaustenr/data"

python3 - "$data" "$out" prideprejudice persuasion <<'PY'
import gzip, struct, sys, zlib

class Vec(list):
    attrs = None

class Reader:
    """R serialization, XDR ("X\n") format, versions 2 and 3: enough for
    character vectors, lists, pairlists and their attributes."""
    def __init__(self, b):
        self.b, self.p, self.refs = b, 0, []
    def int(self):
        v = struct.unpack_from('>i', self.b, self.p)[0]
        self.p += 4
        return v
    def load(self):
        if self.b[:2] != b'X\n':
            raise SystemExit('not an XDR serialization')
        self.p = 2
        version = self.int(); self.int(); self.int()
        if version == 3:
            n = self.int()  # native encoding name
            self.p += n
        return self.item()
    def length(self):
        n = self.int()
        if n == -1:
            hi, lo = self.int(), self.int()
            n = (hi << 32) + lo
        return n
    def item(self):
        f = self.int()
        t, has_attr, has_tag = f & 0xFF, f & (1 << 9), f & (1 << 10)
        if t == 254:                       # NILVALUE
            return None
        if t in (253, 252, 251, 250, 242, 241):
            return ('special', t)
        if t == 255:                       # REFSXP
            k = f >> 8 or self.int()
            return self.refs[k - 1]
        if t == 1:                         # SYMSXP
            v = ('sym', self.item()); self.refs.append(v); return v
        if t == 4:                         # ENVSXP
            self.int(); e = ('env',); self.refs.append(e)
            for _ in range(4): self.item()
            return e
        if t in (2, 3, 5, 6, 17, 239, 240):  # pairlist-like
            a = self.item() if has_attr else None
            tag = self.item() if has_tag else None
            return ('pair', tag, self.item(), self.item(), a)
        if t == 9:                         # CHARSXP
            n = self.int()
            if n == -1: return None
            v = self.b[self.p:self.p + n]; self.p += n
            return v.decode('utf-8')
        n = self.length()
        if t in (10, 13):
            v = Vec(struct.unpack_from('>%di' % n, self.b, self.p)); self.p += 4 * n
        elif t == 14:
            v = Vec(struct.unpack_from('>%dd' % n, self.b, self.p)); self.p += 8 * n
        elif t in (16, 19, 20):
            v = Vec(self.item() for _ in range(n))
        else:
            raise SystemExit('unsupported SEXP type %d' % t)
        if has_attr:
            v.attrs = self.item()
        return v

def names(v):
    x = v.attrs
    while x is not None and x[0] == 'pair':
        if x[1] == ('sym', 'names'):
            return list(x[2])
        x = x[3]
    raise SystemExit('no names attribute')

data, out, wanted = sys.argv[1], sys.argv[2], sys.argv[3:]
with open(data + '/Rdata.rdx', 'rb') as f:
    index = Reader(gzip.decompress(f.read())).load()
variables = index[0]
table = dict(zip(names(variables), variables))
with open(data + '/Rdata.rdb', 'rb') as f:
    rdb = f.read()
parts = []
for name in wanted:
    off, length = table[name]
    chunk = rdb[int(off):int(off) + int(length)]
    lines = Reader(zlib.decompress(chunk[4:])).load()   # 4-byte length, then zlib
    parts.append('\n'.join(l if l is not None else '' for l in lines).strip('\n') + '\n')
with open(out, 'w', encoding='utf-8') as f:
    f.write('\n'.join(parts))
PY
echo "wrote $out ($(wc -c <"$out") bytes)"
