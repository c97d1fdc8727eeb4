"""The command line: `npu-migrate apply | analyze | verify | rules`, its help pages and the project's settings.

`app` declares the commands and hands each run to the layers below; `apply` holds the steps of an
`apply` run; `command` is how every command presents its help; `config` reads `[tool.npu-migrate]`.
The console script and `python -m npu_migrate` both enter through `main`.
"""


def main() -> None:
    # Imported on call: `analyze` and `verify` build their commands from `cli.command`, and the app imports
    # theirs, so importing the app here would make every `npu_migrate.cli.*` import start a circle.
    from npu_migrate.cli.app import main as run_app

    run_app()
