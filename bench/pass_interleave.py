"""How many NodePlan creates waited behind another planning pass between being planned and
being sent, from a controller log written with the ``fleet.controllers.runner`` logger at
DEBUG (one line per pass with its action count, one per action performed).

    python3 bench/pass_interleave.py <workdir>/controller-bench-0.log
    # prints [(passes in between, creates), ...]

For each "performing CreateNodePlan" line: the number of "pass N starts" lines since the
last pass that planned at least one action (bench/README.md "Requests sent before the
next pass").
"""

from __future__ import annotations

import re
import sys
from collections import Counter

_ENDED = re.compile(r"pass \d+: .* (\d+) actions")


def interleaved(lines: list[str]) -> Counter[int]:
    seen_actions, between = False, 0
    out: Counter[int] = Counter()
    for line in lines:
        if " DEBUG fleet.controllers.runner: pass " in line:
            m = _ENDED.search(line)
            if m:
                if int(m.group(1)) > 0:
                    seen_actions, between = True, 0
            elif "starts:" in line and seen_actions:
                between += 1
        elif "performing CreateNodePlan" in line and seen_actions:
            out[between] += 1
    return out


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(sorted(interleaved(f.read().splitlines()).items()))
