#!/usr/bin/env bash
# The test subset under CPython 3.13 (pyenv's 3.13.0 of the machine image, else built from Debian trixie's source).
exec bash "$(dirname "$0")/python-version.sh" 3.13 "$@"
