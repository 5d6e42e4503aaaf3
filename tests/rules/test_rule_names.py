"""The rules' names are spelled once, in jobsight.rules.rule_names: every place that names a rule reads
them from there and covers exactly the rules it must, so a rule added or renamed there cannot be missed."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

from jobsight.collector.config.actions import Policy
from jobsight.collector.config.health import HealthSettings
from jobsight.collector.passes import action_ladder, findings
from jobsight.dashboard.views.job_health import RULE_LABEL
from jobsight.rules import health, rule_names
from jobsight.rules.rule_names import ACTED_ON_RULES, EXPLAINED_RULES, LIVE_RULES, RULES, ActedOnRule

ROOT = Path(__file__).resolve().parents[2]
# The server's logic, where a rule is compared, chosen or queried by name. The dashboard is left out of
# the scan: it says "straggler" as a word too (a chart's line class, a label); its labels are checked below.
SCANNED = ("collector", "jobsight/commands", "jobsight/rules")


def test_the_registry_names_each_rule_once() -> None:
    assert len(set(RULES)) == len(RULES)
    assert {getattr(rule_names, name) for name in dir(rule_names) if name.isupper() and
            isinstance(getattr(rule_names, name), str)} == set(RULES)


def test_every_group_of_rules_is_made_of_registered_rules() -> None:
    assert set(LIVE_RULES) <= set(RULES)
    assert set(EXPLAINED_RULES) <= set(LIVE_RULES)
    assert set(ACTED_ON_RULES) <= set(RULES)


def test_the_policy_setting_literal_holds_the_acted_on_rules() -> None:
    assert set(get_args(ActedOnRule)) == set(ACTED_ON_RULES)
    assert len(get_args(ActedOnRule)) == len(ACTED_ON_RULES)
    assert Policy.model_fields["rule"].annotation is ActedOnRule


def test_the_evaluator_judges_every_registered_rule_and_no_other() -> None:
    assert tuple(health.JUDGES) == RULES
    assert set(health.RANK_RULES) <= set(RULES)


def test_the_health_settings_default_to_every_rule() -> None:
    assert HealthSettings().rules == list(RULES)


def test_the_findings_pass_reads_its_groups_from_the_registry() -> None:
    assert findings.LIVE_RULES is LIVE_RULES
    assert findings.EXPLAINED_RULES is EXPLAINED_RULES


def test_the_action_reason_says_something_for_every_acted_on_rule() -> None:
    assert set(action_ladder.WHAT) == set(ACTED_ON_RULES)


def test_the_dashboard_labels_every_rule() -> None:
    assert set(RULE_LABEL) == set(RULES)


def _spelled_rules(path: Path) -> list[str]:
    """Where ``path`` writes a rule's name as a string of its own, ``file:line name``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [f"{path.relative_to(ROOT)}:{node.lineno} {node.value}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in RULES]


def test_no_server_module_spells_a_rule_name_outside_the_registry() -> None:
    registry = Path(rule_names.__file__).resolve()
    modules = [p for root in SCANNED for p in sorted((ROOT / root).rglob("*.py")) if p.resolve() != registry]
    assert modules, "no server module found to scan"
    assert [spelled for p in modules for spelled in _spelled_rules(p)] == []
