#!/bin/sh
# Host discovery for trying elastic mode on one machine: this machine under two names, one
# slot each. Horovod blacklists the host of a worker that fails; with one name for the
# machine that would be every host, and the job would end instead of going on.
echo localhost:1
echo 127.0.0.1:1
