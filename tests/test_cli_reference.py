"""docs/cli.md is the argparse definitions' own help text, regenerated and compared."""

from maskstream.cli.reference import PAGE, render


def test_cli_reference_page_matches_the_commands():
    assert PAGE.read_text(encoding="utf-8") == render(), (
        "docs/cli.md is out of date: run `python -m maskstream.cli.reference`")


def test_cli_reference_covers_every_command_and_flag():
    from maskstream.cli import COMMANDS

    page = render()
    for name in COMMANDS:
        assert f"## maskstream {name}\n" in page
    assert "--remote-timeout" in page and "--dataset" in page
