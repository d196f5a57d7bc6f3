"""``python -m longrun.monitoring [ROOT]``: write the alert rules, the PrometheusRule and the dashboard."""

import sys
from pathlib import Path

from longrun.monitoring import write

write(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
