#!/usr/bin/env bash
# User code (python rewards, environments, agent commands) runs in a bubblewrap sandbox (rl_engine/sandbox.py);
# socat serves an agent's endpoint inside it. Both come from Debian, like chromium for the browser tests.
set -euo pipefail
missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
command -v socat >/dev/null 2>&1 || missing+=(socat)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "sandbox: missing ${missing[*]}, installing from Debian"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
fi
bwrap --version
# Unprivileged user namespaces must be on for bwrap (Debian's default); say so plainly when they are not.
if ! bwrap --unshare-user --unshare-pid --unshare-net --ro-bind /usr /usr --symlink usr/lib /lib \
    --symlink usr/lib64 /lib64 --symlink usr/bin /bin --proc /proc --dev /dev /usr/bin/true; then
  echo "sandbox: bwrap cannot create namespaces here; enable unprivileged user namespaces" \
    "(sysctl -w user.max_user_namespaces=15000 kernel.unprivileged_userns_clone=1) or user code will be refused" >&2
fi
