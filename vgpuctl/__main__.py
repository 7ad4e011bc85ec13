"""``python -m vgpuctl``: the same as the ``vgpuctl`` console script."""

import sys

from vgpuctl.main import main

sys.exit(main())
