"""`python -m companyos` is the same as the `companyos` command."""

from companyos.entry import main

main()
