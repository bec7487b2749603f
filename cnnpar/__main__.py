import sys

from cnnpar.cli import main

sys.exit(main())
