#!/usr/bin/env bash
# Build memdiag_mark.so (the MemdiagMark op and the ring reader) against the venv's TensorFlow.
# Usage: probes/native_mark/build.sh   (from anywhere; writes next to this script)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
py="${PYTHON:-$here/../../.venv/bin/python}"
read -r -a cflags <<<"$("$py" -c 'import tensorflow as tf; print(" ".join(tf.sysconfig.get_compile_flags()))' 2>/dev/null)"
read -r -a lflags <<<"$("$py" -c 'import tensorflow as tf; print(" ".join(tf.sysconfig.get_link_flags()))' 2>/dev/null)"
cmd=(g++ -std=c++17 -O2 -fPIC -shared "$here/../../memdiag/native/mark_op.cc" -o "$here/memdiag_mark.so" "${cflags[@]}" "${lflags[@]}")
echo "${cmd[*]}"
start=$(date +%s.%N)
"${cmd[@]}"
end=$(date +%s.%N)
printf 'built %s in %.1f s\n' "$here/memdiag_mark.so" "$(echo "$end - $start" | bc)"
