"""`python -m digenrl.profile ...` is `digenrl profile ...`."""

import sys

from digenrl.profile.cli import profile_main

sys.exit(profile_main())
