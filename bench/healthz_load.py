#!/usr/bin/env python3
"""healthz_load: does /healthz stay fast on the operator's worst day?

Starts a coordinator, opens 1100 idle HTTP connections (220 from each of
five loopback addresses: every client's share is 256), starts two heavy
requests (POST /v1/plans?compare=1 of a 32-layer GPT at pp=8 x 2 virtual
stages and 16384 microbatches, every schedule planned: the action budget
is raised so the plans take seconds, as unbounded ones once did) and, while they run, asks /healthz from another address
every 20 ms. Prints the latency median, p99 and max, and the heavy
requests' times. No assertion: a measurement for the record (issue 13's
target: /healthz within 100 ms).

    python3 bench/healthz_load.py BUILD_DIR
"""
import atexit, json, os, shutil, socket, subprocess, sys, tempfile, threading, time, urllib.error, urllib.request

B = sys.argv[1]
T = tempfile.mkdtemp()
atexit.register(shutil.rmtree, T, True)  # ranks' state and checkpoints: gigabytes
c = subprocess.Popen([f"{B}/pipewright-coordinator", "--http", "127.0.0.1:0", "--control", "127.0.0.1:0",
                      "--state-dir", f"{T}/c", "--ready-file", f"{T}/ready",
                      "--max-plan-actions", "2000000"], stdout=open(f"{T}/c.log", "w"),
                     stderr=subprocess.STDOUT)
for _ in range(100):
    if os.path.exists(f"{T}/ready") and os.path.getsize(f"{T}/ready"):
        break
    time.sleep(0.1)
port = json.load(open(f"{T}/ready"))["http"]
spec = {"name": "big", "model": {"template": "gpt", "vocab_size": 50257, "seq_len": 1024, "d_model": 768,
        "n_layers": 16, "n_heads": 12}, "mesh": {"pp": 8, "dp": 1, "virtual_stages": 2},
        "schedule": {"name": "interleaved-1f1b", "microbatches": 16384}, "train": {"steps": 10, "batch_size": 16384},
        "data": {"kind": "copy"}}
body = json.dumps(spec).encode()

idle = []
for a in range(10, 15):
    for _ in range(220):
        s = socket.socket()
        s.bind((f"127.0.0.{a}", 0))
        s.connect(("127.0.0.1", port))
        idle.append(s)

heavy_t = []
def heavy():
    t = time.time()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/plans?compare=1", data=body, method="POST")
    try:
        urllib.request.urlopen(req, timeout=300).read()
        heavy_t.append(time.time() - t)
    except urllib.error.HTTPError as e:
        print("heavy request:", e.code, e.read()[:300])

def healthz(src):
    s = socket.socket()
    s.bind((src, 0))
    t = time.time()
    s.connect(("127.0.0.1", port))
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    d = b""
    while True:
        k = s.recv(4096)
        if not k:
            break
        d += k
    s.close()
    return time.time() - t, d[:12].decode()

hs = [threading.Thread(target=heavy) for _ in range(2)]
for h in hs:
    h.start()
time.sleep(0.2)
lat, status = [], set()
while any(h.is_alive() for h in hs):
    dt, st = healthz("127.0.0.2")
    lat.append(dt)
    status.add(st)
    time.sleep(0.02)
for h in hs:
    h.join()
alive = sum(1 for s in idle if s.fileno() >= 0)
lat.sort()
print(f"idle connections opened: {len(idle)}; heavy compare plans took {[round(x, 2) for x in heavy_t]} s")
if lat:
    print(f"/healthz while they ran: n={len(lat)} median {lat[len(lat) // 2] * 1e3:.2f} ms "
          f"p99 {lat[max(0, int(len(lat) * 0.99) - 1)] * 1e3:.2f} ms max {lat[-1] * 1e3:.2f} ms, statuses {sorted(status)}")
for s in idle:
    s.close()
c.terminate()
c.wait()
