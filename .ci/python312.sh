#!/usr/bin/env bash
# The test subset under CPython 3.12 (pyenv's 3.12.1 of the machine image; no Debian suite has a 3.12 to build).
exec bash "$(dirname "$0")/python-version.sh" 3.12 "$@"
