"""The CLI of the knowledge base: outputs, --json, exit codes, one-line errors for bad input."""

from __future__ import annotations

import json

import pytest

import cli
from tests.kb.helpers import rule, write_rules

RULES = [rule("spec.a", [{"param": "spec.block_size", "range": [4, 16], "prefer": 7}],
              when={"field": "hw.arch", "eq": "hopper"}),
         rule("spec.b", [{"advise": "Profile the SPS table on the serving GPU."}], category="stability")]


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def rules_dir(tmp_path):
    return write_rules(tmp_path / "rules", RULES)


def test_help_everywhere(capsys):
    for argv in (["--help"], ["rules", "--help"], ["kb", "--help"], ["match", "--help"], ["rules", "lint", "--help"]):
        code, out, _ = run(capsys, *argv)
        assert code == 0 and "Usage" in out


def test_rules_list_show_search_stats(capsys, rules_dir):
    code, out, _ = run(capsys, "rules", "list", "--rules", str(rules_dir), "--json")
    assert code == 0 and [r["id"] for r in json.loads(out)] == ["spec.a", "spec.b"]
    code, out, _ = run(capsys, "rules", "show", "spec.a", "--rules", str(rules_dir), "--json")
    assert code == 0 and json.loads(out)["then"][0]["prefer"] == 7
    code, out, _ = run(capsys, "rules", "search", "sps table", "--rules", str(rules_dir), "--json")
    assert [r["id"] for r in json.loads(out)] == ["spec.b"]
    code, out, _ = run(capsys, "rules", "search", "sps", "table", "--rules", str(rules_dir), "--json")
    assert code == 0 and [r["id"] for r in json.loads(out)] == ["spec.b"]  # unquoted words: all must appear too
    code, out, _ = run(capsys, "rules", "search", "sps", "hopper", "--rules", str(rules_dir), "--json")
    assert code == 0 and json.loads(out) == []
    code, out, _ = run(capsys, "rules", "stats", "--rules", str(rules_dir), "--json")
    stats = json.loads(out)
    assert stats["total"] == 2 and stats["by_category"] == {"speculative": 1, "stability": 1}
    code, _, err = run(capsys, "rules", "show", "spec.c", "--rules", str(rules_dir))
    assert code == 2 and "did you mean" in err and "spec.a" in err


def test_match_profile_file_stores_plan(capsys, rules_dir, tmp_path):
    prof = tmp_path / "h100.json"
    prof.write_text(json.dumps({"hw": {"name": "H100-SXM", "arch": "hopper"}}))
    code, out, _ = run(capsys, "match", "--profile", str(prof), "--rules", str(rules_dir), "--json")
    assert code == 0
    plan = json.loads(out)
    assert plan["space"]["spec.block_size"]["high"] == 16 and plan["prefer"]["spec.block_size"]["value"] == 7
    assert plan["advice"][0]["rules"] == ["spec.b"]
    code, out, _ = run(capsys, "match", "--rules", str(rules_dir))  # latest stored profile
    assert code == 0 and "spec.block_size" in out and "Plan #2" in out
    code, out, _ = run(capsys, "kb", "stats", "--json")
    assert json.loads(out)["tables"]["plans"] == 2


def test_kb_sync_and_migrate(capsys, rules_dir):
    code, out, _ = run(capsys, "kb", "sync", "--rules", str(rules_dir), "--json")
    assert code == 0 and json.loads(out)["added"] == ["spec.a", "spec.b"]
    code, out, _ = run(capsys, "kb", "sync", "--rules", str(rules_dir), "--json")
    assert json.loads(out)["unchanged"] == 2
    code, out, _ = run(capsys, "kb", "migrate")
    assert code == 0 and "already at" in out


def test_lint_exit_codes(capsys, rules_dir, tmp_path):
    assert run(capsys, "rules", "lint", "--rules", str(rules_dir))[0] == 0
    broken = write_rules(tmp_path / "broken", [rule("x", [{"param": "spec.block_size", "set": 99}])])
    code, out, _ = run(capsys, "rules", "lint", "--rules", str(broken))
    assert code == 2 and "does not fit" in out


def test_shipped_rules_lint_clean(capsys):
    code, out, _ = run(capsys, "rules", "lint")
    assert code == 0, out


@pytest.mark.parametrize("argv, message", [
    (["rules", "list", "--rules", "/no/such/folder"], "does not exist"),
    (["rules", "list", "--db", "sqlite:////dev/null/x/kb.sqlite"], "cannot"),
    (["kb", "stats", "--db", "postgresql+psycopg://nobody@127.0.0.1:1/none"], "check that the server is running"),
    (["kb", "stats", "--db", "mysqlx://what"], "invalid database URL"),
    (["match", "--profile", "/no/such.json"], "cannot read profile"),
])
def test_bad_input_is_one_line(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_bad_rule_file_names_file_and_line(capsys, tmp_path):
    folder = tmp_path / "r"
    folder.mkdir()
    (folder / "bad.yaml").write_text("- id: a\n  title: [oops\n")
    code, _, err = run(capsys, "rules", "list", "--rules", str(folder))
    assert code == 2 and "bad.yaml:" in err and "malformed YAML" in err


def test_corrupted_sqlite(capsys, tmp_path, rules_dir):
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"this is not a database" * 100)
    code, _, err = run(capsys, "rules", "list", "--rules", str(rules_dir), "--db", f"sqlite:///{bad}")
    assert code == 2 and "corrupted" in err
    assert bad.read_bytes() == b"this is not a database" * 100  # untouched


def test_invalid_profile_json(capsys, tmp_path, rules_dir):
    p = tmp_path / "p.json"
    p.write_text('{"hw": {"arch": "pentium"}}')
    code, _, err = run(capsys, "match", "--profile", str(p), "--rules", str(rules_dir))
    assert code == 2 and "hw.arch" in err
    p.write_text("{nope")
    code, _, err = run(capsys, "match", "--profile", str(p), "--rules", str(rules_dir))
    assert code == 2 and "invalid JSON" in err


def test_failed_sync_leaves_database_unchanged(capsys, tmp_path, rules_dir):
    assert run(capsys, "kb", "sync", "--rules", str(rules_dir))[0] == 0
    write_rules(rules_dir, [rule("zzz", [{"param": "spec.block_size", "set": 999}])], "zz.yaml")
    code, _, err = run(capsys, "kb", "sync", "--rules", str(rules_dir))
    assert code == 2 and "zz.yaml" in err
    (rules_dir / "zz.yaml").unlink()
    code, out, _ = run(capsys, "kb", "sync", "--rules", str(rules_dir), "--json")
    assert json.loads(out)["unchanged"] == 2
