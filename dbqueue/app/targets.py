"""The target of a call given none: the App's own engine, in a short transaction of dbqueue's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dbqueue.runtime.targets import Target

if TYPE_CHECKING:
    from dbqueue.runtime.context import RuntimeContext


def target_or_engine(context: RuntimeContext, target: Target | None) -> Target:
    return context.engine if target is None else target
