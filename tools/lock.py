"""Resolve a requirements.in into exact pins with pip's resolver (nothing is installed).

    python tools/lock.py requirements.in requirements.txt
    python tools/lock.py requirements-dev.in requirements-dev.txt --base requirements.txt

With --base, the input is resolved together with the base lock and only the extra pins are
written, after a `-r BASE` line, so the two files never disagree.
"""

import argparse
import json
import subprocess
import sys
import tempfile


def resolve(*requirement_files: str) -> list[str]:
    """Return sorted `name==version` pins for everything the files need."""
    with tempfile.NamedTemporaryFile(suffix=".json") as report:
        args = [sys.executable, "-m", "pip", "install", "--quiet", "--dry-run",
                "--ignore-installed", "--report", report.name]
        for path in requirement_files:
            args += ["-r", path]
        subprocess.run(args, check=True)
        with open(report.name) as f:
            resolved = json.load(f)["install"]
    return sorted(f'{p["metadata"]["name"].lower().replace("_", "-")}=={p["metadata"]["version"]}'
                  for p in resolved)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("src")
    parser.add_argument("dst")
    parser.add_argument("--base")
    args = parser.parse_args()
    header = [f"# Generated from {args.src} by `make lock`; do not edit by hand."]
    if args.base:
        with open(args.base) as f:
            base = {line.strip() for line in f if "==" in line}
        pins = [pin for pin in resolve(args.base, args.src) if pin not in base]
        header.append(f"-r {args.base}")
    else:
        pins = resolve(args.src)
    with open(args.dst, "w") as out:
        out.write("\n".join(header + pins) + "\n")


if __name__ == "__main__":
    main()
