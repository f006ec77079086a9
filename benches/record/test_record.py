"""Tests of the recording suite that need no GPU: the trace check, the
registry, and the driver on the CPU (its array workloads on NumPy, where
NumPy is installed).

    python3 -m unittest discover -s benches/record
"""

import argparse
import ast
import contextlib
import gzip
import io
import json
import os
import subprocess
import sys
import tempfile
import tracemalloc
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "..", "backends", "cuda", "examples")
sys.path.insert(0, HERE)
sys.path.insert(0, EXAMPLES)
import rmm_log  # noqa: E402
from rmm_log import HEADER, check_trace  # noqa: E402
from workloads import WORKLOADS  # noqa: E402

try:
    import numpy
except ImportError:
    numpy = None


def write(path, rows, gz=False):
    text = HEADER + "\n" + "".join(r + "\n" for r in rows)
    with (gzip.open(path, "wt") if gz else open(path, "w")) as f:
        f.write(text)
    return path


class CheckTrace(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def path(self, name):
        return os.path.join(self.dir.name, name)

    def test_a_good_trace_plain_or_gzip(self):
        rows = [
            "0,1,allocate,0x100,64,0",
            "0,2,allocate,0x200,32,7",
            "1,3,free,0x200,32,0",  # freed on another stream: allowed
            "0,4,allocate,0x200,16,0",  # the pointer again, once free
            "0,5,free,0x100,64,0",
        ]
        for gz in (False, True):
            r = check_trace(write(self.path(f"t{gz}.csv"), rows, gz))
            self.assertTrue(r["ok"], r)
            self.assertEqual((r["rows"], r["allocations"], r["frees"]), (5, 3, 2))
            self.assertEqual((r["peak_live_bytes"], r["live_at_end"], r["streams"]), (96, 1, 2))

    def test_problems_are_named(self):
        rows = [
            "0,1,allocate,0x100,64,0",
            "0,2,free,0x100,65,0",  # wrong size
            "0,3,allocate,0x100,8,0",  # still live
            "0,4,free,0x900,8,0",  # never allocated
            "0,5,allocate failure,0x0,4096,0",
            "0,6,resize,0x100,8,0",
            "0,7,free,0x100",
        ]
        r = check_trace(write(self.path("bad.csv"), rows))
        self.assertFalse(r["ok"])
        self.assertEqual(len(r["problems"]), 6, r["problems"])
        for line, what in zip(range(3, 9), ["not matching", "allocated while live", "not matching",
                                             "allocation failure", "unknown action", "fields"]):
            self.assertIn(f"line {line}:", r["problems"][line - 3])
            self.assertIn(what, r["problems"][line - 3])

    def test_header_and_emptiness(self):
        with open(self.path("h.csv"), "w") as f:
            f.write("a,b\n0,1,allocate,0x100,64,0\n")
        self.assertFalse(check_trace(self.path("h.csv"))["ok"])
        self.assertFalse(check_trace(write(self.path("e.csv"), []))["ok"])

    def test_a_wrong_header_or_a_bad_number_is_a_problem_with_every_key(self):
        # Before, a wrong header gave a report without `peak_live_bytes` (the
        # driver's line raised KeyError) and `0xZZ` raised ValueError.
        good = check_trace(write(self.path("g.csv"), ["0,1,allocate,0x100,64,0"]))
        with open(self.path("h.csv"), "w") as f:
            f.write("a,b\n0,1,allocate,0x100,64,0\n")
        header = check_trace(self.path("h.csv"))
        self.assertEqual(header.keys(), good.keys())
        self.assertFalse(header["ok"])
        self.assertEqual(header["problems"], ["line 1: expected 6 fields, found 2"])
        bad = check_trace(write(self.path("n.csv"), ["0,1,allocate,0x100,64,0", "0,2,free,0xZZ,64,0",
                                                     "0,3,free,0x100,6x,0"]))
        self.assertEqual(bad.keys(), good.keys())
        self.assertFalse(bad["ok"])
        self.assertEqual([p.split(":")[0] for p in bad["problems"]], ["line 3", "line 4"])
        self.assertIn("`0xZZ`", bad["problems"][0])
        self.assertEqual((bad["rows"], bad["live_at_end"]), (1, 1))

    def test_numbers_memres_refuses_are_problems_in_its_words(self):
        # As memres_core::trace::Record::parse reads them: ASCII digits
        # only. Before, Python's int() took a sign, `_` between digits and
        # other scripts' digits (Arabic-Indic one here), and no `(nil)`.
        rows = [
            "0,1,allocate,0x100,64,0",
            "0,2,allocate,0x200,+5,0",
            "0,3,allocate,0x300,1_0,0",
            "0,4,allocate,0x400,\u0661,0",
            "0,5,allocate,+400,8,0",
            "0,6,allocate,0x4_00,8,0",
            "0,7,allocate,\u0661,8,0",
            "0,8,allocate,0x500,18446744073709551616,0",
            "0,9,allocate,0x10000000000000000,8,0",
            "0,10,allocate,0x,8,0",
            " 0 , 11 ,free, 100 , 64 , 0 ",  # trimmed, as memres trims
            "0,12,allocate failure,(nil),8,0",
        ]
        r = check_trace(write(self.path("n.csv"), rows))
        self.assertEqual(r["problems"], [
            "line 3: size `+5` is not a number",
            "line 4: size `1_0` is not a number",
            "line 5: size `\u0661` is not a number",
            "line 6: pointer `+400` is not a hex number",
            "line 7: pointer `0x4_00` is not a hex number",
            "line 8: pointer `\u0661` is not a hex number",
            "line 9: size `18446744073709551616` is past 64 bits (above 18446744073709551615)",
            "line 10: pointer `0x10000000000000000` is past 64 bits (above 0xffffffffffffffff)",
            "line 11: pointer `0x` is not a hex number",
            "line 13: allocation failure of 8 bytes",  # read, and a problem of the recording
        ])
        self.assertEqual((r["rows"], r["frees"], r["live_at_end"], r["streams"]), (3, 1, 0, 1))

    def test_an_allocate_failure_with_a_pointer_is_a_problem_in_memres_words(self):
        # A failure allocated nothing: memres and RMM log it with the null
        # pointer, and memres refuses a failure with another. Before, the
        # check read it as a failure.
        r = check_trace(write(self.path("f.csv"), ["0,1,allocate,0x100,64,0", "0,2,allocate failure,0x200,8,0"]))
        self.assertEqual(r["problems"], ["line 3: an allocate failure with pointer `0x200` (a failure's is null)"])

    def test_a_header_memres_refuses_is_a_problem(self):
        # memres's trim keeps \x1c-\x1f, so this first line is a row to it:
        # `memres replay` exits 2 with "line 1: unknown action `Action`".
        # Once, str.strip() took the \x1c off and the header passed.
        path = self.path("fs.csv")
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write("\x1c" + HEADER + "\n0,1,allocate,0x100,64,0\n0,2,free,0x100,64,0\n")
        r = check_trace(path)
        self.assertFalse(r["ok"], r)
        self.assertEqual(r["problems"], ["line 1: unknown action `Action`"])

    def test_a_header_of_other_columns_is_a_problem_as_memres_refuses_it(self):
        # As memres_core::trace::read: a header in another order would
        # have its rows read in the format's (every size the stream's 0).
        path = self.path("o.csv")
        with open(path, "w") as f:
            f.write("Thread,Time,Action,Pointer,Stream,Size\n0,1,allocate,0x100,0,64\n")
        r = check_trace(path)
        self.assertFalse(r["ok"], r)
        self.assertEqual(r["problems"][0], f"line 1: a header other than `{HEADER}`")
        with open(path, "w") as f:
            f.write(" Thread , Time,Action,Pointer,Size,Stream\n0,1,allocate,0x100,64,0\n0,2,free,0x100,64,0\n")
        self.assertTrue(check_trace(path)["ok"])

    def test_headers_are_skipped_wherever_memres_skips_them_and_none_is_required(self):
        # As memres_core::trace::read: a header (trimmed, after a
        # byte-order mark) and a blank line are skipped on any line, a
        # trace of rows alone is read, and a comment is no row. Before, the
        # check wanted the header on line 1 and read nothing under another.
        traces = {
            "rows alone": "0,1,allocate,0x100,64,0\n0,2,free,0x100,64,0\n",
            "blank lines first": "\n \r\n" + HEADER + "\n0,1,allocate,0x100,64,0\n0,2,free,0x100,64,0\n",
            "joined by cat": "0,1,allocate,0x100,64,0\n\ufeff " + HEADER + "\r\n0,2,free,0x100,64,0\n",
        }
        for name, text in traces.items():
            path = self.path("t.csv")
            with open(path, "w", encoding="utf-8", newline="") as f:
                f.write(text)
            r = check_trace(path)
            self.assertTrue(r["ok"], (name, r))
            self.assertEqual((r["rows"], r["live_at_end"]), (2, 0), name)
        path = self.path("c.csv")
        with open(path, "w") as f:
            f.write("# recorded on an H100\n" + HEADER + "\n0,1,allocate,0x100,64,0\n")
        self.assertEqual(check_trace(path)["problems"], ["line 1: expected 6 fields, found 1"])

    def test_empty_blocks_at_null_are_live_at_once_as_memres_reads_them(self):
        # Zero bytes at the null pointer is RMM's answer to a zero-byte
        # request, which any number of allocations hold at once: memres's
        # workload reader replays each, and a null free of zero bytes frees
        # one of them. Before, the second was "0x0 allocated while live".
        rows = [
            "0,1,allocate,0x0,0,0",
            "0,2,allocate,(nil),0,1",
            "0,3,allocate,0x100,64,0",
            "0,4,free,0x0,0,1",
            "0,5,free,0x100,64,0",
        ]
        r = check_trace(write(self.path("empty.csv"), rows))
        self.assertTrue(r["ok"], r)
        self.assertEqual((r["allocations"], r["frees"], r["live_at_end"], r["peak_live_bytes"]), (3, 2, 1, 64))
        # A free of more empty blocks than are live is a stray free.
        r = check_trace(write(self.path("stray.csv"), rows + ["0,6,free,0x0,0,0", "0,7,free,0x0,0,0"]))
        self.assertEqual(r["problems"], ["line 8: free of 0x0 (0 bytes) not matching a live allocation"])
        self.assertEqual(r["live_at_end"], 0)

    def test_a_line_longer_than_memres_reads_is_read_no_further(self):
        # As memres_core::trace::read: 4096 bytes a line at most, and past
        # them nothing is read. Before, the whole line was read first: a
        # file with no line break (here 32 MiB of a gzip) went into memory.
        row = "0,1,allocate,0x100,64,"
        rows = [row + "s" * (rmm_log.MAX_LINE - len(row)), "0,2,free,0x100,64,0"]
        r = check_trace(write(self.path("4096.csv"), rows))
        self.assertTrue(r["ok"], r)
        r = check_trace(write(self.path("4097.csv"), [rows[0] + "s", rows[1], "0,3,resize,0x100,64,0"]))
        self.assertEqual(r["problems"], ["line 2: longer than 4096 bytes"])
        path = self.path("endless.csv.gz")
        with gzip.open(path, "wb") as f:
            f.write(HEADER.encode() + b"\n")
            for _ in range(32):
                f.write(b"7" * (1 << 20))
        tracemalloc.start()
        try:
            r = check_trace(path)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        self.assertEqual(r["problems"], ["line 2: longer than 4096 bytes"])
        self.assertLess(peak, 1 << 20)

    def test_a_crlf_line_break_is_not_counted_in_the_longest_line(self):
        # As memres_core::trace::read: a line of 4096 bytes ending in \r\n
        # (a trace saved on Windows) is read, one byte more is not, and
        # only one \r before the \n is the line break. Before, the check
        # read 4097 bytes a line and refused the first as longer.
        row = "0,1,allocate,0x100,64,0"
        longest = row + " " * (rmm_log.MAX_LINE - len(row))
        for rest in ["\r\n0,2,free,0x100,64,0\r\n", "\r\n", ""]:
            path = self.path("crlf.csv")
            with open(path, "w", encoding="utf-8", newline="") as f:
                f.write(HEADER + "\r\n" + longest + rest)
            r = check_trace(path)
            self.assertEqual((r["problems"], r["allocations"]), ([], 1), repr(rest))
        for longer in [longest + " \r\n", longest + " \n", longest + " ", longest + "\r\r\n", longest + "\r"]:
            path = self.path("crlf.csv")
            with open(path, "w", encoding="utf-8", newline="") as f:
                f.write(HEADER + "\r\n" + longer)
            self.assertEqual(check_trace(path)["problems"], ["line 2: longer than 4096 bytes"], repr(longer[-3:]))

    def test_a_gzip_cut_short_or_corrupt_is_a_problem(self):
        # memres's reading ends with the decoder's error. Before, the check
        # raised EOFError (cut short) or BadGzipFile (corrupt).
        rows = ["0,1,allocate,0x100,64,0", "0,2,free,0x100,64,0"] * 2000
        whole = open(write(self.path("t.csv.gz"), rows, gz=True), "rb").read()
        corrupt = bytearray(whole)
        corrupt[3] = 0xff  # reserved flag bits
        for name, data in [("cut", whole[:len(whole) // 2]), ("corrupt", bytes(corrupt))]:
            path = self.path(f"{name}.csv.gz")
            with open(path, "wb") as f:
                f.write(data)
            r = check_trace(path)
            self.assertFalse(r["ok"], (name, r))
            [problem] = r["problems"]
            self.assertRegex(problem, r"^line \d+: the gzip data is cut short or corrupt \(", name)

    def test_sizes_memres_refuses_are_problems_in_its_words(self):
        # As memres's workload reader refuses them (`memres replay` exits 2,
        # "line 2: malformed line: a size of ..."). Before, the check passed
        # them. A refused row is left out.
        r = check_trace(write(self.path("big.csv"), ["0,1,allocate,0x100,4611686018427387905,0",
                                                     "0,2,free,0x100,4611686018427387905,0",
                                                     "0,3,allocate,0x100,64,0", "0,4,free,0x100,64,0"]))
        self.assertFalse(r["ok"], r)
        self.assertEqual(r["problems"], [
            "line 2: a size of 4611686018427387905 bytes, above any request (2^62 bytes)",
            "line 3: free of 0x100 (4611686018427387905 bytes) not matching a live allocation",
        ])
        # Four blocks of 2^62 bytes live at once: 2^64, past any figure.
        rows = [f"0,{i},allocate,{0x100 * (i + 1):#x},4611686018427387904,0" for i in range(4)]
        r = check_trace(write(self.path("live.csv"), rows))
        self.assertEqual(r["problems"], [
            "line 5: 18446744073709551616 bytes live at once, past the most a workload counts (2^64 - 1)",
        ])
        self.assertEqual((r["allocations"], r["peak_live_bytes"]), (3, 3 << 62))

    def test_more_streams_or_allocations_than_memres_numbers_are_problems_in_its_words(self):
        # 65535 streams are memres's most; a free of no live block numbers
        # none (memres skips it).
        rows = [f"0,{i},allocate,{0x100 * (i + 1):#x},8,s{i}" for i in range(65535)]
        rows += ["0,0,free,0x1,8,stray", "0,0,allocate,0x1,8,s65535", "0,0,free,0x100,8,s65536"]
        r = check_trace(write(self.path("streams.csv"), rows))
        self.assertEqual(r["problems"], [
            "line 65537: free of 0x1 (8 bytes) not matching a live allocation",
            "line 65538: more than 65535 distinct streams",
            "line 65539: more than 65535 distinct streams",
        ])
        # 2^32 - 1 allocations are its most (ids are u32 below u32::MAX):
        # checked at a stand-in most.
        with mock.patch.object(rmm_log, "MAX_ALLOCATIONS", 2):
            r = check_trace(write(self.path("ids.csv"), ["0,1,allocate,0x100,8,0", "0,2,free,0x100,8,0",
                                                         "0,3,allocate,0x100,8,0", "0,4,allocate,0x200,8,0"]))
        self.assertEqual(r["problems"], ["line 5: more than 2^32 - 1 allocations"])

    def test_a_trace_is_read_as_utf_8_whatever_the_locale(self):
        # As memres reads it. Before, in the locale's encoding: where that
        # is ASCII (LC_ALL=C), a stream named in UTF-8 raised
        # UnicodeDecodeError.
        path = self.path("u.csv")
        with open(path, "wb") as f:
            f.write(f"{HEADER}\n0,1,allocate,0x100,64,flux-\u00e9\n0,2,free,0x100,64,0\n".encode("utf-8"))
        here = check_trace(path)
        self.assertTrue(here["ok"], here)
        self.assertEqual(here["streams"], 2)
        code = ("import json, locale, sys; sys.path.insert(0, sys.argv[1]); from rmm_log import check_trace; "
                "print(json.dumps([locale.getpreferredencoding(False), check_trace(sys.argv[2])]))")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONUTF8"}
        env.update(LC_ALL="C", LANG="C")
        p = subprocess.run([sys.executable, "-X", "utf8=0", "-c", code, EXAMPLES, path], env=env,
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        encoding, there = json.loads(p.stdout)
        self.assertNotIn("UTF", encoding.upper(), "the child's locale is not UTF-8")
        self.assertEqual(there, here)

    def test_a_line_that_is_not_utf_8_is_a_problem_and_a_byte_order_mark_no_text(self):
        # As memres reads them (`line 3: not UTF-8 (byte 13 of the line)`),
        # \r\n line breaks too. Before, the mark made a wrong header and the
        # line raised UnicodeDecodeError.
        path = self.path("b.csv")
        with open(path, "wb") as f:
            f.write(b"\xef\xbb\xbf" + HEADER.encode() + b"\r\n0,1,allocate,0x100,64,0\r\n0,2,free,0x1\xff00,64,0\n"
                    b"0,3,free,0x100,64,0\r\n")
        r = check_trace(path)
        self.assertEqual(r["problems"], ["line 3: not UTF-8 (byte 13 of the line)"])
        self.assertEqual((r["rows"], r["frees"], r["live_at_end"], r["streams"]), (2, 1, 0, 1))


class FakeWorker:
    """Stands for a worker that ran and wrote TRACES[name] as its trace."""

    def __init__(self, cmd, stdout, env, **_):
        name = cmd[cmd.index("--worker") + 1]
        csv = env["MEMRES_STACK"].split("file=", 1)[1][:-1]
        with open(csv, "w") as f:
            f.write(TRACES[name])
        stdout.write("RESULT " + json.dumps({"name": name}) + "\n")
        stdout.flush()
        self.pid, self.returncode = 0, 0

    def wait(self, timeout=None):
        return self.returncode


TRACES = {
    "cupy_arrays": "a,b\n0,1,allocate,0x100,64,0\n",
    "cupy_dataframe": HEADER + "\n0,1,allocate,0xZZ,64,0\n",
    "cupy_kmeans_pca": HEADER + "\n0,1,allocate,0x100,64,0\n0,2,free,0x100,64,0\n",
}


class Driver(unittest.TestCase):
    """The driver past the workers (stood for by FakeWorker): no GPU."""

    def test_a_trace_that_fails_its_check_is_a_fail_line_and_the_others_go_on(self):
        import record

        with tempfile.TemporaryDirectory() as out, tempfile.NamedTemporaryFile() as so:
            args = argparse.Namespace(out=out, only=",".join(TRACES), dry_run=False, device="cuda", so=so.name,
                                      plain=False, timeout=10)
            printed = io.StringIO()
            with mock.patch.object(record.subprocess, "Popen", FakeWorker), contextlib.redirect_stdout(printed):
                status = record.driver(args)
            with open(os.path.join(out, "summary.json")) as f:
                summary = json.load(f)
            self.assertEqual(status, 1, printed.getvalue())
            self.assertEqual(summary["failed"], ["cupy_arrays", "cupy_dataframe"])
            lines = printed.getvalue().splitlines()
            self.assertIn("FAIL (line 1: expected 6 fields, found 2", lines[0])
            self.assertIn("FAIL (line 2: pointer `0xZZ` is not a hex number", lines[1])
            self.assertTrue(lines[2].endswith("OK held-out"), lines[2])
            # Only the trace that passed is gzipped; the others stay plain.
            self.assertEqual(sorted(n for n in os.listdir(out) if n.endswith(".csv") or n.endswith(".gz")),
                             ["cupy_arrays.csv", "cupy_dataframe.csv", "cupy_kmeans_pca.csv.gz"])

    def test_a_worker_s_log_is_read_as_utf_8_whatever_the_locale(self):
        # Before, in the locale's encoding: where that is ASCII (LC_ALL=C),
        # a log with UTF-8 text raised UnicodeDecodeError and the driver
        # stopped with no summary.
        code = r"""if True:
            import argparse, json, locale, sys
            sys.path.insert(0, sys.argv[1])
            import record

            class Worker:
                def __init__(self, cmd, stdout, **_):
                    name = cmd[cmd.index("--worker") + 1]
                    text = "caf\u00e9 \u2713 RESULT-less\n" if name == "cupy_dataframe" else ""
                    result = "" if text else "RESULT " + json.dumps({"name": name}) + "\n"
                    stdout.buffer.write(("d\u00e9j\u00e0 vu\n" + text + result).encode("utf-8"))
                    stdout.flush()
                    self.pid, self.returncode = 0, 1 if text else 0

                def wait(self, timeout=None):
                    return self.returncode

            record.subprocess.Popen = Worker
            args = argparse.Namespace(out=sys.argv[2], only="cupy_arrays,cupy_dataframe", dry_run=True,
                                      device="cpu", so=None, plain=False, timeout=10)
            print(locale.getpreferredencoding(False))
            sys.exit(record.driver(args))
        """
        env = {k: v for k, v in os.environ.items() if k != "PYTHONUTF8"}
        env.update(LC_ALL="C", LANG="C")
        with tempfile.TemporaryDirectory() as out:
            p = subprocess.run([sys.executable, "-X", "utf8=0", "-c", code, HERE, out], env=env,
                               capture_output=True, timeout=60)
            stdout = p.stdout.decode("ascii")
            self.assertEqual(p.returncode, 1, stdout + p.stderr.decode(errors="replace"))
            self.assertNotIn("UTF", stdout.splitlines()[0].upper(), "the child's locale is not UTF-8")
            with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
                summary = json.load(f)
        self.assertEqual(summary["failed"], ["cupy_dataframe"])
        self.assertEqual(summary["workloads"][1]["log_tail"], "d\u00e9j\u00e0 vu\ncaf\u00e9 \u2713 RESULT-less\n")
        # The tail printed, escaped where the locale cannot print it.
        self.assertIn("    caf\\xe9 \\u2713 RESULT-less", stdout)

    def test_an_out_folder_that_a_stack_cannot_name_is_refused(self):
        with tempfile.TemporaryDirectory() as top:
            # White space as memres reads it: Unicode's (a no-break space,
            # a vertical tab), which the check took for part of a word.
            for name in ("a b", "a=b", "a,b", "a(b", "a\u00a0b", "a\x0bb", "a\u3000b"):
                out = os.path.join(top, name)
                cmd = [sys.executable, os.path.join(HERE, "record.py"), "--device", "cpu", "--dry-run", "--out", out]
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
                self.assertNotEqual(p.returncode, 0, name)
                self.assertIn("cannot be named in a memres stack", p.stderr, name)
                self.assertFalse(os.path.exists(out), name)


class Registry(unittest.TestCase):
    def test_names_targets_and_held_out(self):
        names = [w.name for w in WORKLOADS]
        self.assertEqual(len(names), len(set(names)))
        self.assertGreaterEqual(len(names), 13)
        for w in WORKLOADS:
            self.assertIn(w.framework, ("torch", "cupy"))
            module, function = w.target.split(":")
            with open(os.path.join(HERE, "workloads", module + ".py")) as f:
                defined = {n.name for n in ast.parse(f.read()).body if isinstance(n, ast.FunctionDef)}
            self.assertIn(function, defined, w.name)
        held = [w for w in WORKLOADS if w.held_out]
        self.assertTrue(len(WORKLOADS) / 4 <= len(held) <= len(WORKLOADS) / 2, [w.name for w in held])
        self.assertGreaterEqual(len({w.kind for w in held}), 3)
        self.assertTrue(any(w.kind == "inference" and "dynamic" in w.name for w in held))
        self.assertTrue(any(w.framework == "cupy" for w in held))

    def test_the_replay_holds_out_the_registry_s_held_out_traces(self):
        # memres replay reads benches/data/held_out.txt; the registry is
        # where a workload is marked. The two must agree on every trace the
        # registry records (the three training traces of benches/data were
        # recorded otherwise and are all tuning ones).
        with open(os.path.join(HERE, "..", "data", "held_out.txt")) as f:
            listed = {line.split("#")[0].strip() for line in f} - {""}
        self.assertEqual(listed, {w.name for w in WORKLOADS if w.held_out})


@unittest.skipIf(numpy is None, "NumPy is not installed")
class DryRun(unittest.TestCase):
    """The driver end to end on the CPU, on the workloads that run on NumPy."""

    def run_driver(self, out, *args):
        cmd = [sys.executable, os.path.join(HERE, "record.py"), "--device", "cpu", "--dry-run", "--out", out, *args]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        with open(os.path.join(out, "summary.json")) as f:
            return p, json.load(f)

    def test_array_workloads_run(self):
        cupy = [w.name for w in WORKLOADS if w.framework == "cupy"]
        with tempfile.TemporaryDirectory() as out:
            p, summary = self.run_driver(out, "--only", ",".join(cupy))
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            self.assertEqual([r["name"] for r in summary["workloads"]], cupy)
            self.assertTrue(all(r["ok"] for r in summary["workloads"]))

    def test_a_failure_does_not_stop_the_others(self):
        with tempfile.TemporaryDirectory() as out:
            p, summary = self.run_driver(out, "--only", "cupy_arrays,cupy_dataframe", "--timeout", "0")
            self.assertEqual(p.returncode, 1)
            self.assertEqual(summary["failed"], ["cupy_arrays", "cupy_dataframe"])
            self.assertIn("timed out", summary["workloads"][1]["why"])


if __name__ == "__main__":
    unittest.main()
