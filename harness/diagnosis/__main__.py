"""``python -m harness.diagnosis localize REQUEST_JSON``: the child of harness/diagnosis/diagnose.py.

Prints one ``RESULT {json}`` line: the first divergent module of the run the request
describes, or why it could not be looked for.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from harness.diagnosis import localize, subject


def localize_request(req: dict) -> dict:
    try:
        built, stack = subject.build(
            req["backend"], req["attention"], Path(req["model_dir"]),
            None if req["weights_dir"] is None else Path(req["weights_dir"]), Path(req["run_dir"]),
            int(req["nproc"]), req.get("device", "cpu"), tuple(req.get("plants", ())),
            req.get("regime", "float32"), tuple(req.get("workarounds", ())),
            req.get("gradients", True))
    except subject.NotDiagnosable as why:
        return {"divergence": None, "not_diagnosed": str(why)}
    with stack:
        try:
            found = localize.first_divergence(built.under_test, built.weights, built.arch,
                                              built.inputs, built.positions, mask=built.mask,
                                              regime=built.regime, modules=built.modules,
                                              labels=built.labels)
        except subject.NotDiagnosable as why:  # found by the walk (a weight the model names)
            return {"divergence": None, "not_diagnosed": str(why)}
    result = found.to_json()
    result["weights_from"], result["batch_from"] = built.weights_from, built.batch_from
    result["known"] = built.known
    # bytes held at once: the model under test's parameters, the reference's float64 tensors
    result["memory"] = {"model": built.under_test.memory(), "reference": result.pop("reference_memory")}
    return {"divergence": result, "not_diagnosed": None}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "localize":
        print(__doc__, file=sys.stderr)
        return 2
    print("RESULT " + json.dumps(localize_request(json.loads(argv[1])), default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
