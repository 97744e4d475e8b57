#!/usr/bin/env bash
# User code (python rewards, environments, agent commands) runs in a bubblewrap sandbox (rl_engine/sandbox/)
# under a seccomp filter built with libseccomp (rl_engine/sandbox/seccomp.py); socat serves an agent's endpoint
# inside it. All three come from Debian, like chromium for the browser tests.
set -euo pipefail
missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
command -v socat >/dev/null 2>&1 || missing+=(socat)
ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2' || missing+=(libseccomp2)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "sandbox: missing ${missing[*]}, installing from Debian"
  "$(dirname "$0")/apt_install.sh" "${missing[@]}"  # waits for apt's lock when another install holds it
fi
bwrap --version
# Unprivileged user namespaces must be on for bwrap (Debian's default); say so plainly when they are not.
if ! bwrap --unshare-user --unshare-pid --unshare-net --ro-bind /usr /usr --symlink usr/lib /lib \
    --symlink usr/lib64 /lib64 --symlink usr/bin /bin --proc /proc --dev /dev /usr/bin/true; then
  echo "sandbox: bwrap cannot create namespaces here; enable unprivileged user namespaces" \
    "(sysctl -w user.max_user_namespaces=15000 kernel.unprivileged_userns_clone=1) or user code will be refused" >&2
fi
# The kernel's limits on each sandbox (a cgroup: memory, pids, cpu) need a writable cgroup hierarchy: root, or a
# delegated cgroup v2 folder (POSTTRAIN_SANDBOX_CGROUP). Without one, sandboxes run without them and
# /api/health/ warns; say so here too.
if [ "$(id -u)" != 0 ] && [ -z "${POSTTRAIN_SANDBOX_CGROUP:-}" ]; then
  echo "sandbox: not root and no POSTTRAIN_SANDBOX_CGROUP: sandboxes get no cgroup limits unless this user's" \
    "own cgroup is delegated to it (systemd: Delegate=yes); see docs/SECURITY.md" >&2
fi
