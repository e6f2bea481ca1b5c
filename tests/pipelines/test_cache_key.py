"""The Prefect cache key of a stage follows the code's content, the params and the layout."""

from types import SimpleNamespace

from clusterfed.config import parse_params
from clusterfed.layout import RunLayout
from pipelines import tasks


def _key(params, layout):
    context = SimpleNamespace(task=SimpleNamespace(name="coldstart"))
    return tasks.stage_cache_key(context, {"params": params, "layout": layout})


def test_the_key_changes_with_the_code_the_params_and_the_layout(monkeypatch, tmp_path):
    params, layout = parse_params({}), RunLayout(tmp_path)
    key = _key(params, layout)
    assert key == _key(parse_params({}), RunLayout(tmp_path)) and len(tasks.code_digest()) == 64
    assert key != _key(parse_params({"seeds": [1]}), layout)
    assert key != _key(params, RunLayout(tmp_path / "other"))
    monkeypatch.setattr(tasks, "code_digest", lambda: "0" * 64)  # an edit of any .py file of clusterfed
    assert key != _key(params, layout)
