"""The --json option of the commands that list things, and JSON for the values ``json`` does not
know (datetimes, decimals)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import click

#: ``--json`` on a command whose text output is meant for people.
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


def json_default(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    return str(value)
