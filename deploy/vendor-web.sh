#!/usr/bin/env bash
# vendor-web.sh: fetch the dashboard's one third-party file set from the npm
# registry into web/vendor/, so the coordinator serves plain static files
# with no build step and no network access at run time.
#
# Library: uPlot (https://github.com/leeoniya/uPlot), MIT licence, pinned below.
# Why uPlot: the job page plots loss and throughput over thousands of steps
# and refreshes them every few seconds; uPlot is ~50 KB minified, has no
# dependencies, draws to canvas (fast with large series), ships a ready
# IIFE build (no bundler), and is actively maintained. The pipeline timeline
# is NOT drawn with it: a Gantt chart of F/I/W/B blocks is simpler and more
# precise as hand-built SVG (one <rect> per action, addressable by tests).
#
# Usage: deploy/vendor-web.sh            (re-vendor the pinned version)
#        UPLOT_VERSION=x.y.z deploy/vendor-web.sh
# npm verifies the tarball against the registry's integrity hash; the files
# written are listed with their sha256 in web/vendor/VERSIONS.
set -euo pipefail
cd "$(dirname "$0")/.."
UPLOT_VERSION=${UPLOT_VERSION:-1.6.32}
OUT=web/vendor

command -v npm >/dev/null || { echo "vendor-web: npm not found (apt-get install npm)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

(cd "$tmp" && npm pack --silent "uplot@$UPLOT_VERSION" >/dev/null)
tar -xzf "$tmp"/uplot-"$UPLOT_VERSION".tgz -C "$tmp"
pkg="$tmp/package"
for f in dist/uPlot.iife.min.js dist/uPlot.min.css LICENSE; do
  [ -f "$pkg/$f" ] || { echo "vendor-web: uplot@$UPLOT_VERSION has no $f" >&2; exit 1; }
done

mkdir -p "$OUT"
cp "$pkg/dist/uPlot.iife.min.js" "$OUT/uPlot.iife.min.js"
cp "$pkg/dist/uPlot.min.css" "$OUT/uPlot.min.css"
cp "$pkg/LICENSE" "$OUT/uPlot.LICENSE"
{
  echo "# written by deploy/vendor-web.sh; do not edit"
  echo "uplot $UPLOT_VERSION MIT"
  (cd "$OUT" && sha256sum uPlot.iife.min.js uPlot.min.css uPlot.LICENSE)
} >"$OUT/VERSIONS"
echo "vendor-web: uplot $UPLOT_VERSION -> $OUT"
