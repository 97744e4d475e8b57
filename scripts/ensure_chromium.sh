#!/usr/bin/env bash
# The e2e suite drives Debian's chromium through Playwright (Playwright's own browser download cannot
# work on these offline machines).
set -euo pipefail
if ! command -v chromium >/dev/null 2>&1; then
  echo "chromium: missing, installing from Debian"
  "$(dirname "$0")/apt_install.sh" chromium  # waits for apt's lock when another install holds it
fi
chromium --version
