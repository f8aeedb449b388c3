#!/usr/bin/env bash
# A subset of the test suite under another CPython than the 3.11 of `make test` (3.12 or 3.13).
#
#   bash .ci/python-version.sh 3.12 [pytest args...]      (or .ci/python312.sh, .ci/python313.sh)
#   bash .ci/python-version.sh 3.12 --install-only        (phases 1-2: .ci/run overlaps them with `make test`)
#
# Idempotent; each phase prints its time. Exits non-zero when anything fails.
#   1. interpreter, the first that works of: $AGENTJAX_PYTHON (a path); a build cached in
#      ${XDG_CACHE_HOME:-$HOME/.cache}/agentjax/pythonX.Y; pyenv's ${PYENV_ROOT:-$HOME/.pyenv}/versions/X.Y.*
#      (the python machine image ships 3.12.1 and 3.13.0 there, not on PATH); a real pythonX.Y on PATH. Else CPython
#      is built into that cache from Debian's source package pythonX.Y (trixie, else sid; 3.13 and 3.14 are there,
#      no Debian suite has 3.12): plain `./configure --prefix=... && make -j && make install`, no PGO.
#      AGENTJAX_BUILD_PYTHON=1 skips the installed interpreters (uses or makes the cached build).
#   2. venv .venvXY in the repository (self-ignoring: it holds a .gitignore of `*`), the project installed editable
#      with its test extra except torch: torch==2.13.0 for cp312/cp313 is only PyPI's CUDA build (a 527 MB wheel and
#      18 nvidia/cuda packages, GBs), the CPU build on disk is cp311 only. AGENTJAX_TORCH=1 installs it anyway (then
#      tests/models can run). Reinstalled when pyproject.toml, the interpreter or AGENTJAX_TORCH changes.
#   3. pytest on SUBSET below without the slow marker's tests, or on the arguments after the version
#      (`... 3.13 tests/credit -x`).
#   pip installs without byte-compiling (--no-compile: the modules the tests import compile on first import).
set -euo pipefail

# The subset (130 s of tests on the 2 cores with pytest-xdist, measured alone; `make test` keeps the whole suite on
# 3.11): the parts whose dependencies differ by Python version (jax/jaxlib 0.12 and numpy 2.5 on 3.12+ against
# 0.10 / 2.4 on 3.11; flax, optax, orbax, tyro, spaCy, tensorboardX), one file or folder each, without
#   tests/models           its conftest imports torch (AGENTJAX_TORCH above);
#   tests/envs/test_textworld.py  but its three checksum tests (the games' bytes and the game.json checksum's canonical
#                          form, which is what 3.12+ changes: hash(None) is a constant there), for time;
#   tests/agents/test_tree.py, test_judge.py  the recursive runtime's model-backed tests, for CI time;
#   tests/train/test_update.py  the update's compiles (~75 s of the subset), for CI time (tests/losses stay);
#   tests/envs/test_textcraft.py, test_webshop.py, test_pool.py  pure-Python env code, for CI time;
#   the slow ones          tests/parallel (4.4 min alone under load), the rest of tests/credit, the learning, loop,
#                          notebook and ALFWorld / TextWorld-Sync tests.
SUBSET=(
  tests/credit/test_trajectory.py tests/credit/test_sero.py tests/rollout/test_batch.py tests/losses
  tests/agents/test_prompts.py tests/agents/test_projection.py tests/agents/test_compact.py tests/agents/test_grammar.py
  tests/train/test_checkpoint.py tests/train/test_config.py tests/train/test_metrics.py
  tests/envs/test_sokoban.py
  tests/test_cli.py tests/test_numerics.py
  tests/envs/test_textworld.py::test_generation_is_deterministic_and_locked
  tests/envs/test_textworld.py::test_the_json_checksum_ignores_the_order_of_the_excluded_names
  tests/envs/test_textworld.py::test_checksums_do_not_depend_on_where_textworld_is_installed
)
NICE="nice -n 19"
WORK=""

phase() {  # phase NAME: the seconds since the previous phase
  local now
  now=$(date +%s)
  printf '[python%s] %-12s %5d s\n' "$VER" "$1" $((now - PHASE_START))
  PHASE_START=$now
}

works() {  # works PATH: an interpreter of version $VER with the modules a venv and the dependencies need
  [[ -x $1 ]] && "$1" -c "import sys, ssl, sqlite3, lzma, bz2, ctypes, zlib, venv, ensurepip
sys.exit(sys.version_info[:2] != ($MAJOR, $MINOR))" 2>/dev/null
}

find_python() {
  local p
  if [[ -n ${AGENTJAX_PYTHON:-} ]]; then
    works "$AGENTJAX_PYTHON" && { echo "$AGENTJAX_PYTHON"; return; }
    echo "python-version.sh: AGENTJAX_PYTHON=$AGENTJAX_PYTHON is not a working Python $VER" >&2
    exit 2
  fi
  [[ -f $PREFIX/.agentjax-built ]] && works "$PREFIX/bin/python$VER" && { echo "$PREFIX/bin/python$VER"; return; }
  [[ ${AGENTJAX_BUILD_PYTHON:-0} == 1 ]] && return
  for p in $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}/versions/$VER".* 2>/dev/null | sort -Vr); do
    works "$p/bin/python$VER" && { echo "$p/bin/python$VER"; return; }
  done
  p=$(type -P "python$VER" || true)
  if [[ -n $p && $p != */shims/* ]] && works "$p"; then echo "$p"; fi
}

build_python() {  # CPython $VER from Debian's source package into $PREFIX
  local apt src suite pkg need=()
  WORK=$(mktemp -d)
  apt=$WORK/apt
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial"
  local opts=(-o "Dir::Etc::sourcelist=$apt/sources.list" -o Dir::Etc::sourceparts=/dev/null
              -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -o APT::Sandbox::User=root)
  for suite in trixie sid; do  # a private apt state: the machine's sources and lists are left as they are
    echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $suite main" \
      >"$apt/sources.list"
    apt-get "${opts[@]}" -qq update
    if apt-cache "${opts[@]}" showsrc "python$VER" 2>/dev/null | grep -q '^Package:'; then
      (cd "$WORK" && apt-get "${opts[@]}" -qq source --download-only "python$VER" >/dev/null)
      break
    fi
  done
  src=$(ls "$WORK/python${VER}_"*.orig.tar.* 2>/dev/null | head -1 || true)
  if [[ -z $src ]]; then
    echo "python-version.sh: no Python $VER: none installed, and no Debian suite (trixie, sid) has a source package" \
         "python$VER (Debian went from 3.11 in bookworm to 3.13 in trixie)" >&2
    exit 3
  fi
  echo "[python$VER] building $(basename "$src") (Debian $suite) into $PREFIX"
  # The headers of the optional modules (the python image has all of them but gdbm's).
  for pkg in build-essential libssl-dev zlib1g-dev libbz2-dev liblzma-dev libffi-dev libsqlite3-dev libreadline-dev \
             libncurses-dev uuid-dev libgdbm-dev libgdbm-compat-dev tk-dev libexpat1-dev pkg-config xz-utils; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' || need+=("$pkg")
  done
  if ((${#need[@]})); then
    apt-get -qq update
    DEBIAN_FRONTEND=noninteractive apt-get -qq install -y "${need[@]}" >/dev/null
  fi
  tar -xf "$src" -C "$WORK"
  # The prefix is compiled in; the marker written after `make install` tells a finished build from a killed one.
  rm -rf "$PREFIX"
  (
    cd "$WORK"/Python-*/
    $NICE ./configure --prefix="$PREFIX" >"$WORK/configure.log" 2>&1 || { tail -n 30 "$WORK/configure.log"; exit 1; }
    $NICE make -j"${JOBS:-$(nproc)}" >"$WORK/make.log" 2>&1 || { tail -n 40 "$WORK/make.log"; exit 1; }
    $NICE make install >"$WORK/install.log" 2>&1 || { tail -n 30 "$WORK/install.log"; exit 1; }
  )
  echo "$(basename "$src") (Debian $suite)" >"$PREFIX/.agentjax-built"
}

test_requirements() {  # the test extra, without torch unless AGENTJAX_TORCH=1
  "$1" - <<'EOF'
import os, re, tomllib
for r in tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["test"]:
    if os.environ.get("AGENTJAX_TORCH") == "1" or re.split(r"[\s<>=!~\[;]", r, maxsplit=1)[0].lower() != "torch":
        print(r)
EOF
}

quiet_pip() {  # pip, without its notes on the image's local index folders that lack a package
  PATH="$VENV/bin:$PATH" $NICE "$VENV/bin/python" -m pip "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
}

main() {
  cd "$(dirname "$0")/.."
  VER=${1:?usage: python-version.sh 3.12|3.13 [pytest args...]}
  shift
  [[ $VER =~ ^3\.[0-9]+$ ]] || { echo "python-version.sh: a version like 3.13, not '$VER'" >&2; exit 2; }
  MAJOR=${VER%%.*} MINOR=${VER#*.}
  PREFIX=${XDG_CACHE_HOME:-$HOME/.cache}/agentjax/python$VER
  VENV=$PWD/.venv$MAJOR$MINOR
  WHEELS=${XDG_CACHE_HOME:-$HOME/.cache}/agentjax/wheels
  T0=$(date +%s) PHASE_START=$(date +%s)
  trap 'if [[ -n $WORK ]]; then rm -rf "$WORK"; fi' EXIT

  # 1. the interpreter
  local py
  py=$(find_python)
  if [[ -z $py ]]; then
    build_python
    py=$PREFIX/bin/python$VER
    works "$py" || { echo "python-version.sh: the build in $PREFIX does not work" >&2; exit 1; }
  fi
  echo "[python$VER] interpreter: $py ($("$py" -c 'import sys; print(sys.version.split()[0])'))"
  phase interpreter

  # 2. the venv
  local interp key reqs
  interp=$("$py" -c 'import sys; print(sys.executable, sys.version)')
  key="$interp torch=${AGENTJAX_TORCH:-0} $(sha256sum pyproject.toml | cut -c1-16)"
  if [[ ! -f $VENV/.installed || $(cat "$VENV/.installed") != "$key" ]]; then
    if [[ ! -x $VENV/bin/python || $(cut -d' ' -f1-2 "$VENV/.installed" 2>/dev/null) != "$(cut -d' ' -f1-2 <<<"$interp")" ]]; then
      rm -rf "$VENV"  # new, or made by another interpreter; else pip updates it in place
      "$py" -m venv "$VENV"
    fi
    echo '*' >"$VENV/.gitignore"
    quiet_pip install --quiet --upgrade pip
    mapfile -t reqs < <(test_requirements "$VENV/bin/python")
    # fast-downward-textworld and jericho (sdists) are compiled here unless `make wheels` left their (pure-Python)
    # wheels in WHEELS (the Makefile's); their setup.py runs a bare `python`, hence the venv's bin/ first on PATH
    # (quiet_pip), as in the Makefile.
    mkdir -p "$WHEELS"
    quiet_pip install --quiet --no-compile --find-links "$WHEELS" -e . "${reqs[@]}"
    echo "$key" >"$VENV/.installed"
  fi
  "$VENV/bin/python" -c "import jax, flax, numpy
print(f'[python$VER] jax {jax.__version__}, flax {flax.__version__}, numpy {numpy.__version__}')"
  phase install
  [[ ${1:-} == --install-only ]] && return 0

  # 3. the tests
  local args=("${SUBSET[@]}" -m "not slow" -n "${TEST_WORKERS:-auto}" --dist loadfile) a rc=0  # as `make test`
  (($#)) && args=("$@")
  if ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
    for a in "${args[@]}"; do
      [[ $a == tests/models* ]] && { echo "python-version.sh: $a needs torch (AGENTJAX_TORCH=1)" >&2; exit 2; }
    done
  fi
  export AGENTJAX_DATA="${AGENTJAX_DATA:-$(cd .. && pwd)/shared/data}"
  $NICE "$VENV/bin/python" -m pytest -p no:cacheprovider "${args[@]}" || rc=$?
  phase tests
  printf '[python%s] %-12s %5d s (pytest exit %d)\n' "$VER" total $(($(date +%s) - T0)) "$rc"
  return "$rc"
}

main "$@"
exit
