"""One of several trial processes of a parallel search (search.run_workers): it opens the
study's journal in OUT, continues the stale trials it is given, then asks for new trials
until the search has begun as many as it was told.

    python -m components.tune.worker OUT INDEX [TRIAL_ID,...]

Exits 143 when a SIGTERM stopped its trial (checkpointed; the next run continues it).
"""

from __future__ import annotations

import json
import logging
import sys

from components.tune.study import open_study, run_trials
from components.tune.trials import PLAN_FILE, TrialRegime


def main(argv: list[str]) -> int:
    from components.train.trainer import PREEMPTED_EXIT_CODE, Preempted

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    out = argv[0]
    index = int(argv[1])
    resume = [int(t) for t in argv[2].split(",") if t] if len(argv) > 2 else []
    with open(f"{out}/{PLAN_FILE}") as handle:
        plan = json.load(handle)
    regime = TrialRegime.from_dict(plan["regime"])
    try:
        run_trials(open_study(out, regime, plan["first"]), regime, plan["trials"], out, resume,
                   stream=plan["seed"] * 1000 + index)
    except Preempted as stopped:
        print(f"detpipe tune worker: {stopped}", file=sys.stderr)
        return PREEMPTED_EXIT_CODE
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
