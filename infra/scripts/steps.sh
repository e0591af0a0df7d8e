# Sourced by infra/dev.sh: run install steps side by side.
#
#   run_steps STEP...   STEP is the name of a shell function (or a program). Each
#                       runs in the background with every line of its output
#                       prefixed "STEP: ", then prints how long it took. All are
#                       waited for, even after one failed, so that every error
#                       shows; the status is non-zero when any step failed.
#
# On a 2-core machine most of a cold install is either a compile (llama.cpp,
# Weaviate) or a download (pip, apt, the Go module proxy): run side by side, the
# downloads hide behind the compiles.

run_steps() {
  local step pids=() names=() failed=() i rc
  for step in "$@"; do
    (
      # errexit stays on inside the step (a step run as an `if` condition would
      # lose it, and with it every `set -e` stop in the step); pipefail hands
      # the step's status, not sed's, to this subshell.
      set -eo pipefail
      start=$SECONDS
      "$step" 2>&1 | sed -u "s/^/$step: /"
      echo "$step: done in $((SECONDS - start)) s"
    ) &
    pids+=("$!")
    names+=("$step")
  done
  for i in "${!pids[@]}"; do
    rc=0
    wait "${pids[i]}" || rc=$?
    if ((rc != 0)); then
      echo "${names[i]}: FAILED (exit status $rc)" >&2
      failed+=("${names[i]}")
    fi
  done
  if ((${#failed[@]})); then
    echo "failed: ${failed[*]}" >&2
    return 1
  fi
}
