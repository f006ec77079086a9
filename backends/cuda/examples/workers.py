"""The checks' drivers run each configuration in a process of its own (an
allocator is chosen once per process): `run_worker` runs one and reads the
`RESULT {json}` line it prints."""

import json
import subprocess
import sys


def run_worker(script, name, argv, env=None):
    """Runs `python3 script argv...`; returns the JSON of its last RESULT
    line, or exits with its output when it failed or printed none."""
    cmd = [sys.executable, script] + argv
    print(f"-- {name}: {' '.join(cmd)}", flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [line for line in p.stdout.splitlines() if line.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        sys.stdout.write(p.stdout[-4000:])
        sys.stdout.write(p.stderr[-4000:])
        raise SystemExit(f"{name}: worker failed (exit {p.returncode})")
    return json.loads(lines[-1][len("RESULT "):])
