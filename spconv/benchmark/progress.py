"""The progress bar on stderr: tqdm when installed (the ``bench`` extra), otherwise none."""
from typing import Iterable, List, Optional


def tqdm_or_none():
    try:
        from tqdm import tqdm
        return tqdm
    except ImportError:
        return None


def iterate(tasks: List, enabled: bool, notes: Optional[List[str]] = None) -> Iterable:
    """Yields the tasks, under a tqdm bar labelled with the current task when tqdm is available and wanted."""
    tqdm = tqdm_or_none() if enabled else None
    if tqdm is None:
        if enabled and notes is not None:
            notes.append("skipped the progress bar: tqdm is not installed (pip install 'spconv-hip[bench]')")
        yield from tasks
        return
    bar = tqdm(tasks, unit="task", dynamic_ncols=True, leave=False)
    for task in bar:
        bar.set_description(task.label)
        yield task
