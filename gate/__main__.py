"""`python -m gate` runs the gate command."""

from gate.cli import main

main()
