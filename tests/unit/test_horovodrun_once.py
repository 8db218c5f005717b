"""The suite's horovodrun (tests/horovodrun_once.py) asks Horovod's build check once per
installed Horovod. (Every test that launches horovodrun runs it.)"""
import json

import horovodrun_once


def test_the_check_is_asked_once_per_installed_horovod(tmp_path, monkeypatch):
    answers = str(tmp_path / "answers.json")
    asked = []

    def check(verbose=False):
        asked.append(verbose)
        return True

    remembered = horovodrun_once.remembered("mpi_built", check, answers)
    assert remembered() is True and remembered() is True
    assert asked == [False]
    assert json.load(open(answers))["answers"] == {"mpi_built": True}
    assert remembered(verbose=True) is True and asked == [False, True]  # --verbose: its lines

    monkeypatch.setattr(horovodrun_once, "installed_key", lambda: "another build")
    assert remembered() is True and asked == [False, True, False]


def test_a_failed_check_is_asked_again_and_a_bad_file_is_ignored(tmp_path):
    answers = tmp_path / "answers.json"
    answers.write_text("[1, 2]")  # valid JSON, not ours
    results = [None, True]
    remembered = horovodrun_once.remembered("gloo_built", lambda verbose=False: results.pop(0),
                                            str(answers))
    assert remembered() is None  # Horovod's answer when the extension did not import
    assert answers.read_text() == "[1, 2]"
    assert remembered() is True and remembered() is True and not results
