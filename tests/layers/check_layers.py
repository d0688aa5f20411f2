#!/usr/bin/env python3
"""check_layers: the layering that common/CMakeLists.txt declares holds in the code.

  check_layers.py SOURCE_DIR [BUILD_DIR]
  check_layers.py --plant BUILD_DIR   proves rule 4 fails on a circle planted
                                      among the worker's real objects

1. Every quoted #include in common/LAYER/ names a header of LAYER itself or of a
   layer in its DEPS (direct, as declared: a layer says what it uses).
2. An outside library's header (<jansson.h>, <cblas.h>, ...) appears only in
   a layer whose SYSTEM names that library, and never in a public header of
   a layer that must stay free of it (compute and model headers: no jansson).
3. The layer graph has no cycle, and no header includes itself through others.
4. With BUILD_DIR: no two object files of the coordinator, of the worker,
   or of one layer of common/, need symbols from each other, directly or
   around a longer circle (read from `nm` of the built objects).
5. struct pw_run (worker/run.h) keeps at most PW_RUN_FIELDS_MAX fields,
   its sh, cp and lp parts counted: a run's state that is not the whole
   run's belongs to a subsystem of its own.
6. No coordinator file writes an HTTP error status of its own: every error
   reply goes through pw_reply_error(code), whose status and API code come
   from common/base/errors.h's table.
Exit 0 when all hold; otherwise each violation on a line, exit 1."""
import glob, os, re, subprocess, sys

SYSTEM_HEADERS = {  # header -> the CMake target that provides it
    "jansson.h": "PkgConfig::JANSSON", "cblas.h": "PkgConfig::OPENBLAS",
    "uv.h": "PkgConfig::LIBUV", "microhttpd.h": "PkgConfig::MHD",
    "sqlite3.h": "PkgConfig::SQLITE", "curl/curl.h": "PkgConfig::CURL",
    "dnnl.h": "PW::dnnl", "pcre2.h": "PkgConfig::PCRE2", "utf8proc.h": "PkgConfig::UTF8PROC",
}
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)


def layers(src):
    text = open(os.path.join(src, "common/CMakeLists.txt")).read()
    out = {}
    for m in re.finditer(r"^pw_layer\((\w+)([^)]*)\)", text, re.M):
        deps, system, cur = [], [], None
        for w in m.group(2).split():
            if w in ("DEPS", "SYSTEM"):
                cur = w
            elif cur == "DEPS":
                deps.append(w)
            elif cur == "SYSTEM":
                system.append(w)
        out[m.group(1)] = (deps, system)
    return out


def find_cycle(graph):
    """A cycle in {node: [node]} as a list, or None."""
    state, stack = {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                c = visit(m)
                if c:
                    return c
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            c = visit(n)
            if c:
                return c
    return None


def check_sources(src):
    errs = []
    decl = layers(src)
    if not decl:
        return ["common/CMakeLists.txt declares no pw_layer"]
    owner = {}  # header file name -> layer
    for layer in decl:
        for h in glob.glob(os.path.join(src, "common", layer, "*.h")):
            name = os.path.basename(h)
            if name in owner:
                errs.append(f"header {name} is in both common/{owner[name]} and common/{layer}")
            owner[name] = layer
    for layer, (deps, system) in decl.items():
        for d in deps:
            if d not in decl:
                errs.append(f"common/CMakeLists.txt: {layer} depends on unknown layer {d}")
    cyc = find_cycle({l: d for l, (d, _) in decl.items()})
    if cyc:
        errs.append("layer cycle: " + " -> ".join(cyc))
    header_graph = {}
    for layer, (deps, system) in decl.items():
        files = sorted(glob.glob(os.path.join(src, "common", layer, "*.[ch]")))
        if not files:
            errs.append(f"common/{layer}/ has no source")
        for f in files:
            rel = os.path.relpath(f, src)
            text = open(f).read()
            for kind, inc in INCLUDE.findall(text):
                if kind == '"':
                    to = owner.get(os.path.basename(inc))
                    if to is None:
                        errs.append(f"{rel}: includes \"{inc}\", which no layer of common/ has")
                    elif to != layer and to not in deps:
                        errs.append(f"{rel}: includes \"{inc}\" of layer {to}, "
                                    f"which {layer} does not list in DEPS")
                    if f.endswith(".h"):
                        header_graph.setdefault(os.path.basename(f), []).append(os.path.basename(inc))
                elif inc in SYSTEM_HEADERS and SYSTEM_HEADERS[inc] not in system:
                    errs.append(f"{rel}: includes <{inc}>, but {layer} does not list "
                                f"{SYSTEM_HEADERS[inc]} in SYSTEM")
    # The public headers of the layers below the JSON and BLAS boundary.
    for layer in ("base", "model", "compute"):
        for h in glob.glob(os.path.join(src, "common", layer, "*.h")):
            seen, todo = set(), [os.path.basename(h)]
            while todo:
                n = todo.pop()
                if n in seen:
                    continue
                seen.add(n)
                lay = owner.get(n)
                if lay is None:
                    continue
                text = open(os.path.join(src, "common", lay, n)).read()
                for kind, inc in INCLUDE.findall(text):
                    if kind == '"':
                        todo.append(os.path.basename(inc))
                    elif inc == "jansson.h":
                        errs.append(f"common/{layer}/{os.path.basename(h)} pulls in <jansson.h> (through {n})")
    cyc = find_cycle(header_graph)
    if cyc:
        errs.append("include cycle: " + " -> ".join(cyc))
    return errs


ERROR_STATUS = re.compile(r"MHD_HTTP_(BAD_REQUEST|UNAUTHORIZED|FORBIDDEN|NOT_FOUND|METHOD_NOT_ALLOWED|CONFLICT|"
                          r"CONTENT_TOO_LARGE|PAYLOAD_TOO_LARGE|URI_TOO_LONG|UNPROCESSABLE_ENTITY|"
                          r"UNPROCESSABLE_CONTENT|TOO_MANY_REQUESTS|INTERNAL_SERVER_ERROR|SERVICE_UNAVAILABLE)")


def check_error_statuses(src):
    errs = []
    for f in sorted(glob.glob(os.path.join(src, "coordinator", "*.c"))):
        for n, line in enumerate(open(f), 1):
            m = ERROR_STATUS.search(line)
            if m:
                errs.append(f"{os.path.relpath(f, src)}:{n}: {m.group(0)} written by hand "
                            "(reply with pw_reply_error(PW_E...): the status comes from errors.h)")
    return errs


def symbols(obj):
    out = subprocess.run(["nm", "--defined-only", "-g", obj], capture_output=True, text=True).stdout
    defined = {l.split()[-1] for l in out.splitlines() if len(l.split()) >= 3}
    out = subprocess.run(["nm", "-u", obj], capture_output=True, text=True).stdout
    undefined = {l.split()[-1] for l in out.splitlines() if l.strip()}
    return defined, undefined


def check_objects(build, target):
    objs = sorted(glob.glob(os.path.join(build, "CMakeFiles", target + ".dir", "*", "*.o")) +
                  glob.glob(os.path.join(build, "CMakeFiles", target + ".dir", "*.o")))
    if not objs:
        return [f"{build}: no object files of {target} (build it first)"]
    defs, undef = {}, {}
    for o in objs:
        name = os.path.basename(o)[:-len(".c.o")]
        defs[name], undef[name] = symbols(o)
    graph = {}
    for a in defs:
        for b in defs:
            if a != b and undef[a] & defs[b]:
                graph.setdefault(a, []).append(b)
    cyc = find_cycle(graph)
    if not cyc:
        return []
    why = []
    for a, b in zip(cyc, cyc[1:]):
        why.append(f"{a}.c uses {', '.join(sorted(undef[a] & defs[b])[:3])} of {b}.c")
    return [f"{target}: files call each other in a circle: " + " -> ".join(cyc) + " (" + "; ".join(why) + ")"]


def struct_body(text, start):
    """The text between the brace at or after start and its match."""
    i = text.index("{", start)
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j]
    raise ValueError("unbalanced braces")


def count_fields(body):
    """Declarations at the top level of a struct body: a nested struct is
    one, `int a, b;` two."""
    n, depth, decl = 0, 0, ""
    for ch in body:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == ";" and depth == 0:
            flat = re.sub(r"\([^()]*\)", "()", decl)  # a function pointer's parameters
            n += flat.count(",") + 1
            decl = ""
            continue
        elif depth == 0:
            decl += ch
    return n


def check_run_fields(src):
    text = re.sub(r"/\*.*?\*/", "", open(os.path.join(src, "worker", "run.h")).read(), flags=re.S)
    m = re.search(r"#define PW_RUN_FIELDS_MAX (\d+)", text)
    if not m:
        return ["worker/run.h: no PW_RUN_FIELDS_MAX"]
    counts = {"pw_run": count_fields(struct_body(text, text.index("struct pw_run {")))}
    for part in ("pw_run_shared", "pw_run_compute", "pw_run_loop"):
        end = text.index("} %s;" % part)
        start = text.rindex("typedef struct {", 0, end)
        counts[part] = count_fields(struct_body(text, start))
    total = sum(counts.values())
    if total > int(m.group(1)):
        return [f"worker/run.h: struct pw_run has {total} fields ({counts}), more than PW_RUN_FIELDS_MAX "
                f"{m.group(1)}: give the new state to a subsystem"]
    return []


PLANT = r"""
/* slots.c's functions, as a stub that also starts the compute thread:
 * slots -> exec, while exec -> slots. */
void pw_exec_main(void *arg);
int pw_run_slot_for(void) { pw_exec_main(0); return 0; }
void pw_run_slot_release(void) {}
void pw_run_slot_sent(void) {}
int pw_run_producer(void) { return 0; }
int pw_run_consumer(void) { return 0; }
"""


def plant(build):
    """The worker's objects with slots.c.o swapped for one that calls back
    into exec.c: check_objects must name that circle."""
    import shutil, tempfile
    objs = glob.glob(os.path.join(build, "CMakeFiles", "pwworker.dir", "worker", "*.o"))
    if not objs:
        print(f"check_layers: {build}: no worker objects (build it first)")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        dst = os.path.join(tmp, "CMakeFiles", "pwworker.dir", "worker")
        os.makedirs(dst)
        for o in objs:
            shutil.copy(o, dst)
        ok = check_objects(tmp, "pwworker")
        with open(os.path.join(tmp, "plant.c"), "w") as f:
            f.write(PLANT)
        subprocess.run(["cc", "-c", "-o", os.path.join(dst, "slots.c.o"), os.path.join(tmp, "plant.c")], check=True)
        bad = check_objects(tmp, "pwworker")
    print("check_layers: the worker's objects as built:", "ok" if not ok else ok)
    print("check_layers: with the planted circle:", bad or "NOT CAUGHT")
    caught = bad and "exec" in bad[0] and "slots" in bad[0]
    return 0 if not ok and caught else 1


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    if sys.argv[1] == "--plant" and len(sys.argv) == 3:
        return plant(sys.argv[2])
    src = sys.argv[1]
    errs = check_sources(src) + check_error_statuses(src) + check_run_fields(src)
    if len(sys.argv) > 2:
        errs += check_objects(sys.argv[2], "pwcoord")
        errs += check_objects(sys.argv[2], "pwworker")
        for layer in layers(src):
            errs += check_objects(os.path.join(sys.argv[2], "common"), "pw_" + layer)
    for e in errs:
        print("check_layers:", e)
    print(f"check_layers: {len(layers(src))} layers, {'ok' if not errs else f'{len(errs)} violations'}")
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main())
