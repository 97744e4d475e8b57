#!/usr/bin/env python
"""Django's command-line utility for Posttrain."""

import os
import sys
from pathlib import Path

# platform/ is a source folder, never a package: putting it on sys.path keeps the standard
# library's `platform` module importable (a platform/__init__.py would shadow it).
sys.path.insert(0, str(Path(__file__).resolve().parent / "platform"))


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "posttrain.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
