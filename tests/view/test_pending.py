"""The jobs of a `/failsoft/jobs` answer, read as the contract's job summaries."""

from __future__ import annotations

from tray_app.view.pending import as_job, job_list, pending_jobs

ROW = {"id": "job-1", "state": "awaiting_approval", "model": "qwen3-8b", "estimated_seconds": 30.0}


def test_a_list_answer_or_a_bare_list_gives_its_jobs_and_skips_anything_else() -> None:
    assert job_list({"object": "list", "data": [ROW, "junk", None]}) == [ROW]
    assert job_list([ROW]) == [ROW]
    assert job_list({"error": {"message": "no"}}) == []
    assert job_list("not json") == []
    assert as_job(ROW) == ROW and as_job(["not", "a", "job"]) is None


def test_pending_jobs_are_oldest_first_and_say_what_they_ask() -> None:
    rows = [dict(ROW, id="new", created_at=20.0), dict(ROW, id="old", created_at=10.0)]
    jobs = pending_jobs({"data": rows})
    assert [job.job_id for job in jobs] == ["old", "new"]
    assert jobs[0].choice() == "qwen3-8b on the CPU in about 30 s"
