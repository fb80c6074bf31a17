#!/usr/bin/env bash
# The screenshot in docs/building.md: the `maskstream inspect --html` page of a dataset (default: the
# demo's, from `make demo`), opened in headless Chromium at 1280 px and saved as a small PNG.
#   scripts/screenshot_inspect.sh [DATASET] [PNG]      (WORD=protein searches the page for a word first)
set -euo pipefail
cd "$(dirname "$0")/.."

DATASET="${1:-out/demo/dataset}"
PNG="${2:-docs/images/inspect-html.png}"
MASKSTREAM="${MASKSTREAM:-maskstream}"
PYTHON="${PYTHON:-python3}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

BROWSER="$(command -v chromium-headless-shell || command -v chromium || command -v google-chrome || true)"
if [ -z "$BROWSER" ]; then
  echo "no headless browser: install one with 'apt-get install chromium-headless-shell' (Debian, as root)" >&2
  exit 1
fi

$MASKSTREAM inspect "$DATASET" --samples 0 --no-verify --plot "$WORK/plot.png" --html "$WORK/page.html" \
  --html-sequences "${SEQUENCES:-200}"
mkdir -p "$(dirname "$PNG")"
"$BROWSER" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --hide-scrollbars --force-device-scale-factor=1 \
  --user-data-dir="$WORK/profile" --window-size=1280,820 --screenshot="$WORK/shot.png" \
  "file://$WORK/page.html${WORD:+#word=$WORD}" 2>/dev/null
# A 256-colour palette keeps the committed PNG small; the viridis cells and text stay distinct.
"$PYTHON" -c 'import sys; from PIL import Image
Image.open(sys.argv[1]).convert("RGB").quantize(colors=256).save(sys.argv[2], optimize=True)' "$WORK/shot.png" "$PNG"
echo "wrote $PNG ($(wc -c < "$PNG") bytes)"
