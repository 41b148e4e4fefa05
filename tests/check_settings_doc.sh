#!/bin/sh
# Checks that docs/settings.md is exactly what `mailrail_info --markdown` prints
# from the settings tables. Regenerate with:
#   build/tools/mailrail_info --markdown > docs/settings.md
set -eu
info=$1
doc=$2
if ! "$info" --markdown | diff -u "$doc" - ; then
    echo "docs/settings.md is out of date; regenerate it with: mailrail_info --markdown > docs/settings.md" >&2
    exit 1
fi
echo "docs/settings.md matches the settings tables"
