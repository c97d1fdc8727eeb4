"""The code that rules inject, rendered from jinja2 templates shipped as `npu_migrate.templates`.

Templates are looked up through `importlib.resources`, so they work from a wheel, a zip or an editable
install alike. Rendering is strict: a variable a template expects but is not given is an error, never
an empty string in generated code.
"""

from __future__ import annotations

import functools
from importlib import resources

import jinja2


class _ResourceLoader(jinja2.BaseLoader):
    def get_source(self, environment: jinja2.Environment, template: str):
        path = resources.files("npu_migrate.templates").joinpath(*template.split("/"))
        if not path.is_file():
            raise jinja2.TemplateNotFound(template)
        return path.read_text(encoding="utf-8"), None, lambda: True


@functools.cache
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=_ResourceLoader(),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def render(name: str, **context: object) -> str:
    """Render template `name` (a path under the templates folder, e.g. "fused/rms_norm.py.j2")."""
    return environment().get_template(name).render(**context)
