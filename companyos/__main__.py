"""`python -m companyos` is the same as the `companyos` command."""

from companyos.cli import main

main()
