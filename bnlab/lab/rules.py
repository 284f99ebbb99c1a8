"""A table's verdict rules as data: experiments/<name>/rules.yaml, read, and the one way every
table tells its rules' history (which version, its commit, whether its data had been seen, and
what the old rule gave).

rules.yaml holds `thresholds` (numbers the claims module reads: never typed in code), the rules
in words (`rules`, `states`, `answers`, `measure`, `compare`), and `versions`, oldest first:
each {version, commit, seen, change} plus, where a later version changed a verdict's inputs
after its data were seen, `gave`: the name of the table's function that says what the rules
before it give (the claims module supplies it), and `verdicts: false` where the change moves no
verdict by construction (a reading, a clause no run reached).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bnlab.errors import BnlabError
from bnlab.paths import EXPERIMENTS


@dataclass(frozen=True)
class Rules:
    name: str
    path: Path
    raw: dict

    def __getitem__(self, key: str) -> Any:
        """A threshold by name."""
        try:
            return self.raw["thresholds"][key]
        except KeyError:
            raise BnlabError(f"{self.path} has no threshold `{key}`; add it under "
                             "`thresholds:`.") from None

    def words(self, group: str, key: str) -> str:
        """A rule in words: `rules: C1:`, `states: breaks:`, `answers: doctor:`."""
        return " ".join(str(self.raw[group][key]).split())

    @property
    def versions(self) -> list[dict]:
        return list(self.raw.get("versions", []))

    @property
    def after_seen(self) -> list[dict]:
        """The versions written after some of their data were seen that can move a verdict."""
        return [v for v in self.versions if v.get("seen") and v.get("verdicts", True)]

    @property
    def link(self) -> str:
        """Where the README's mark points: the table page's rules section."""
        return f"experiments/{self.name}/table.md#rules-and-their-history"


def read(name: str, experiments: Path = EXPERIMENTS) -> Rules:
    """experiments/<name>/rules.yaml (the committed copy: rules are not regenerated)."""
    path = experiments / name / "rules.yaml"
    if not path.is_file():
        path = EXPERIMENTS / name / "rules.yaml"
    if not path.is_file():
        raise BnlabError(f"no rules at {path}; a table's rules are written there before its "
                         "runs.")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        raise BnlabError(f"{path} is not valid YAML (line {where.line + 1 if where else '?'}); "
                         "fix it there.") from None
    if not isinstance(raw, dict) or not raw.get("versions"):
        raise BnlabError(f"{path} has no `versions:`; each rule's version, commit and whether "
                         "its data had been seen are listed there.")
    return Rules(name, path, raw)


def version_said(v: dict, gave: dict[str, str | None]) -> str:
    """One version in a sentence: its commit, when it was written, what changed, and (written
    after its data were seen) what the rules before it give."""
    when = ("after some of its data were seen" if v.get("seen")
            else "before any of the runs it judges")
    line = f"Version {v['version']} (commit {v['commit']}, written {when}): {v['change']}."
    if v.get("verdicts") is False:
        line += " It moves no verdict."
    elif v.get("seen"):
        line += (f" Without it the rules give: {gave[v['gave']]}." if gave.get(v.get("gave"))
                 else " What the rules before it would give is not computed here.")
    return line


def history(rules: Rules, gave: dict[str, str | None] | None = None) -> list[str]:
    """The page's "Rules and their history" section, the same for every table: where the rules
    are, then each version in a sentence (version_said)."""
    out = ["## Rules and their history", "",
           f"The rules are data in `experiments/{rules.name}/rules.yaml` (thresholds and words); "
           "bnlab/lab/judge.py applies them. Versions, oldest first:", ""]
    for v in rules.versions:
        out += [version_said(v, gave or {}), ""]
    return out


def disclosure(rules: Rules, gave: dict[str, str | None] | None = None) -> str:
    """The disclosure a verdict's reasons end with, the same for every table: each version
    written after its data were seen (version_said), less those whose `gave` reading is None
    for these data (the change does not touch them); "" where none is left."""
    gave = gave or {}
    late = [v for v in rules.versions if v.get("seen")
            and not (v.get("gave") and v["gave"] in gave and gave[v["gave"]] is None)]
    return "" if not late else " Disclosed: " + " ".join(version_said(v, gave) for v in late)


def said(rules: Rules, *keys: str) -> str:
    """Thresholds in words: 'steady 1.5, separated 0.05 (experiments/lr/rules.yaml)'."""
    return (", ".join(f"{k} {rules[k]:g}" if isinstance(rules[k], float | int) else
                      f"{k} {rules[k]}" for k in keys)
            + f" (experiments/{rules.name}/rules.yaml)")


def mark(rules: Rules) -> str:
    """The README's mark on a finding or a verdict that rests on a rule written after its data
    were seen: a link to the table page's history; "" where none."""
    return f" [†]({rules.link})" if rules.after_seen else ""
