"""`graphify rules` (every rule, a table or json) and `graphify rule CODE` (one rule's doc);
`register(cli)` adds them to a click group. The rule registry is imported only when they run."""

from __future__ import annotations

import click

from graphify.commands.check import fail


@click.command("rules", short_help="List every rule: code, name, category, severity, summary.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def rules_command(fmt: str) -> None:
    """List every rule: code, name, category, severity, rewritable, summary."""
    from graphify.reporters import rule_url
    from graphify.rules import all_rules

    rules = all_rules()
    if fmt == "json":
        import json

        doc = [
            {
                "code": r.code,
                "name": r.name,
                "category": r.category,
                "severity": r.severity.value,
                "rewritable": r.rewritable,
                "summary": r.summary,
                "url": rule_url(r.code),
            }
            for r in rules
        ]
        click.echo(json.dumps(doc, indent=2, ensure_ascii=False))
        return
    header = ("code", "name", "category", "severity", "rewritable", "summary")
    rows = [header] + [(r.code, r.name, r.category, r.severity.value, "yes" if r.rewritable else "no", r.summary) for r in rules]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1])


@click.command("rule")
@click.argument("code")
def rule_command(code: str) -> None:
    """Show the documentation of one rule."""
    from graphify.rules import rule_doc, rules_by_code

    by_code = rules_by_code()
    rule = by_code.get(code.strip().upper())
    if rule is None:
        import difflib

        close = difflib.get_close_matches(code.strip().upper(), list(by_code), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        fail(f"unknown rule code '{code}'{hint}; `graphify rules` lists them")
    try:
        text = rule_doc(rule.code)
    except OSError:
        text = f"# {rule.code} {rule.name}\n\n{rule.summary}\n"
    click.echo(text.rstrip("\n"))


def register(group: click.Group) -> None:
    group.add_command(rules_command)
    group.add_command(rule_command)
