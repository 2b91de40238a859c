#!/usr/bin/env bash
# export_disk_full.sh: `mgrl export` of a newer checkpoint over an earlier export (adapter + merged model) on a disk
# with room for one export but not for two (a tmpfs in a mount namespace of the test's own). The export fails (exit 2,
# one line naming the full disk), and the earlier export is left whole: every file as it was, no staging directory
# or temporary left (until 2026-11-28 the new adapter replaced the old one and the merged model stayed the old one's:
# a directory mixing two exports). With room again the export succeeds, replacing every file.
#   export_disk_full.sh WORK -- MGRL SFT_ARGS...
set -uo pipefail
# shellcheck source=mount_ns.sh
source "$(dirname "$0")/mount_ns.sh"
in_mount_namespace "$0" "$@"
work=$1
shift
[ "$1" = -- ] && shift
mgrl=$1
shift

rm -rf "$work" && mkdir -p "$work/disk" || exit 1
fail() { echo "FAIL: $*"; echo "--- stderr"; cat "$work/err" 2>/dev/null; exit 1; }
trap 'umount "$work/disk" 2>/dev/null' EXIT
"$mgrl" "$@" --train.max_steps=4 --checkpoint.every_steps=2 --checkpoint.dir="$work/ck" --log.dir= > "$work/train.log" 2>&1 ||
  fail "training failed: $(cat "$work/train.log")"
export_to() {  # OUT CHECKPOINT
  "$mgrl" export --checkpoint.dir="$work/ck" --export.checkpoint="$2" --export.output="$1" --export.merged=true
}
export_to "$work/probe" "$work/ck/step_00000002.h5" > /dev/null 2>&1 || fail "the probe export failed"
kib=$(( $(du -sk "$work/probe" | cut -f1) * 3 / 2 ))
if ! mount -t tmpfs -o size=${kib}k tmpfs "$work/disk"; then
  echo "SKIP: cannot mount a tmpfs here"
  exit 77
fi
out=$work/disk/out
export_to "$out" "$work/ck/step_00000002.h5" > /dev/null 2> "$work/err" || fail "the first export (room for it) failed"
sums() { (cd "$out" && find . -type f | sort | xargs sha256sum); }
before=$(sums)
rc=0
export_to "$out" "$work/ck/step_00000004.h5" > "$work/out.log" 2> "$work/err" || rc=$?
echo "second export on a disk of ${kib} KiB (one export fits): exit $rc"; cat "$work/err"
[ "$rc" = 2 ] || fail "exit code $rc, expected 2"
[ "$(grep -c '^mgrl:' "$work/err")" = 1 ] || fail "not one line from mgrl"
grep -q "No space left on device" "$work/err" || fail "the line does not say the disk is full"
[ "$(sums)" = "$before" ] || fail "the earlier export changed: $(diff <(echo "$before") <(sums))"
[ -z "$(ls -A "$out" | grep -v '^adapter_\|^merged$\|^tokenizer\|^special_tokens_map\.json$\|^chat_template\.jinja$')" ] ||
  fail "left in the output: $(ls -A "$out")"
[ -z "$(ls -A "$out/merged" | grep '\.tmp\.')" ] || fail "a temporary left in merged/: $(ls -A "$out/merged")"
mount -o remount,size=$((kib * 4))k "$work/disk" || fail "cannot enlarge the tmpfs"
export_to "$out" "$work/ck/step_00000004.h5" > /dev/null 2> "$work/err" || fail "the export with room failed"
after=$(sums)
[ "$(grep -c . <<< "$after")" = "$(grep -c . <<< "$before")" ] || fail "not the same files"
[ -z "$(comm -12 <(echo "$before") <(echo "$after") | grep -v 'config\.json\|generation_config\|tokenizer')" ] ||
  fail "some weights were not replaced: $(comm -12 <(echo "$before") <(echo "$after"))"
echo "PASS: a failed re-export left the earlier export whole; with room, every file was replaced"
