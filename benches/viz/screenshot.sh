#!/usr/bin/env bash
# Renders the timeline of a shipped trace in headless Chromium and writes the
# screenshot docs/timeline.png shows (Debian: `apt-get install -y chromium`).
#
#     bash benches/viz/screenshot.sh [OUT.png]
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-docs/timeline.png}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cargo run -q -p memres-bench --bin memres -- replay --passes 1 -r pool,binning \
    --timeline "$dir/timeline.html" benches/data/transformer_train.csv.gz >/dev/null
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1000,900 \
    --screenshot="$out" "file://$dir/timeline.html" 2>/dev/null
echo "wrote $out"
