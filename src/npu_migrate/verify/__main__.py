"""`python -m npu_migrate.verify ...`: the verify command on its own, the same as `npu-migrate verify`."""

import typer

from npu_migrate.verify.cli import verify_command

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
app.command("verify")(verify_command)


def main() -> None:
    # A one-command app takes its options directly: `python -m npu_migrate.verify --original ...`.
    typer.main.get_command(app)(prog_name="python -m npu_migrate.verify")


if __name__ == "__main__":
    main()
