#!/bin/sh
# Host discovery for horovodrun's elastic mode from a file you edit while the job runs:
#   horovodrun -np 8 --min-np 4 --max-np 8 --host-discovery-script examples/elastic/discover-hostfile.sh ...
# The file (ELASTIC_HOSTS, default: the file "hosts" beside this script) holds one host a
# line, as HOST:SLOTS or HOST slots=SLOTS; "#" starts a comment. Horovod's driver runs this
# script every few seconds on the launching host: delete a line to take a host out (its
# workers are stopped at the next commit), add it back to let it rejoin.
set -eu
hosts="${ELASTIC_HOSTS:-$(dirname "$0")/hosts}"
if [ ! -r "$hosts" ]; then
    echo "discover-hostfile.sh: cannot read $hosts (set ELASTIC_HOSTS)" >&2
    exit 1
fi
# Comments and blanks out; "HOST slots=N" becomes "HOST:N", the form Horovod reads.
sed -e 's/#.*//' -e 's/[[:space:]]*slots=/:/' -e 's/[[:space:]]//g' "$hosts" | grep -v '^$' || true
