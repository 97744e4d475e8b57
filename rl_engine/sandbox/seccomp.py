"""The seccomp filter every sandbox runs under: system calls that reach kernel surface user code never needs.

Built with libseccomp (Debian's `libseccomp2`, through the pinned pip package `pyseccomp`, which is ctypes over
it) and handed to bubblewrap as a compiled BPF program (`bwrap --seccomp FD`). bwrap loads it last, just before
it starts the command, so bwrap itself can still build the sandbox (mounts, namespaces) first; everything the
command starts inherits it and cannot remove it.

Denied with EPERM (the call fails, the code goes on):

- new user namespaces: `unshare` and `clone` with CLONE_NEWUSER. As root the sandbox cannot use bwrap's
  `--disable-userns` (bwrap 0.8 refuses it together with `--userns-block-fd`), and in a nested user namespace
  code would be root enough to mount its own tmpfs past `Limits.tmp_mb`;
- `clone3` answers ENOSYS instead: its flags sit in a struct a filter cannot read, and the C library then falls
  back to `clone`, whose flags it can;
- mounts: `mount`, `umount2`, `pivot_root`, `chroot` and the new mount API (`fsopen`, `fsconfig`, `fsmount`,
  `fspick`, `move_mount`, `open_tree`, `mount_setattr`), and joining other namespaces (`setns`);
- the kernel keyrings: `keyctl`, `add_key`, `request_key` (on top of a fresh session keyring per sandbox);
- `ptrace`, `bpf`, `perf_event_open`, `userfaultfd` (the usual helpers of kernel exploits).

System calls of other architectures (32-bit `int 0x80`, x32) kill the process: the filter is written for the
native one only. Standard library only, apart from `pyseccomp`, imported when the filter is first built.
"""

from __future__ import annotations

import errno
import functools
import os
from dataclasses import dataclass

CLONE_NEWUSER = 0x10000000
DENIED = (
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "chroot",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "setns",
    "keyctl",
    "add_key",
    "request_key",
    "ptrace",
    "bpf",
    "perf_event_open",
    "userfaultfd",
)
NEW_USER_NAMESPACE = ("unshare", "clone")  # denied when the flags (first argument) hold CLONE_NEWUSER
UNSUPPORTED = ("clone3",)  # ENOSYS: the C library falls back to clone


@dataclass(frozen=True)
class SeccompFilter:
    program: bytes | None  # the compiled BPF program, or None where none can be built
    detail: str  # what it denies, or why there is none


@functools.cache
def seccomp_filter() -> SeccompFilter:
    """The filter, compiled once per process."""
    try:
        import pyseccomp
    except (ImportError, RuntimeError) as exc:  # RuntimeError: pyseccomp found no libseccomp
        return SeccompFilter(None, f"no seccomp filter: libseccomp cannot be loaded ({exc}); install libseccomp2")
    try:
        return SeccompFilter(_compile(pyseccomp), f"seccomp filter denying {len(_denied(pyseccomp))} system calls")
    except OSError as exc:
        return SeccompFilter(None, f"no seccomp filter: libseccomp refused it ({exc})")


def _denied(pyseccomp) -> list[str]:
    """The names of DENIED this architecture has (umount exists only on some)."""
    return [name for name in (*DENIED, *NEW_USER_NAMESPACE, *UNSUPPORTED) if _number(pyseccomp, name) >= 0]


def _number(pyseccomp, name: str) -> int:
    return pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)


def _compile(pyseccomp) -> bytes:
    rules = pyseccomp.SyscallFilter(defaction=pyseccomp.ALLOW)
    known = set(_denied(pyseccomp))
    for name in DENIED:
        if name in known:
            rules.add_rule(pyseccomp.ERRNO(errno.EPERM), name)
    for name in NEW_USER_NAMESPACE:
        new_user = pyseccomp.Arg(0, pyseccomp.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER)
        rules.add_rule(pyseccomp.ERRNO(errno.EPERM), name, new_user)
    for name in UNSUPPORTED:
        if name in known:
            rules.add_rule(pyseccomp.ERRNO(errno.ENOSYS), name)
    fd = os.memfd_create("seccomp-filter", os.MFD_CLOEXEC)
    try:
        with os.fdopen(os.dup(fd), "wb") as out:
            rules.export_bpf(out)
        os.lseek(fd, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def keyctl_number() -> int | None:
    """The keyctl system call's number here (the sandbox's launcher joins a fresh session keyring with it)."""
    try:
        import pyseccomp
    except (ImportError, RuntimeError):
        return None
    number = _number(pyseccomp, "keyctl")
    return number if number >= 0 else None
