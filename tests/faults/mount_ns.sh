# mount_ns.sh: sourced by the fault tests that mount a small tmpfs (a disk that fills up). in_mount_namespace "$0"
# "$@" runs the calling script again, with its arguments, in a mount namespace of its own (as root, or as root of an
# unprivileged user namespace), so that its mounts disappear with its processes whatever happens to them; returns
# at once inside it. Exit code 77 (skipped) where no such namespace can be made.
in_mount_namespace() {
  [ -n "${MGRL_DISK_FULL_NS:-}" ] && return 0
  export MGRL_DISK_FULL_NS=1
  local how
  for how in "--mount" "--user --map-root-user --mount"; do
    # shellcheck disable=SC2086
    if unshare $how --propagation private true 2>/dev/null; then
      exec unshare $how --propagation private bash "$@"
    fi
  done
  echo "SKIP: no mount namespace can be made here (needs root or unprivileged user namespaces)"
  exit 77
}
