#!/bin/sh
#PBS -N fail
#PBS -l ncpus=1,walltime=00:00:10
# Exit with status $FAIL_STATUS (default 3): afternotok dependents run, afterok ones never do.
echo "failing on purpose" >&2
exit "${FAIL_STATUS:-3}"
