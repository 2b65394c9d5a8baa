"""`rejudge`: judge a run folder's predictions again, attribute and report; no model loads."""

from __future__ import annotations

import contextlib

from evaluation import manifest
from evaluation.choices import Answering, RunFolder
from evaluation.runner import EvaluationError, load_predictions
from evaluation.session import conclude, prepare, selected


def rejudge(folder: RunFolder) -> int:
    """`rejudge`: judge a run folder's predictions again (the filters hold), attribute and report."""
    with contextlib.ExitStack() as resources:
        session = prepare("rejudge", folder, Answering(), resources)
        if not session.predictions.exists():
            raise EvaluationError(f"rejudge: {session.predictions} does not exist; answer the questions first (run)")
        records = selected(session, list(load_predictions(session.predictions).values()))
        return conclude(session, records, manifest.load(session.out_dir), session.predictions)
