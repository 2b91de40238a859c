#!/usr/bin/env bash
# check_easybuild.sh: the easyconfigs of packaging/easybuild parse with EasyBuild (from PyPI, in a venv) into the
# expected name, version, toolchain and dependencies, and pass `eb --check-style`.
#   check_easybuild.sh SOURCE_DIR VENV      (VENV is created with pip when missing; exit 77 only when it cannot be)
set -euo pipefail
src=$1 venv=$2
if [ ! -x "$venv/bin/eb" ]; then
  echo "check_easybuild: installing EasyBuild into $venv"
  if ! { /usr/bin/python3 -m venv "$venv" && "$venv/bin/pip" install -q easybuild-framework easybuild-easyblocks pycodestyle; }; then
    echo "SKIPPED: EasyBuild could not be installed from PyPI into $venv (no network or no python3-venv)"
    exit 77
  fi
fi
lmod_init=/usr/share/lmod/lmod/init/bash
[ -f "$lmod_init" ] || { echo "SKIPPED: EasyBuild needs a modules tool and Lmod is not installed"; exit 77; }
# shellcheck disable=SC1090
source "$lmod_init"
export PATH=$venv/bin:$PATH EB_PYTHON=$venv/bin/python
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export EASYBUILD_PREFIX=$tmp EASYBUILD_TMPDIR=$tmp
root_flag=()
[ "$(id -u)" != 0 ] || root_flag=(--allow-use-as-root-and-accept-consequences)
ecs=("$src"/packaging/easybuild/*.eb)
eb "${root_flag[@]}" --check-style "${ecs[@]}" 2>&1 | tee "$tmp/style.log"
grep -q "All style checks PASSed" "$tmp/style.log" || { echo "FAIL: eb --check-style"; exit 1; }
"$venv/bin/python" - "${ecs[@]}" <<'PY'
import sys
from easybuild.tools.options import set_up_configuration
set_up_configuration(args=['--allow-use-as-root-and-accept-consequences'], silent=True)
from easybuild.framework.easyconfig.easyconfig import process_easyconfig
want = {'HDF5', 'Boost', 'tomlplusplus', 'nlohmann_json', 'PCRE2', 'utf8proc', 'CMake', 'Ninja', 'pkgconf'}
bad = 0
for path in sys.argv[1:]:
    ec = process_easyconfig(path, validate=True)[0]['ec']
    deps = {d['name'] for d in ec.dependencies()}
    cuda = path.endswith('CUDA-12.1.1.eb')
    need = want | ({'CUDA', 'NCCL'} if cuda else set())
    print(f"{path.split('/')[-1]}: {ec['name']} {ec['version']}{ec['versionsuffix']}, toolchain "
          f"{ec['toolchain']['name']}/{ec['toolchain']['version']}, easyblock {ec['easyblock']}, dependencies {sorted(deps)}")
    if ec['name'] != 'mgrl' or ec['toolchain']['name'] != 'foss':
        print('FAIL: not mgrl with foss'); bad += 1
    if need - deps:
        print(f'FAIL: missing dependencies {sorted(need - deps)}'); bad += 1
    if cuda != ('-DMGRL_CUDA=ON' in ec['configopts']) or (not cuda and '-DMGRL_CUDA=OFF' not in ec['configopts']):
        print('FAIL: MGRL_CUDA does not follow the variant'); bad += 1
sys.exit(1 if bad else 0)
PY
echo "PASS: the easyconfigs parse and pass the style check"
