"""Screenshots of a memres snapshot in PyTorch's memory viewer, offline.

PyTorch's viewer is one script, MemoryViz.js (torch/utils/viz/ in PyTorch's
repository), that imports d3 version 5 from a CDN; the pages that
`torch.cuda._memory_viz trace_plot` writes import MemoryViz.js from a CDN
too. Neither is part of memres. Given local copies of both, this writes the
same kind of page (the snapshot embedded as base64), rewrites the imports to
the local d3, serves the folder on 127.0.0.1 and takes one headless-Chromium
screenshot per view. docs/snapshots.md shows the result.

    memres replay --passes 1 --resource pool --snapshot pool.pickle benches/data/resnet_train.csv.gz
    python3 benches/viz/viewer_screenshot.py pool.pickle --memory-viz MemoryViz.js \
        --d3 d3.v5.min.js --out docs/snapshot
"""

import argparse
import base64
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading

# The viewer's names for its views, and the file suffix of each screenshot.
VIEWS = {"Active Memory Timeline": "timeline", "Allocator State History": "segments"}

# The viewer imports d3 and four of its modules by URL; the classic d3 v5
# bundle defines all of them on `window.d3`.
LOCAL_IMPORTS = ("const d3 = window.d3;\n"
                 "const {axisLeft, scaleLinear, zoom, zoomIdentity, brushX} = d3;\n")


def local_viewer(source):
    """MemoryViz.js with its URL imports replaced by the global d3."""
    body = re.sub(r"^import [^;]*;\n", "", source, flags=re.M)
    if "window.d3" in body or "add_local_files" not in body:
        raise SystemExit("viewer_screenshot: that file is not PyTorch's MemoryViz.js")
    return LOCAL_IMPORTS + body


def page(name, pickled, view):
    """A page that loads the snapshot into the viewer and opens `view`."""
    data = pickled + b"\x00" * (3 - len(pickled) % 3)  # the viewer decodes whole 3-byte groups
    files = json.dumps([{"name": name, "base64": base64.b64encode(data).decode()}])
    return ("<!DOCTYPE html>\n<html><head><script src=\"d3.js\"></script></head><body>\n"
            "<script type=\"module\">\n"
            "import {add_local_files} from \"./viewer.js\";\n"
            f"add_local_files({files}, {json.dumps(view)});\n"
            "</script></body></html>\n")


def serve(folder):
    handler = functools.partial(QuietHandler, directory=folder)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("snapshot", help="a pickle written by memres (replay --snapshot, memres_snapshot)")
    p.add_argument("--memory-viz", required=True, help="PyTorch's torch/utils/viz/MemoryViz.js")
    p.add_argument("--d3", required=True, help="d3 version 5, the classic bundle (d3.v5.min.js)")
    p.add_argument("--out", default="snapshot", help="prefix of the PNG files (PREFIX-VIEW.png)")
    p.add_argument("--size", default="1400,900", help="window size in pixels, W,H")
    p.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    args = p.parse_args()

    with open(args.snapshot, "rb") as f:
        pickled = f.read()
    with open(args.memory_viz) as f:
        viewer = local_viewer(f.read())
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "viewer.js"), "w") as f:
            f.write(viewer)
        shutil.copy(args.d3, os.path.join(folder, "d3.js"))
        server = serve(folder)
        try:
            for view, suffix in VIEWS.items():
                html = f"{suffix}.html"
                with open(os.path.join(folder, html), "w") as f:
                    f.write(page(os.path.basename(args.snapshot), pickled, view))
                png = os.path.abspath(f"{args.out}-{suffix}.png")
                url = f"http://127.0.0.1:{server.server_port}/{html}"
                subprocess.run([args.chromium, "--headless", "--no-sandbox", "--disable-gpu",
                                "--hide-scrollbars", f"--window-size={args.size}",
                                "--virtual-time-budget=10000", f"--screenshot={png}", url],
                               check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                print(f"wrote {png} ({view})")
        finally:
            server.shutdown()


if __name__ == "__main__":
    main()
