#!/bin/sh
# Host discovery for horovodrun's elastic mode from a file you edit while the job runs:
#   horovodrun -np 8 --min-np 4 --max-np 8 --host-discovery-script examples/elastic/discover-hostfile.sh ...
# The file (ELASTIC_HOSTS, default: the file "hosts" beside this script) holds one host a
# line, as HOST:SLOTS or HOST slots=SLOTS; "#" starts a comment. Horovod's driver runs this
# script every second on the launching host: delete a line to take a host out (its
# workers are stopped at the next commit), add it back to let it rejoin.
set -eu
hosts="${ELASTIC_HOSTS:-$(dirname "$0")/hosts}"
if [ ! -r "$hosts" ]; then
    echo "discover-hostfile.sh: cannot read $hosts (set ELASTIC_HOSTS)" >&2
    exit 1
fi
# Comments, carriage returns and blanks out; "HOST slots=N" becomes "HOST:N", the form
# Horovod reads. A line that is still not HOST:N is named on stderr and left out: Horovod
# would take it for a host name, or fail on it.
sed -e 's/#.*//' -e 's/\r$//' -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' \
    -e 's/^\([^[:space:]:]*\)[[:space:]][[:space:]]*slots=\([0-9][0-9]*\)$/\1:\2/' "$hosts" |
while IFS= read -r line; do
    case "$line" in
        "") ;;
        *[!A-Za-z0-9._:-]* | *:*:* | :* | *:) echo "discover-hostfile.sh: $hosts: not HOST:SLOTS, left out: $line" >&2 ;;
        *:*[!0-9]*) echo "discover-hostfile.sh: $hosts: not HOST:SLOTS, left out: $line" >&2 ;;
        *:*) echo "$line" ;;
        *) echo "discover-hostfile.sh: $hosts: no slot count, left out: $line" >&2 ;;
    esac
done
