#!/usr/bin/env bash
# What a Redis failover costs a fleet, counted per try: a Sentinel topology on loopback (a primary,
# REPLICAS replicas (default 1), three sentinels, down-after 1 s), 3 `--crontab` replicas of each
# binary serving 5 jobs due every second (each appends `$CRONLOCK_INSTANT $CRONLOCK_ATTEMPT` to a
# file), a failover FAIL_AT seconds after the fleet started (default 6), and the fleet stopped SECS
# seconds after it started (default 16). Per try and binary:
#   - doubles: job-instants that ran more than once;
#   - lost: job-instants from the fleet's third second to its last but one that did not run,
#     and of those how many the ledger of the primary in charge at the end records (missed or
#     skipped, with its reason); SHOW=1 prints what the ledger holds for the others, and when
#     the sentinels named the new primary.
# KEEP: a directory to copy each try's files to (the fleet's logs, the jobs' files).
# REPLICA_ARGS: options of every replica (for example -v). SERVER_ARGS: options of every
# redis-server (for example `--repl-diskless-sync-delay 0`).
# KIND: planned (SENTINEL FAILOVER, the default), frozen (the primary SIGSTOPped for 6 s, the
# sentinels fail over, then SIGCONT), or none (no failover: the steady state, from the fleet's
# third second to its last but one, per run: the primary's CPU (INFO cpu), its client commands
# (INFO stats total_commands_processed), the start delay p50 and p99). EXTRA: options added to every crontab line (for example
# `--min-replicas 1`). Interleaved: each try runs every binary once, in random order, each on a
# topology of its own.
# Usage: scripts/bench-failover.sh [TRIES] [OTHER_BIN...] (default 10 tries; this build first).
# Installs redis-server and redis-tools when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
TRIES=${1:-10}
shift || true
. scripts/bench-common.sh
bench_install redis-server:redis-server redis-cli:redis-tools
bench_setup
python3 - "$WORK" "$TRIES" "${KIND:-planned}" "${REPLICAS:-1}" "${EXTRA:-}" "${FAIL_AT:-6}" \
  "${SECS:-16}" "$BIN" "$@" <<'PY'
import json, os, random, signal, socket, subprocess, sys, time, collections, datetime

work, tries, kind, nrep, extra, fail_at, secs = sys.argv[1:8]
tries, nrep, fail_at, secs = int(tries), int(nrep), float(fail_at), float(secs)
bins = sys.argv[8:]
procs = []

def port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

def cli(p, *a):
    r = subprocess.run(["redis-cli", "-p", str(p), *a], capture_output=True, text=True, timeout=10)
    return r.stdout.strip()

def wait(cond, secs=30):
    end = time.time() + secs
    while time.time() < end:
        try:
            if cond(): return True
        except Exception: pass
        time.sleep(0.05)
    return False

def server(d, *args):
    p = port()
    c = subprocess.Popen(["redis-server", "--port", str(p), "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no", "--dir", d, *args,
                          *os.environ.get("SERVER_ARGS", "").split()],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.append(c)
    assert wait(lambda: cli(p, "ping") == "PONG")
    return p, c

def topology(d):
    pp, pc = server(d)
    reps = [server(d, "--replicaof", "127.0.0.1", str(pp)) for _ in range(nrep)]
    sents = []
    for i in range(3):
        sp = port()
        sd = os.path.join(d, f"s{i}"); os.makedirs(sd)
        conf = os.path.join(sd, "sentinel.conf")
        open(conf, "w").write(
            f"port {sp}\nbind 127.0.0.1\nprotected-mode no\ndir {sd}\n"
            f"sentinel monitor svc 127.0.0.1 {pp} 2\n"
            "sentinel down-after-milliseconds svc 1000\nsentinel failover-timeout svc 10000\n"
            "sentinel parallel-syncs svc 1\n")
        sents.append(sp)
        procs.append(subprocess.Popen(["redis-server", conf, "--sentinel"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    def ready():
        for sp in sents:
            r = cli(sp, "sentinel", "replicas", "svc").split("\n")
            s = cli(sp, "sentinel", "sentinels", "svc").split("\n")
            if r.count("name") != nrep or s.count("name") != 2: return False
        return True
    assert wait(ready, 60), "sentinels did not meet"
    # Every replica done with its first sync (the primary's ROLE lists only those): a replica
    # promoted before that has none of the data, whatever a client does.
    assert wait(lambda: cli(pp, "role").count("\n") >= 1 + 3 * nrep, 60), "replicas did not sync"
    return pp, pc, sents

def primary(sents):
    names = {cli(s, "sentinel", "get-master-addr-by-name", "svc").split("\n")[-1] for s in sents}
    return int(names.pop()) if len(names) == 1 else None

def one(binary, name):
    d = os.path.join(work, name); os.makedirs(d)
    pp, pc, sents = topology(d)
    url = "redis+sentinel://" + ",".join(f"127.0.0.1:{s}" for s in sents) + "/svc"
    tab = os.path.join(d, "crontab")
    lines = ["CRON_TZ=UTC"] + [
        f"* * * * * * {extra} fj{j} sh -c 'echo $CRONLOCK_INSTANT $CRONLOCK_ATTEMPT $(date +%s.%N) >> {d}/fj{j}'"
        for j in range(5)]
    open(tab, "w").write("\n".join(lines) + "\n")
    fleet = []
    for i in range(3):
        env = dict(os.environ, CRONLOCK_REDIS_URL=url)
        fleet.append(subprocess.Popen([binary, "--crontab", tab, *os.environ.get("REPLICA_ARGS", "").split()], env=env,
                                      stdout=open(f"{d}/r{i}.out", "w"),
                                      stderr=open(f"{d}/r{i}.err", "w")))
    started = time.time()
    def stat():
        info = cli(pp, "info", "all")
        f = dict(l.split(":", 1) for l in info.splitlines() if ":" in l)
        return float(f["used_cpu_sys"]) + float(f["used_cpu_user"]), int(f["total_commands_processed"])
    if kind == "none":
        time.sleep(max(0, started + 3 - time.time()))
        t0, (c0, n0) = time.time(), stat()
        time.sleep(max(0, started + secs - 1 - time.time()))
        t1, (c1, n1) = time.time(), stat()
        steady.append((t0, t1, c1 - c0, n1 - n0, d))
        time.sleep(max(0, started + secs - time.time()))
    time.sleep(max(0, started + fail_at - time.time()))
    failed_at = time.time()
    if kind == "none":
        pass
    elif kind == "planned":
        cli(sents[0], "sentinel", "failover", "svc")
    else:
        pc.send_signal(signal.SIGSTOP)
        wait(lambda: primary(sents) not in (None, pp), 20)
        time.sleep(max(0, failed_at + 6 - time.time()))
        pc.send_signal(signal.SIGCONT)
    promoted = kind == "none" or wait(lambda: primary(sents) not in (None, pp), 20)
    if os.environ.get("SHOW") and kind != "none":
        print(f"failover at {failed_at:.1f}, the sentinels named the new primary at "
              f"{time.time():.1f}", file=sys.stderr)
    time.sleep(max(0, started + secs - time.time()))
    for c in fleet: c.send_signal(signal.SIGTERM)
    for c in fleet:
        try: c.wait(30)
        except subprocess.TimeoutExpired: c.kill()
    stopped = time.time()
    now = primary(sents)
    doubles = lost = recorded = 0
    first, last = int(started) + 3, int(stopped) - 2
    for j in range(5):
        runs = collections.Counter()
        try:
            for line in open(f"{d}/fj{j}"):
                runs[line.split()[0]] += 1
        except FileNotFoundError: pass
        doubles += sum(1 for n in runs.values() if n > 1)
        ledger = {}
        if now:
            raw = cli(now, "hgetall", f"cronlock:{{fj{j}}}:ledger").split("\n")
            ledger = dict(zip(raw[0::2], raw[1::2]))
        for t in range(first, last + 1):
            at = datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            if at in runs: continue
            lost += 1
            entry = ledger.get(str(t * 1000), "")
            if '"missed"' in entry or '"skipped"' in entry: recorded += 1
            elif os.environ.get("SHOW"): print(f"fj{j} {at}: {entry[:160] or 'not in the ledger'}", file=sys.stderr)
    for c in procs:
        if c.poll() is None:
            c.send_signal(signal.SIGCONT); c.kill(); c.wait()
    procs.clear()
    if os.environ.get("KEEP"):
        import shutil
        shutil.copytree(d, os.path.join(os.environ["KEEP"], name), dirs_exist_ok=True)
    return doubles, lost, recorded, promoted

totals = {b: [0, 0, 0, 0] for b in bins}
steady = []
cost = {b: [] for b in bins}
for t in range(tries):
    order = list(bins); random.shuffle(order)
    for b in order:
        i = bins.index(b)
        dbl, lost, rec, ok = one(b, f"t{t}b{i}")
        if kind == "none":
            t0, t1, cpu, cmds, d = steady.pop()
            delays = []
            for j in range(5):
                for line in open(f"{d}/fj{j}"):
                    at, _, start = line.split()[:3]
                    inst = datetime.datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()
                    if t0 <= inst < t1: delays.append((float(start) - inst) * 1000)
            delays.sort()
            n = max(1, len(delays))
            cost[b].append((cpu * 1000 / n, cmds / n, delays[len(delays) // 2], delays[int(len(delays) * 0.99)]))
        s = totals[b]
        s[0] += dbl; s[1] += lost; s[2] += rec; s[3] += (dbl > 0)
        print(f"try {t + 1} bin {i}: doubles {dbl}, lost {lost} (recorded {rec}), promoted {ok}",
              file=sys.stderr, flush=True)
if kind == "none":
    import statistics as st
    print("| binary | Redis CPU per run (ms) | client commands per run | start delay p50 (ms) | p99 (ms) |")
    print("|---|---|---|---|---|")
    for i, b in enumerate(bins):
        rows = cost[b]
        med = lambda k: st.median(r[k] for r in rows)
        rng = lambda k: f"{min(r[k] for r in rows):.3f}-{max(r[k] for r in rows):.3f}"
        print(f"| {'this' if i == 0 else b} | {med(0):.3f} ({rng(0)}) | {med(1):.2f} ({rng(1)}) | {med(2):.1f} ({rng(2)}) | {med(3):.1f} ({rng(3)}) |")
    sys.exit(0)
print(f"| binary | tries | tries with a double | doubles | lost | lost and recorded |")
print(f"|---|---|---|---|---|---|")
for i, b in enumerate(bins):
    s = totals[b]
    print(f"| {'this' if i == 0 else b} | {tries} | {s[3]} | {s[0]} | {s[1]} | {s[2]} |")
PY
