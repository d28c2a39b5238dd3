#!/usr/bin/env python3
"""Followers split across two `prefixrouter serve` processes, with and
without prediction sharing (--peer-listen/--peers), against one replica.

A manual measurement for docs/performance.md, not part of `make test`
(router/peers_sim_test.go is the test). Usage:

  prefixrouter sim --pods 4 --profile tiny --num-gpu-blocks 65536 \
      --event-delay 600ms --listen 127.0.0.1:18100 --events-port 15600 > /tmp/sim.out &
  python3 scripts/two-replicas.py ./prefixrouter /tmp/sim.out

Each group sends a leader and three followers one after another (each when
the previous answered), taking the replicas in turn, with a prefix of
its own from the first block (a random head), so every follower arrives
inside the pods' event delay. It prints, per arrangement, the followers
routed to their leader's pod (the X-Prefixrouter-Target debug header).
Ports 8101-8102, 9101-9102 and 5671-5672 on loopback must be free.
"""
import json, os, signal, subprocess, sys, time, urllib.request

BIN, SIM_OUT = sys.argv[1], sys.argv[2]
EPS = [l.strip() for l in open(SIM_OUT) if l.startswith('http://')]
PREFIX = "You are a careful assistant. " * 40


def start(i, share):
    args = [BIN, 'serve', '--listen', f'127.0.0.1:{8100+i}', '--admin-listen', f'127.0.0.1:{9100+i}',
            '--policy', 'speculative', '--hash-seed', '0', '--tokenizer', 'sim-tiny=bytes', '--debug-headers',
            '--holdback', '0', '--log-level', 'error']
    for e in EPS:
        args += ['--endpoint', e]
    if share:
        args += ['--peer-listen', f'tcp://127.0.0.1:{5670+i}', '--peers', 'tcp://127.0.0.1:5671,tcp://127.0.0.1:5672',
                 '--replica-id', f'r{i}']
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def ready(i):
    for _ in range(200):
        try:
            with urllib.request.urlopen(f'http://127.0.0.1:{8100+i}/ready', timeout=1) as r:
                if r.status == 200:
                    return True
        except Exception:
            pass
        time.sleep(0.1)
    return False


def send(i, head, n):
    body = json.dumps({"model": "sim-tiny", "max_tokens": 1, "prompt": head + PREFIX + f" Task {n}."}).encode()
    req = urllib.request.Request(f'http://127.0.0.1:{8100+i}/v1/completions', data=body,
                                 headers={'Content-Type': 'application/json'})
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()
        return r.headers.get('X-Prefixrouter-Target')


def run(replicas, share, groups=40, followers=3):
    procs = [start(i, share) for i in range(1, replicas + 1)]
    try:
        for i in range(1, replicas + 1):
            if not ready(i):
                sys.exit(f'serve {i} did not become ready')
        time.sleep(1.5)  # the replicas' peer connections
        on = total = k = 0
        for _ in range(groups):
            head = os.urandom(8).hex() + ' '
            leader = send(1 + k % replicas, head, 0)
            k += 1
            for n in range(1, followers + 1):
                on += send(1 + k % replicas, head, n) == leader
                total += 1
                k += 1
        return on, total
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=10)


for rnd in range(2):
    for replicas, share in [(1, False), (2, True), (2, False)]:
        on, total = run(replicas, share)
        print(f'run {rnd}: {replicas} process(es), sharing {share}: {on}/{total} followers on the holder', flush=True)
