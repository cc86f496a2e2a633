"""What `tune` shows while it works, on stderr: a progress bar, or with --json (stdout carries the summary) a plain
line per finished trial, so a scripted study is never silent for its whole run."""

from __future__ import annotations

from kb.cli_common import err_console


def study_with_progress(db_url: str, name: str, trials: int, workers: int, timeout: float | None,
                        quiet: bool):  # -> optuna.Study
    """`tuner.study.run` to `trials` completed trials under a bar with the best value so far, or with `quiet`
    (--json) a line per finished trial."""
    from tuner import study as st

    def best(study) -> str:  # noqa: ANN001 - optuna.Study
        top = max((t.values[0] for t in st.feasible_trials(study)), default=None)
        return f"best {top:,.4g}" if top is not None else "no feasible trial yet"

    if quiet:
        said = [-1]  # trials done at the last line (the runner also polls while other workers run)

        def line(done: int, study) -> None:  # noqa: ANN001
            if done != said[0]:
                said[0] = done
                err_console.print(f"tuning: {min(done, trials)}/{trials} trials, {best(study)}", highlight=False,
                                  markup=False)

        return st.run(db_url, name, trials, workers, timeout, on_progress=line)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]tuning[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=err_console, transient=False) as bar:
        task = bar.add_task("", total=trials)

        def update(done: int, study) -> None:  # noqa: ANN001
            bar.update(task, completed=min(done, trials), description=best(study))

        opt = st.run(db_url, name, trials, workers, timeout, on_progress=update)
        update(len(st.completed(opt)), opt)
        return opt


def with_bar(title: str, quiet: bool, run):  # noqa: ANN001, ANN202 - run(on_step) -> its result
    """`run(on_step)` under a progress bar titled `title` (none with --json); `on_step(done, total)` moves it."""
    if quiet:
        return run(None)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn(f"[bold]{title}[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console, transient=False) as bar:
        task = bar.add_task("", total=None)
        return run(lambda i, n: bar.update(task, completed=i, total=n))
