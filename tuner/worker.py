"""One tuning worker process: `python -m tuner.worker DB_URL STUDY TARGET WORKER [TIMEOUT]`.

TARGET is the study's total: the worker adds trials until the study holds that many.

`tune --workers N` starts N-1 of these beside itself; on other machines the same study is joined with
`dspark tune --study NAME --db postgresql+psycopg://...`.
"""

from __future__ import annotations

import sys

from tuner.errors import TunerError
from tuner.study import run_worker


def _interrupt(_sig: int, _frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM (the tuner stopped or died): stop this worker's server on the way out


def main(argv: list[str]) -> int:
    import signal

    signal.signal(signal.SIGTERM, _interrupt)
    db_url, name, n_trials, worker = argv[0], argv[1], int(argv[2]), int(argv[3])
    timeout = float(argv[4]) if len(argv) > 4 and argv[4] != "none" else None
    try:
        run_worker(db_url, name, n_trials, worker, timeout)
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: the parent says "interrupted"
        return 130
    except TunerError as e:  # a database fault (tuner/storage_faults.py): one line, as the CLI prints it
        print(f"error: worker {worker}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
