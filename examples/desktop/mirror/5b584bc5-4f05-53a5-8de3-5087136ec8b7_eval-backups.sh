#!/bin/bash
# every .txt under notes has a .bak copy beside it, with the same contents
ok=1
for f in notes/*.txt; do
  cmp -s "$f" "${f%.txt}.bak" || { echo "missing: $f"; ok=0; }
done
[ "$ok" = 1 ] && echo 'Success: every note is backed up.'
