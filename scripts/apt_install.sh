#!/usr/bin/env bash
# Installs Debian packages (none given: refreshes the package lists only). Another install holding apt's
# locks is waited for, up to APT_LOCK_TIMEOUT_S (120 s), instead of failing at once: dpkg's lock through apt's
# own DPkg::Lock::Timeout, and the package lists' lock, which `apt-get update` does not wait for (apt 2.6), by
# trying again while it is held. APT_OPTIONS adds options to every apt-get call (the tests point apt at folders
# of their own with it).
set -euo pipefail
timeout_s="${APT_LOCK_TIMEOUT_S:-120}"
read -r -a extra <<<"${APT_OPTIONS:-}"
apt=(apt-get -o "DPkg::Lock::Timeout=$timeout_s" "${extra[@]}")

update_lists() {
  local deadline=$((SECONDS + timeout_s)) errors
  errors="$(mktemp)"
  until "${apt[@]}" update -q 2>"$errors"; do
    if ! grep -q "Could not get lock" "$errors" || ((SECONDS >= deadline)); then
      cat "$errors" >&2
      rm -f "$errors"
      return 1
    fi
    echo "apt: another install holds the package lists' lock; waiting for it" >&2
    sleep 2
  done
  cat "$errors" >&2
  rm -f "$errors"
}

update_lists
if [ "$#" -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y -q "$@"
fi
