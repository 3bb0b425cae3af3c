#!/bin/sh
# Mutation testing of the job state machine, the server's state, the backfill
# policy and the EET metric (docs/mutation.md), with mutmut, on a copy of the
# repository: mutmut writes its mutants under the copy's mutants/, and the
# checkout is never touched.
#
#   tests/mutation/run_mutmut.sh [DEST]     (default /tmp/mb-mutation)
#
# SRC=DIR copies DIR instead of this checkout (e.g. a `git archive` of a commit
# while the work tree is being edited).
#
# Then `cd DEST && mutmut results` lists the survivors and `mutmut show NAME`
# shows one. It runs at the lowest priority; a full run takes ~30 min on 2 CPUs.
set -eu
repo=$(cd "$(dirname "$0")/../.." && pwd)
src=${SRC:-$repo}
dest=${1:-/tmp/mb-mutation}
venv=${VENV:-$repo/.venv}
rm -rf "$dest"
mkdir -p "$dest"
tar -C "$src" --exclude=./.venv --exclude=./.git --exclude=./mutants \
    --exclude=__pycache__ --exclude=.hypothesis --exclude=./.demo-home \
    --exclude=.mypy_cache --exclude=.ruff_cache --exclude=.pytest_cache -cf - . |
    tar -C "$dest" -xf -
cat >"$dest/setup.cfg" <<'CFG'
[mutmut]
source_paths = minibatch
only_mutate =
    minibatch/core/job.py
    minibatch/server/state.py
    minibatch/policy/backfill.py
    minibatch/metrics/eet.py
use_git_change_detection = false
also_copy =
    jobs
    daemons
pytest_add_cli_args = -p no:cacheprovider -p no:randomly
pytest_add_cli_args_test_selection =
    tests/unit/test_server_state.py
    tests/unit/test_server_jobops.py
    tests/unit/test_server_dispatch.py
    tests/unit/test_server_admission.py
    tests/unit/test_server_qos.py
    tests/unit/test_malleable_rules.py
    tests/unit/test_reservations.py
    tests/unit/test_dependency_rules.py
    tests/unit/test_server_lifecycle.py
    tests/unit/test_job_model.py
    tests/unit/test_policies.py
    tests/unit/test_policy_backfill.py
    tests/unit/test_backfill_paths.py
    tests/unit/test_policy_balanced.py
    tests/unit/test_policy_presets.py
    tests/unit/test_policy_properties.py
    tests/unit/test_policy_reservations.py
    tests/unit/test_policy_snapshots.py
    tests/unit/test_metrics_eet.py
    tests/unit/test_eet_fractional.py
    tests/unit/test_eet_details.py
    tests/unit/test_metrics_summary.py
    tests/unit/test_sim_engine.py
    tests/unit/test_sim_properties.py
    tests/unit/test_sim_anchor.py
CFG
cd "$dest"
# A checkout older than some of the test files: leave those out.
for f in $(grep -o 'tests/unit/[a-z_]*\.py' setup.cfg); do
    [ -e "$f" ] || sed -i "\|$f|d" setup.cfg
done
PATH="$venv/bin:$PATH" nice -n 19 "$venv/bin/mutmut" run || true
PATH="$venv/bin:$PATH" "$venv/bin/mutmut" results --all true >results.txt 2>&1 || true
echo "results in $dest/results.txt"
