#!/usr/bin/env bash
# tests/test_fixtures.sh — the Megatron files in tests/data/megatron/ are byte for byte what
# Megatron wrote: each file's SHA-256 against the one its README.txt recorded when Megatron's
# code made it. A missing file fails naming it.
set -u
cd "$(dirname "$0")/data/megatron/corpus_u16"
listed=0
while read -r name _ _ _ sum; do
    listed=$((listed + 1))
    if [ ! -f "$name" ]; then echo "FAIL fixture $name: tests/data/megatron/corpus_u16/$name not found"
    elif [ "$(sha256sum "$name" | cut -d' ' -f1)" = "$sum" ]; then echo "PASS fixture $name is Megatron's, byte for byte"
    else echo "FAIL fixture $name: its SHA-256 differs from the one README.txt recorded"; fi
done < <(grep -E '^  [^ ]+ +[0-9]+ B  sha256 [0-9a-f]{64}$' README.txt)
[ $listed -eq 10 ] || echo "FAIL fixture README.txt lists $listed files with a SHA-256, expected 10"
