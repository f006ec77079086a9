"""Tests of what `memres replay` draws and dumps, read by other programs:
snapshots as PyTorch's memory tools read them (PyTorch's own reader where
PyTorch is installed: the GPU machine, python/gpu/run.sh, where
`MEMRES_REQUIRE_GPU=1` makes its absence a failure), and the timeline as
a browser shows it (headless Chromium, where `chromium` is installed).

    cargo build -p memres-bench --bin memres
    python3 -m unittest discover -s benches/viz

`MEMRES` names the binary (default: target/debug/memres).
"""

import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, HERE)
from check_snapshot import check  # noqa: E402

MEMRES = os.environ.get("MEMRES", os.path.join(ROOT, "target", "debug", "memres"))
RESNET = os.path.join(ROOT, "benches", "data", "resnet_train.csv.gz")

try:
    import torch  # noqa: F401
except ImportError:
    torch = None


def memres(*args):
    out = subprocess.run([MEMRES, *args], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise AssertionError(f"memres {' '.join(args)}: {out.returncode}\n{out.stderr}")
    return out


class Snapshot(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="memres-viz-")

    def tearDown(self):
        shutil.rmtree(self.dir)

    def snapshot(self, *args):
        path = os.path.join(self.dir, "s.pickle")
        out = memres("replay", "--json", "--passes", "1", "--snapshot", path, *args)
        with open(path, "rb") as f:
            return pickle.load(f), [json.loads(l) for l in out.stdout.splitlines()], out.stderr

    def test_at_the_peak_the_segments_hold_the_replays_peak_upstream(self):
        for resource in ("pool", "binning", "arena"):
            snap, rows, _ = self.snapshot("-r", resource, RESNET)
            reserved, allocated, requested, events = check(snap)
            self.assertEqual(reserved, rows[0]["peak_upstream"], resource)
            self.assertLessEqual(requested, rows[0]["peak_live"], resource)
            self.assertGreater(requested, 0, resource)
            # The last event is the allocation that made the peak.
            self.assertIn(events[-1]["action"], ("alloc", "segment_alloc"), resource)

    def test_at_the_end_nothing_is_live(self):
        snap, rows, _ = self.snapshot("--snapshot-at", "end", "-r", "pool", RESNET)
        reserved, allocated, requested, events = check(snap)
        self.assertEqual((allocated, requested), (0, 0))
        self.assertGreater(reserved, 0)
        self.assertEqual(events[-1]["action"], "free_completed")

    def test_at_out_of_memory_the_last_event_is_oom(self):
        trace = os.path.join(self.dir, "huge.csv")
        with open(trace, "w") as f:
            f.write("0,1,allocate,0x100,4096,0\n0,2,allocate,0x200,2199023255552,0\n")
        path = os.path.join(self.dir, "oom.pickle")
        out = subprocess.run([MEMRES, "replay", "--stack", "pool(sim)", "--snapshot", path, trace],
                             capture_output=True, text=True, check=False)
        self.assertEqual(out.returncode, 1, out.stderr)
        with open(path, "rb") as f:
            snap = pickle.load(f)
        _, _, requested, events = check(snap)
        self.assertEqual(requested, 4096)
        self.assertEqual((events[-1]["action"], events[-1]["size"]), ("oom", 2199023255552))
        # As PyTorch's: the device's free bytes, and no address (the
        # simulated device has no driver to ask).
        self.assertEqual(events[-1]["device_free"], 0)
        self.assertNotIn("addr", events[-1])

    def test_pytorchs_memory_viz_reads_it(self):
        if torch is None:
            # The GPU machine has PyTorch (python/gpu/run.sh): there it runs.
            if os.environ.get("MEMRES_REQUIRE_GPU", "") not in ("", "0"):
                self.fail("MEMRES_REQUIRE_GPU is set but PyTorch is not installed")
            self.skipTest("PyTorch is not installed")
        from check_snapshot import with_torch

        snap, _, _ = self.snapshot("-r", "pool", RESNET)
        self.assertIn("total_reserved", with_torch(snap))


def _segment(address, *blocks):
    """A segment tiled by `blocks`, (size, live) pairs."""
    tiles, at = [], address
    for size, live in blocks:
        state = "active_allocated" if live else "inactive"
        tiles.append({"address": at, "size": size, "requested_size": size, "state": state, "frames": []})
        at += size
    used = sum(size for size, live in blocks if live)
    return {"device": 0, "address": address, "total_size": at - address, "allocated_size": used,
            "active_size": used, "requested_size": used, "stream": 0, "segment_type": "large",
            "blocks": tiles, "frames": []}


def _event(action, addr, size):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": []}


def _snapshot(segments, *events):
    return {"segments": segments, "device_traces": [[_event(*e) for e in events]]}


class CheckSnapshot(unittest.TestCase):
    """What check_snapshot refuses: snapshots PyTorch's viewer would
    misdraw, made by hand."""

    def test_a_consistent_history_passes(self):
        segments = [_segment(0x1000, (0x100, True), (0x300, False)), _segment(0x8000, (0x400, True))]
        check(_snapshot(segments, ("segment_alloc", 0x1000, 0x400), ("alloc", 0x1000, 0x100),
                        ("alloc", 0x1100, 0x100), ("free_requested", 0x1100, 0x100),
                        ("free_completed", 0x1100, 0x100), ("segment_alloc", 0x8000, 0x400),
                        ("alloc", 0x8000, 0x400), ("segment_alloc", 0x4000, 0x100),
                        ("segment_free", 0x4000, 0x100)))

    def assertRefused(self, snapshot, message):
        with self.assertRaises(AssertionError) as refused:
            check(snapshot)
        self.assertIn(message, str(refused.exception))

    def test_a_free_undone_into_no_segment_is_refused(self):
        segments = [_segment(0x1000, (0x100, True))]
        self.assertRefused(_snapshot(segments, ("alloc", 0x9000, 0x100), ("free_requested", 0x9000, 0x100),
                                     ("free_completed", 0x9000, 0x100), ("alloc", 0x1000, 0x100)),
                           "block 0x9000 in no segment")

    def test_a_segment_undone_under_a_live_block_is_refused(self):
        # The block was live before its segment was made.
        segments = [_segment(0x1000, (0x100, True), (0x100, False))]
        self.assertRefused(_snapshot(segments, ("alloc", 0x1000, 0x100), ("segment_alloc", 0x1000, 0x200)),
                           "block 0x1000 in no segment")

    def test_a_segment_alloc_of_no_segment_is_refused(self):
        segments = [_segment(0x1000, (0x100, True))]
        self.assertRefused(_snapshot(segments, ("segment_alloc", 0x2000, 0x100), ("alloc", 0x1000, 0x100)),
                           "segment_alloc of 0x2000: no segment")

    def test_a_segment_free_undone_smaller_over_a_live_block_is_refused(self):
        # Undone, the free puts back a segment of 0x100 bytes at 0x1000 in
        # place of the 0x200 that holds the live block at 0x1100.
        segments = [_segment(0x1000, (0x100, False), (0x100, True))]
        self.assertRefused(_snapshot(segments, ("alloc", 0x1100, 0x100), ("segment_free", 0x1000, 0x100)),
                           "block 0x1100 in no segment")

    def test_a_block_in_no_segment_from_the_start_is_refused(self):
        # Two segments at one address: the viewer keeps the last, which
        # leaves the first's live block outside.
        segments = [_segment(0x1000, (0x100, False), (0x100, True)), _segment(0x1000, (0x100, False))]
        self.assertRefused(_snapshot(segments, ("alloc", 0x5000, 0x100)), "block 0x1100 in no segment")


@unittest.skipUnless(shutil.which("chromium"), "chromium is not installed")
class Timeline(unittest.TestCase):
    def test_the_html_timeline_renders_in_headless_chromium(self):
        with tempfile.TemporaryDirectory() as d:
            html = os.path.join(d, "t.html")
            png = os.path.join(d, "t.png")
            memres("replay", "--passes", "1", "-r", "pool,arena", "--timeline", html, RESNET)
            chrome = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
            dom = subprocess.run([*chrome, "--dump-dom", "file://" + html],
                                 capture_output=True, text=True, timeout=120, check=True).stdout
            self.assertEqual(dom.count("<svg"), 1)
            self.assertIn("pool on ", dom)
            subprocess.run([*chrome, "--window-size=1000,900", f"--screenshot={png}", "file://" + html],
                           capture_output=True, timeout=120, check=True)
            with open(png, "rb") as f:
                image = f.read()
            self.assertTrue(image.startswith(b"\x89PNG"))
            # A blank page compresses to a few KiB; two charts do not.
            self.assertGreater(len(image), 40_000)


if __name__ == "__main__":
    unittest.main()
