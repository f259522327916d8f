"""What the reference is held to, in the build itself (`make docs`, warnings as errors).

* ``PUBLIC_MODULES`` is the public surface: each module's ``__all__``. After reading the
  pages, every one of those names must have a reference entry (an autodoc directive),
  or the build warns, and fails.
* A signal's entry says the arguments its receivers get (its ``providing_args``).
* ``{public-surface}`` lists the public names, module by module (docs/reference/public.md);
  ``{management-command}`` prints ``manage.py deadlines``'s help, subcommand by
  subcommand, from its own parser (docs/reference/management.md).
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

from celery.utils.dispatch import Signal
from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

#: The public surface: what is imported from these modules (their ``__all__``) is public;
#: every other module of the package (core, rules, ledger, explain, admin internals) is not.
PUBLIC_MODULES = (
    "celery_deadlines",
    "celery_deadlines.middleware",
    "celery_deadlines.beat",
    "celery_deadlines.testing",
    "celery_deadlines.conf",
    "celery_deadlines.models",
    "celery_deadlines.contrib.httpx",
    "celery_deadlines.contrib.requests",
    "celery_deadlines.contrib.grpc",
    "celery_deadlines.contrib.prometheus",
    "celery_deadlines.contrib.opentelemetry",
    "celery_deadlines.contrib.sentry",
    "celery_deadlines.contrib.django_celery_beat",
)


def public_names() -> dict[str, list[str]]:
    return {name: list(importlib.import_module(name).__all__) for name in PUBLIC_MODULES}


def add_signal_arguments(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    if isinstance(obj, Signal):
        arguments = ", ".join(f"``{arg}``" for arg in sorted(obj.providing_args or ()))
        lines += ["", f"Receivers get ``sender`` and the keyword arguments {arguments}."]


def check_every_public_name_is_documented(app: Sphinx, env: Any) -> None:
    documented = set(env.get_domain("py").objects)
    for module, names in public_names().items():
        for name in names:
            obj = getattr(importlib.import_module(module), name)
            # a name re-exported (at the root, from a rules module) is documented once,
            # under any module of the package that holds the same object
            homes = {
                full
                for full in documented
                if full.rpartition(".")[2] == name
                and _attribute(full.rpartition(".")[0], name) is obj
            }
            if not homes:
                logger.warning("public name without a reference entry: %s.%s", module, name)


def _attribute(module: str, name: str) -> object:
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None


class PublicSurface(SphinxDirective):
    def run(self) -> list[nodes.Node]:
        listing = nodes.bullet_list()
        for module, names in public_names().items():
            item = nodes.list_item()
            para = nodes.paragraph()
            para += nodes.literal(text=module)
            para += nodes.Text(": ")
            for n, name in enumerate(names):
                para += nodes.literal(text=name)
                if n + 1 < len(names):
                    para += nodes.Text(", ")
            item += para
            listing += item
        return [listing]


def _parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    from celery_deadlines.management.commands.deadlines import Command

    parser = Command().create_parser("manage.py", "deadlines")
    found: list[tuple[str, argparse.ArgumentParser]] = [("manage.py deadlines", parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.append((f"manage.py deadlines {name}", sub))
    return found


class ManagementCommand(SphinxDirective):
    def run(self) -> list[nodes.Node]:
        out: list[nodes.Node] = []
        for title, parser in _parsers():
            section = nodes.section(ids=[nodes.make_id(title)])
            section += nodes.title(text=title)
            help_text = parser.format_help().replace("manage.py deadlines deadlines", title)
            section += nodes.literal_block(help_text, help_text)
            out.append(section)
        return out


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("autodoc-process-docstring", add_signal_arguments)
    app.connect("env-check-consistency", check_every_public_name_is_documented)
    app.add_directive("public-surface", PublicSurface)
    app.add_directive("management-command", ManagementCommand)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
