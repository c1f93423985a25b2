#!/usr/bin/env bash
# A CI pipeline step: validate, preview, activate against the generation
# that was previewed as a pending generation, smoke-test, then confirm it
# (or abort: back to what was active before). If the pipeline dies half-way,
# the gateway rolls the pending generation back by itself when its confirm
# window closes: nothing is left half-done.
#
#   CUTOVER_ADMIN=http://127.0.0.1:9190 examples/ci-activate.sh candidate.toml http://127.0.0.1:8080/healthz
#
# CONFIRM_WITHIN (default 5m) is the window. With CUTOVER_GUARD set (for
# example "--guard-error-ratio 0.01 --guard-p99 500ms --min-requests 100
# --guard-window 2m"), the gateway's guard has the last word after the
# smoke test: it confirms the generation when its window passes and rolls
# it back on a breach, comparing it with the previous generation.
#
# Exit codes: 0 activated and confirmed (or unchanged), 1 rejected,
# 2 conflict (someone else activated since the preview: re-run the step),
# 3 anything else, 4 rolled back (smoke test failed, or the guard breached).
set -euo pipefail

candidate=${1:?usage: ci-activate.sh CANDIDATE.toml SMOKE_URL}
smoke_url=${2:?usage: ci-activate.sh CANDIDATE.toml SMOKE_URL}
ctl=${CUTOVER:-cutover}
reason="${CI_COMMIT_SHA:-manual} ${CI_PIPELINE_URL:-}"
confirm_within=${CONFIRM_WITHIN:-5m}
read -r -a guard <<< "${CUTOVER_GUARD:-}"

# 1. Validate: every error with line and column, every restart-required change.
"$ctl" ctl validate "$candidate"

# 2. Preview, recorded in history; remember what it was planned against.
plan=$("$ctl" ctl --json preview "$candidate" --reason "$reason" --requested-by ci)
expected=$(printf '%s' "$plan" | python3 -c 'import json,sys; print(json.load(sys.stdin)["active_generation"])')
echo "planned against generation $expected"

# 3. Activate only if nothing changed since the preview (409 otherwise);
#    pending until confirmed.
result=$("$ctl" ctl --json activate "$candidate" --expect "$expected" --confirm-within "$confirm_within" \
  "${guard[@]}" --reason "$reason" --requested-by ci)
read -r outcome generation < <(printf '%s' "$result" | python3 -c 'import json,sys; a=json.load(sys.stdin); print(a["outcome"], a["generation"])')
echo "$outcome: generation $generation"
[ "$outcome" = "unchanged" ] && exit 0

# 4. Smoke test; on failure, abort: back to what was active before, now.
if ! curl -fsS --max-time 5 -o /dev/null "$smoke_url"; then
  echo "smoke test failed: rolling back to generation $expected" >&2
  "$ctl" ctl abort "$generation" --expect "$generation" --reason "smoke test failed for $reason" --requested-by ci
  exit 4
fi
echo "smoke test passed"

# 5. Make it final: the guard's verdict, or the pipeline's own.
if [ ${#guard[@]} -gt 0 ]; then
  "$ctl" ctl wait "$generation"
else
  "$ctl" ctl confirm "$generation" --expect "$generation" --reason "smoke test passed for $reason" --requested-by ci
fi
