import os
import sys

from cnnpar.cli import main

rc = main()
# CNNPAR_EXIT_STACKS=FILE[:SECONDS]: should leaving the process take more than SECONDS (default 15) once
# the command is done, every Python thread's stack goes to FILE, again every SECONDS, until it has left.
# It is how the slow exit after `--decode hardware` runs is looked into (docs/decoding.md).
if os.environ.get("CNNPAR_EXIT_STACKS"):
    import faulthandler

    path, _, seconds = os.environ["CNNPAR_EXIT_STACKS"].partition(":")
    stacks = open(path, "w")  # left open: the watchdog writes to it until the process ends
    faulthandler.dump_traceback_later(float(seconds or 15), repeat=True, file=stacks)
sys.exit(rc)
