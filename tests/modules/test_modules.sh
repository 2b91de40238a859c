#!/usr/bin/env bash
# test_modules.sh: the installed modulefiles with real Lmod, in a clean environment (env -i):
#   lua | tcl     module use, module load mgrl: mgrl --version from PATH is the installed binary, MGRL_ROOT and
#                 MGRL_SHARE point into the prefix, whatis and help say what mgrl is; module unload restores PATH
#                 and unsets them
#   depends_on    the toolchain modules named at configure time are loaded with mgrl and unloaded with it
#   prereq        mgrl refuses to load without them, and loads once they are
#   scripts       the installed batch scripts and inputs hold no build-tree or source-tree path
# Usage: test_modules.sh CASE PREFIX SOURCE_DIR BUILD_DIR WORK_DIR VERSION   (exit 77 only when Lmod cannot be had)
set -euo pipefail
case_=$1 prefix=$2 src=$3 build_dir=$4 work=$5 version=$6
lmod_init=/usr/share/lmod/lmod/init/bash
if [ ! -f "$lmod_init" ]; then
  echo "SKIPPED: Lmod is not installed (Debian: apt-get install lmod; scripts/install_deps.sh does it)"
  exit 77
fi
[ -x "$prefix/bin/mgrl" ] || { echo "FAIL: no installed mgrl at $prefix/bin/mgrl (did the install fixture run?)"; exit 1; }
mkdir -p "$work"
w=$(mktemp -d "$work/$case_.XXXXXX")

# Runs a bash script with Lmod in a clean environment (the only thing kept is a plain PATH).
lmod_sh() {
  env -i HOME="$w" PATH=/usr/local/bin:/usr/bin:/bin bash -c "set -euo pipefail; source $lmod_init; $1"
}

check_load_unload() {  # $1: module directory
  local out
  out=$(lmod_sh "
    before=\$PATH
    module use $1
    module load mgrl
    echo \"mgrl at: \$(command -v mgrl)\"
    echo \"version: \$(mgrl --version)\"
    echo \"MGRL_ROOT=\$MGRL_ROOT\"
    echo \"MGRL_SHARE=\$MGRL_SHARE\"
    test -f \"\$MGRL_SHARE/slurm/grpo_2xV100.sh\" && echo 'slurm scripts: present'
    test -f \"\$MGRL_SHARE/docs/cluster.md\" && echo 'docs: present'
    module whatis mgrl 2>&1 | tr -s ' ' | sed 's/^/whatis: /'
    module help mgrl 2>&1 | sed 's/^/help: /'
    module unload mgrl
    [ \"\$PATH\" = \"\$before\" ] && echo 'after unload: PATH restored'
    [ -z \"\${MGRL_ROOT:-}\" ] && [ -z \"\${MGRL_SHARE:-}\" ] && echo 'after unload: MGRL_ROOT and MGRL_SHARE unset'
    command -v mgrl >/dev/null || echo 'after unload: no mgrl on PATH'
  ")
  echo "$out"
  local want
  for want in "mgrl at: $prefix/bin/mgrl" "version: mgrl $version " "MGRL_ROOT=$prefix" "MGRL_SHARE=$prefix/share/mgrl" \
              "slurm scripts: present" "docs: present" "whatis: .*Version: $version" "whatis: .*LoRA fine-tuning" \
              "help: .*fine-tunes Llama" "after unload: PATH restored" "after unload: MGRL_ROOT and MGRL_SHARE unset" \
              "after unload: no mgrl on PATH"; do
    grep -q -- "$want" <<< "$out" || { echo "FAIL: expected a line matching '$want'"; exit 1; }
  done
}

# Modulefiles for the prefix that need a toolchain module (written by the same CMake script as the install),
# and that toolchain module itself.
write_dependent() {  # $1 mode
  mkdir -p "$w/tools/mgrltool"
  cat > "$w/tools/mgrltool/1.0.lua" <<'LUA'
whatis("a stand-in for a compiler or MPI module")
setenv("MGRLTOOL_LOADED", "yes")
LUA
  cmake -DMGRL_MF_PREFIX="$prefix" -DMGRL_MF_VERSION="$version" -DMGRL_MF_DEPENDS="mgrltool/1.0" \
        -DMGRL_MF_DEPENDS_MODE="$1" -DMGRL_MF_TEMPLATES="$src/modulefiles" -DMGRL_MF_OUT="$w/mf" \
        -P "$src/cmake/MgrlModulefiles.cmake"
}

case $case_ in
  lua) check_load_unload "$prefix/share/mgrl/modulefiles" ;;
  tcl)
    head -n 1 "$prefix/share/mgrl/modulefiles-tcl/mgrl/$version" | grep -q '^#%Module' || { echo "FAIL: not a Tcl modulefile"; exit 1; }
    check_load_unload "$prefix/share/mgrl/modulefiles-tcl" ;;
  depends_on)
    write_dependent depends_on
    for flavour in lua tcl; do
      out=$(lmod_sh "
        module use $w/tools; module use $w/mf/$flavour
        module load mgrl
        echo \"loaded: \$(module -t list 2>&1 | tr '\n' ' ')\"
        echo \"MGRLTOOL_LOADED=\${MGRLTOOL_LOADED:-no}\"
        module unload mgrl
        echo \"after unload: \$(module -t list 2>&1 | tr '\n' ' ') MGRLTOOL_LOADED=\${MGRLTOOL_LOADED:-no}\"
      ")
      echo "[$flavour] $out"
      grep -q "^loaded: .*mgrltool/1.0.*mgrl/$version" <<< "$out" || { echo "FAIL [$flavour]: mgrltool not loaded with mgrl"; exit 1; }
      grep -q "^MGRLTOOL_LOADED=yes" <<< "$out" || { echo "FAIL [$flavour]: the toolchain module's environment is missing"; exit 1; }
      grep -q "^after unload: .*MGRLTOOL_LOADED=no" <<< "$out" && ! grep -q "^after unload: .*mgrltool" <<< "$out" ||
        { echo "FAIL [$flavour]: mgrltool was not unloaded with mgrl"; exit 1; }
    done ;;
  prereq)
    write_dependent prereq
    for flavour in lua tcl; do
      rc=0
      out=$(lmod_sh "module use $w/tools; module use $w/mf/$flavour; module load mgrl" 2>&1) || rc=$?
      echo "[$flavour] load without the prerequisite: rc $rc: $out"
      [ "$rc" != 0 ] || { echo "FAIL [$flavour]: mgrl loaded without its prerequisite"; exit 1; }
      out=$(lmod_sh "module use $w/tools; module use $w/mf/$flavour; module load mgrltool/1.0; module load mgrl; command -v mgrl")
      echo "[$flavour] with the prerequisite: $out"
      [ "$(tail -n 1 <<< "$out")" = "$prefix/bin/mgrl" ] || { echo "FAIL [$flavour]: mgrl not on PATH after loading"; exit 1; }
    done ;;
  scripts)
    bad=$(grep -rlF -e "$src" -e "$build_dir" "$prefix/share/mgrl/slurm" "$prefix/share/mgrl/inputs" || true)
    [ -z "$bad" ] || { echo "FAIL: installed files name the source or build tree: $bad"; exit 1; }
    # The installed scripts resolve the installed binary (as the batch job will: MGRL unset, nothing on PATH).
    out=$(env -i PATH=/usr/bin:/bin bash -c "source $prefix/share/mgrl/slurm/common.sh; mgrl_find_binary $prefix/share/mgrl/slurm; echo \$MGRL")
    echo "installed scripts use: $out"
    [ "$out" = "$prefix/bin/mgrl" ] || { echo "FAIL: the installed scripts would run '$out', not $prefix/bin/mgrl"; exit 1; }
    for f in grpo_2xV100.sh sft.sh multinode.sh scaling.sh common.sh; do
      [ -f "$prefix/share/mgrl/slurm/$f" ] || { echo "FAIL: slurm/$f not installed"; exit 1; }
    done
    [ -f "$prefix/share/mgrl/inputs/grpo_gsm8k.toml" ] || { echo "FAIL: inputs not installed"; exit 1; }
    echo "installed scripts: no source or build paths, binary $out" ;;
  *) echo "unknown case $case_"; exit 2 ;;
esac
echo "PASS: $case_"
