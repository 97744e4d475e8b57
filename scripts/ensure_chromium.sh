#!/usr/bin/env bash
# The e2e suite drives Debian's chromium through Playwright (Playwright's own browser download cannot
# work on these offline machines).
set -euo pipefail
if ! command -v chromium >/dev/null 2>&1; then
  echo "chromium: missing, installing from Debian"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium
fi
chromium --version
