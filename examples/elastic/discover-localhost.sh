#!/bin/sh
# Host discovery for trying elastic mode on one machine: this host, with 2 slots.
echo localhost:2
