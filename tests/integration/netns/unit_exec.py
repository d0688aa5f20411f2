#!/usr/bin/env python3
"""unit_exec.py UNIT_FILE [INSTANCE]: exec a system unit's ExecStart= the way
systemd would start it, so a test runs a packaged unit as written:
Environment=, then each EnvironmentFile= in order ('-': may be missing);
LoadCredential=NAME:PATH copied to /run/credentials/UNIT/NAME (%d);
StateDirectory= made under /var/lib (%S); WorkingDirectory=; specifiers
%i %H %S %d %%; in ExecStart=, a word "$VAR" splits at blanks and ${VAR}
stays one word. No user switch and no sandboxing: systemd's own checks of
the units are test_systemd's."""
import os, re, shlex, socket, sys


def unit_lines(path):
    for line in open(path):
        line = line.strip()
        if line and line[0] not in "#;[" and "=" in line:
            k, v = line.split("=", 1)
            yield k.strip(), v.strip()


def env_file(path, env):
    for line in open(path):
        line = line.strip()
        if not line or line[0] in "#;" or "=" not in line:
            continue
        k, v = line.split("=", 1)
        v = v.strip()
        if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
            v = v[1:-1]
        env[k.strip()] = v


def main():
    unit = sys.argv[1]
    inst = sys.argv[2] if len(sys.argv) > 2 else ""
    base = os.path.basename(unit)
    name = base.replace("@.", "@%s." % inst) if inst else base
    creds = "/run/credentials/" + name
    spec = {"i": inst, "H": socket.gethostname(), "S": "/var/lib", "d": creds, "%": "%"}
    sub = lambda s: re.sub(r"%(.)", lambda m: spec[m.group(1)], s)
    env, start, workdir = {}, None, None
    for k, v in unit_lines(unit):
        v = sub(v)
        if k == "Environment":
            env.update(w.split("=", 1) for w in shlex.split(v))
        elif k == "EnvironmentFile":
            opt = v.startswith("-")
            path = v.lstrip("-")
            if os.path.exists(path) or not opt:
                env_file(path, env)
        elif k == "LoadCredential":
            cname, path = v.split(":", 1)
            os.makedirs(creds, mode=0o700, exist_ok=True)
            with open(path, "rb") as f, open(os.path.join(creds, cname), "wb") as g:
                g.write(f.read())
            os.chmod(os.path.join(creds, cname), 0o400)
        elif k == "StateDirectory":
            for d in v.split():
                os.makedirs(os.path.join("/var/lib", d), mode=0o700, exist_ok=True)
        elif k == "WorkingDirectory":
            workdir = v
        elif k == "ExecStart":
            start = v
    if not start:
        sys.exit("unit_exec: %s has no ExecStart=" % unit)
    argv = []
    for w in shlex.split(start):
        m = re.fullmatch(r"\$(\w+)", w)
        if m:
            argv += env.get(m.group(1), "").split()
        else:
            argv.append(re.sub(r"\$\{(\w+)\}", lambda m: env.get(m.group(1), ""), w))
    if workdir:
        os.chdir(workdir)
    os.environ.update(env)
    print("unit_exec: " + " ".join(shlex.quote(a) for a in argv), file=sys.stderr, flush=True)
    os.execv(argv[0], argv)


main()
