#!/usr/bin/env bash
# How many instants a fleet loses under kills and freezes while its runs work, this build
# against another (OTHER, e.g. the previous main's), interleaved: each round runs every build
# once in random order, each run with a seed of its own, on one loopback redis-server (flushed
# between runs). A run: 3 `--crontab` replicas (REPLICAS), each leading its process group, serving 8 jobs
# (six every second: three with the default options, three with `--ttl 2s`, two of those with
# `--retries 1 --catch-up 10s`; one every 2 s and one every 10 s with a 3 s command), every
# command 0.3 s long; every 4-9 s one replica is SIGKILLed, its whole group SIGKILLed, it or its
# group SIGSTOPped for 1-3 s, or SIGTERMed (a killed one replaced at once, never all down), for
# SECS seconds, then 6 s of calm. For each build: the instants due while a replica served, those
# that never ran, those of them within a job's TTL after a group holding its lock was killed or
# frozen (nothing on the host could prove its command gone: excused), the instants in no ledger,
# and the entries that read `running` after the fleet stopped.
# Usage: scripts/bench-chaos.sh OTHER_BIN [ROUNDS] [SECS] (default 3 rounds of 90 s); REPLICAS
# (default 3).
# Installs redis-server and redis-tools when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
OTHER=${1:?usage: scripts/bench-chaos.sh OTHER_BIN [ROUNDS] [SECS]}
ROUNDS=${2:-3}
SECS=${3:-90}
. scripts/bench-common.sh
bench_install redis-server:redis-server redis-cli:redis-tools gcc:gcc
bench_setup
bench_redis

# One run of build $1 with seed $2: one line "BUILD SEED DUE LOST EXCUSED UNLEDGERED RUNNING".
chaos_run() {
  R flushall >/dev/null
  python3 - "$1" "$2" "$WORK" "$SECS" "$CRONLOCK_REDIS_URL" <<'PY'
import calendar, json, os, random, signal, subprocess, sys, time
bin_, seed, work, secs, url = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
rng = random.Random(seed)
d = os.path.join(work, "chaos"); os.makedirs(d, exist_ok=True)
for f in os.listdir(d): os.remove(os.path.join(d, f))
runs = os.path.join(d, "runs")
jobs = []  # (key, every, ttl)
lines = ["CRON_TZ=UTC"]
def job(sched, every, opts, ttl, key, then=""):
    jobs.append((key, every, ttl))
    lines.append(f"{sched} {opts} {key} echo {key} $CRONLOCK_INSTANT >> {runs}; sleep 0.3{then}")
for i in range(3): job("* * * * * *", 1, "", 30, f"ch-{i}")
for i in (3, 4): job("* * * * * *", 1, "--ttl 2s --retries 1 --catch-up 10s", 2, f"ch-{i}")
job("* * * * * *", 1, "--ttl 2s", 2, "ch-5")
job("*/2 * * * * *", 2, "--ttl 3s", 3, "ch-6")
job("*/10 * * * * *", 10, "--ttl 2s --retries 2 --catch-up 20s", 2, "ch-7", "; sleep 3")
crontab = os.path.join(d, "crontab")
open(crontab, "w").write("\n".join(lines) + "\n"); os.chmod(crontab, 0o600)
env = dict(os.environ, CRONLOCK_REDIS_URL=url)
def start():
    return subprocess.Popen([bin_, "--crontab", crontab, "--drain", "5s"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            process_group=0)
def held_by(pid):
    out = []
    for key, _, ttl in jobs:
        v = subprocess.run(["redis-cli", "-u", url, "GET", f"cronlock:{{{key}}}"],
                           capture_output=True, text=True).stdout.strip()
        try:
            if json.loads(v).get("pid") == pid: out.append((key, ttl))
        except Exception:
            pass
    return out
books = {}
def read_books():
    for key, _, _ in jobs:
        s = subprocess.run([bin_, "--status", "--json", key], env=env, capture_output=True, text=True)
        try:
            for e in json.loads(s.stdout).get("ledger", []):
                books[(key, e["instant"] // 1000)] = e
        except Exception:
            pass
size = int(os.environ.get("REPLICAS", "3"))
fleet = [start() for _ in range(size)]
t0 = time.time(); first = int(t0) + 3; excused = []
while time.time() - t0 < secs:
    time.sleep(4 + rng.random() * 5)
    read_books()
    i = rng.randrange(size); p = fleet[i]; what = rng.randrange(5)
    if what == 0:
        p.send_signal(signal.SIGKILL); p.wait(); fleet[i] = start()
    elif what == 1:
        os.killpg(p.pid, signal.SIGKILL); at = int(time.time())
        excused += [(k, at, at + ttl + 2) for k, ttl in held_by(p.pid)]
        p.wait(); fleet[i] = start()
    elif what == 2:
        p.send_signal(signal.SIGSTOP); time.sleep(1 + rng.random() * 2); p.send_signal(signal.SIGCONT)
    elif what == 3:
        os.killpg(p.pid, signal.SIGSTOP); at = int(time.time()); held = held_by(p.pid)
        time.sleep(1 + rng.random() * 2); os.killpg(p.pid, signal.SIGCONT); woke = int(time.time())
        excused += [(k, at, woke + ttl + 2) for k, ttl in held]
    else:
        fleet[i] = start(); p.send_signal(signal.SIGTERM); p.wait()
time.sleep(6)
last = int(time.time()) - 2
for p in fleet: p.send_signal(signal.SIGTERM)
for p in fleet: p.wait()
read_books()
ran = set()
for l in open(runs) if os.path.exists(runs) else []:
    k, inst = l.split()[:2]
    ran.add((k, calendar.timegm(time.strptime(inst, "%Y-%m-%dT%H:%M:%SZ"))))
due = lost = exc = unledgered = running = 0
for key, every, ttl in jobs:
    for at in range(first, last + 1):
        if at % every: continue
        e = books.get((key, at))
        if e is None: unledgered += 1
        elif e.get("state") == "running": running += 1
        if any(k == key and a <= at <= b for k, a, b in excused):
            if (key, at) not in ran: exc += 1
            continue
        due += 1
        if (key, at) not in ran: lost += 1
print(f"{os.path.basename(bin_)} {seed} {due} {lost} {exc} {unledgered} {running}")
PY
}

cp "$BIN" "$WORK/this"
cp "$OTHER" "$WORK/other"
: > "$WORK/results"
for round in $(seq "$ROUNDS"); do
  for b in $(printf '%s\n' this other | shuf); do
    chaos_run "$WORK/$b" "$RANDOM$round" | tee -a "$WORK/results" >&2
  done
done
echo
echo "| build | runs | instants due (a replica served) | lost (%) per run | lost within a killed or frozen group's TTL | in no ledger | \`running\` after the fleet stopped |"
echo "|---|---|---|---|---|---|---|"
for b in this other; do
  awk -v b="$b" '$1 == b {n++; due += $3; lost += $4; exc += $5; un += $6; run += $7;
      pct = pct sprintf("%s%.1f", (n > 1 ? ", " : ""), 100 * $4 / ($3 ? $3 : 1))}
    END {printf "| %s | %d | %d | %d (%.2f %%; %s) | %d | %d | %d |\n", b, n, due, lost,
      100 * lost / (due ? due : 1), pct, exc, un, run}' "$WORK/results"
done
