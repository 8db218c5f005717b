"""The failure report of a multi-process test (tests/helpers.py, job_report): every
process's last lines, routine progress lines left out when the test says which they are."""
import re

import helpers


def test_report_shows_each_process_and_leaves_routine_lines_out():
    output = "".join(
        [f'[0]<stdout>:{{"event": "step", "step": {i}}}\n' for i in range(300)]
        + ["[1]<stderr>:terminate called after throwing an instance of 'gloo::IoException'\n"]
        + [f'[1]<stdout>:{{"event": "step", "step": {i}}}\n' for i in range(5)]
        + ["Process 1 exit with status code 255.\n"])
    helpers.clear_jobs()
    helpers.record_job(["horovodrun", "--gloo"], output=output,
                       routine=re.compile(r'"event": "step"'))
    report = helpers.job_report(lines=3).splitlines()
    assert report == [
        "$ horovodrun --gloo",
        "--- launcher: last 1 of 1 lines, 0 routine ones left out",
        "Process 1 exit with status code 255.",
        "--- rank 0: last 0 of 300 lines, 300 routine ones left out",
        "--- rank 1: last 1 of 6 lines, 5 routine ones left out",
        "terminate called after throwing an instance of 'gloo::IoException'"]
    # Without a pattern, a chatty process's tail is its last progress lines.
    helpers.clear_jobs()
    helpers.record_job(["horovodrun"], output=output)
    assert helpers.job_report(lines=2).splitlines()[3:6] == [
        "--- rank 0: last 2 of 300 lines", '{"event": "step", "step": 298}',
        '{"event": "step", "step": 299}']
    helpers.clear_jobs()
